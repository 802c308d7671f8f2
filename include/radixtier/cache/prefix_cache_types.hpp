// The value types of PrefixCache's public interface: what match(), peek(), evict(), sizes(),
// occupancy() and inspect() report (prefix_cache.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "radixtier/cache/node.hpp"
#include "radixtier/cache/tier.hpp"

namespace radixtier {

/// What the tree holds for a token sequence, without side effects (no promotion, no
/// change of recency): match() and peek().
struct MatchResult {
  std::size_t usable_tokens = 0;  ///< rule 1
  std::size_t kv_tokens = 0;      ///< deepest page-aligned prefix whose KV is all present
  std::size_t host_tokens = 0;    ///< tokens of the usable match whose KV is host-only
  bool snapshot_on_gpu = false;   ///< the usable node's snapshot is on GPU
  /// Deepest usable boundary that needs no copy: KV and snapshot all on GPU (not arriving).
  std::size_t gpu_usable_tokens = 0;
  /// Where an admission resumes under CacheConfig::load_back_min_tokens, GPU room allowing:
  /// usable_tokens when the load-back is worth it, else gpu_usable_tokens.
  std::size_t resume_tokens = 0;
  bool load_back = false;  ///< resume_tokens needs a host-to-GPU copy
};

/// What evict() is asked to free on one tier.
struct EvictRequest {
  std::size_t tokens = 0;       ///< KV to free, in tokens (rounded up to whole pages)
  std::uint32_t snapshots = 0;  ///< snapshots to free
  Tier tier = Tier::kGpu;
};

/// What evict() freed on the tier it was asked for.
struct EvictResult {
  std::size_t kv_pages = 0;     ///< KV pages freed (whole nodes: may exceed the request)
  std::uint32_t snapshots = 0;  ///< snapshots freed (GPU slots, or host snapshots)
  std::uint64_t bytes = 0;      ///< bytes of the tier's pools freed in all

  bool operator==(const EvictResult&) const = default;
};

/// One tier's cached data, as a scheduler's admission control reads it. "Evictable" is what
/// eviction can free (leaf-first; copies in flight counted as if landed), "locked" what the
/// running requests pin (their paths' KV, the snapshots they resume from). Pages and slots a
/// running request holds for itself are neither (see Occupancy for the free ones).
struct TierSizes {
  std::size_t kv_pages_evictable = 0;
  std::size_t kv_pages_locked = 0;
  std::size_t snapshots_evictable = 0;
  std::size_t snapshots_locked = 0;
  std::uint64_t bytes_evictable = 0;  ///< KV and snapshots together
  std::uint64_t bytes_locked = 0;

  bool operator==(const TierSizes&) const = default;
};

struct CacheSizes {
  TierSizes gpu, host;
  TierSizes store;  ///< the store tier's (all zero without one)
  bool operator==(const CacheSizes&) const = default;
};

struct Occupancy {
  std::uint32_t gpu_pages_free;
  std::uint32_t host_pages_free;  ///< of the one host pool (KV and snapshots)
  std::uint32_t gpu_slots_free;
  std::uint32_t host_slots_free;  ///< snapshots the free host pages would hold
  std::size_t nodes;

  bool operator==(const Occupancy&) const = default;
};

/// Where a resource of a node is (usable copies; a copy being written is `copy`, not here).
enum class Residency : std::uint8_t { kNone, kGpu, kHost, kBoth };

const char* to_string(Residency residency);
const char* to_string(Xfer copy);

/// One node on a path, as inspect() reports it.
struct NodeInfo {
  std::size_t boundary = 0;  ///< tokens from the root to the node's end
  std::size_t tokens = 0;    ///< the node's own tokens
  std::size_t matched = 0;   ///< tokens of the query matched through it (< boundary: partial)
  Residency kv = Residency::kNone;
  Residency snapshot = Residency::kNone;
  Xfer kv_copy = Xfer::kNone;        ///< the copy of its KV in flight
  Xfer snapshot_copy = Xfer::kNone;  ///< the copy of its snapshot in flight
  std::uint32_t locks = 0;           ///< running requests whose path includes it
  std::uint32_t snapshot_locks = 0;  ///< running requests resuming from its snapshot
  std::uint8_t kv_priority = 0;      ///< retention level of its KV (node.hpp)
  std::uint8_t snapshot_priority = 0;
  std::uint32_t pins = 0;    ///< host pins whose prefix includes it
  bool kv_on_store = false;  ///< its KV has a store copy (records of every page)
  bool snapshot_on_store = false;

  bool operator==(const NodeInfo&) const = default;
};

/// A host snapshot along a path (PrefixCache::host_copies()).
struct HostSnapshotCopy {
  std::size_t boundary = 0;
  std::vector<HostPageId> pages;  ///< snapshot_pages() pages, bytes [i * page_bytes, ...)
};

/// The usable host copies along a path, read-only: what a publisher may copy out now, before
/// the cache runs again (after that, the pages may hold other bytes).
struct HostCopies {
  /// kv[i]: the host page of the path's page i, for the leading pages whose KV has a usable
  /// host copy (it stops at the first page that has none). An invalid id: a page of a node a
  /// shared tier published (PrefixCache::mark_published) whose host copy left; the tier has
  /// it, or had it.
  std::vector<HostPageId> kv;
  /// The host snapshots at node ends within those pages, shallow first.
  std::vector<HostSnapshotCopy> snapshots;
};

/// Writes fetched bytes into the host pages import_host() took: kv[i] is the path's page
/// first_page + i; snapshot is empty when the tree has a snapshot there already. Returns
/// false when it cannot (nothing is entered then).
using ImportFill = std::function<bool(std::size_t first_page, std::span<const HostPageId> kv,
                                      std::span<const HostPageId> snapshot)>;

/// What import_host() entered.
struct ImportResult {
  std::size_t first_page = 0;  ///< the first page the tree lacked (the fill's first_page)
  std::size_t kv_pages = 0;    ///< KV pages entered as host-resident
  bool snapshot = false;       ///< a host snapshot entered at the path's end
};

}  // namespace radixtier
