// One validated configuration struct for the cache.
#pragma once

#include <cmath>

#include <cstddef>
#include <cstdint>

#include "radixtier/status.hpp"

namespace radixtier {

/// When a GPU copy reaches host memory.
enum class WritePolicy {
  kWriteBack,     ///< copy to host only when the GPU copy is evicted (demotion costs a copy)
  kWriteThrough,  ///< copy to host in the background right after insert (eviction is free)
};

const char* to_string(WritePolicy policy);

/// How the cache orders its eviction victims and splits the host tier.
enum class SnapshotEviction {
  /// The default: GreedyDual-Size-Frequency over KV and snapshots (recompute saved per byte,
  /// frequency, recency), dead KV first, and one host pool shared by KV and snapshots.
  kCostAware,
  /// Baselines (sglang-like): every order by time of last use; the host tier split as the
  /// config says (host_pages of KV, host_snapshot_slots snapshots' worth for snapshots).
  kLru,
  /// GreedyDual keys as kCostAware, but the host tier split as kLru (to measure the split).
  kUtility,
};

const char* to_string(SnapshotEviction eviction);

struct CacheConfig {
  std::uint32_t page_size = 64;  ///< tokens per page
  /// The GPU pool, in pages of page_bytes: the running requests' KV *and* the cached
  /// snapshots (each snapshot_pages() pages, not contiguous); eviction decides the split at
  /// every moment. At least snapshot_pages() + 1 (a page of KV and one snapshot), else no
  /// snapshot could ever be cached.
  std::uint32_t gpu_pages = 0;
  /// Host tier, in pages of page_bytes. PrefixCache keeps KV *and* snapshots in one pool of
  /// host_pool_pages() pages (a snapshot spans snapshot_pages() of them, not contiguous);
  /// with kCostAware eviction decides the split at every moment.
  std::uint32_t host_pages = 0;
  /// Live GPU snapshot slots: the per-request state the model computes in (a resumed request
  /// gets one filled from the cached snapshot; a materialized state is copied out of one).
  /// Cached snapshots are not kept in slots: they take snapshot_pages() pages of the GPU pool.
  std::uint32_t gpu_snapshot_slots = 0;
  /// Host room for this many snapshots, added to the one host pool by PrefixCache; the
  /// index-tier baseline keeps them as its separate snapshot bank (0: none).
  std::uint32_t host_snapshot_slots = 0;
  std::size_t page_bytes = 0;       ///< bytes of one page, all attention layers, K and V
  std::size_t snapshot_bytes = 0;   ///< bytes of one snapshot of the full recurrent state
  std::uint32_t slice_pages = 128;  ///< at most this many pages per copy slice
  WritePolicy write_policy = WritePolicy::kWriteBack;
  SnapshotEviction snapshot_eviction = SnapshotEviction::kCostAware;
  /// Load-back threshold: an admission promotes from host only when that makes it resume at
  /// least this many tokens deeper than the deepest boundary usable from the GPU alone (else
  /// it resumes there and recomputes the rest). 0 (the default): always load back. Why 0:
  /// reloading a token's KV costs ~1/700 of recomputing it (the brief), a snapshot's copy a
  /// few tokens' worth, and the tree is page-granular, so a load-back adds at least a page;
  /// SGLang's HiRadixCache skips load-backs under 10 tokens (load_back_threshold = 10 in
  /// hiradix_cache.py) at page size 1, which a page of 16 or more tokens already exceeds.
  /// A larger value saves copy latency for engines that wait on it. At most the GPU pool's
  /// tokens (gpu_pages x page_size): a larger one would never load anything back.
  std::uint32_t load_back_min_tokens = 0;
  /// At most this many snapshots on any one root-to-leaf path (SGLang's
  /// --mamba-max-states-per-path), so one long conversation cannot take every slot; the
  /// snapshot whose loss costs the fewest recompute tokens goes first. 0: no cap.
  std::uint32_t max_snapshots_per_path = 0;
  /// Host pins (PrefixCache::pin) may hold at most this share of the host pool, in [0, 1]
  /// (0: no pins); the rest stays for eviction to use.
  double host_pin_share = 0.5;
  /// Watermarks of free GPU room (docs/architecture.md, "Watermarks: demoting ahead of
  /// need"), as fractions of each GPU pool: when the free GPU KV pages (the free GPU snapshot
  /// slots), counting the demotions already in flight, fall below ceil(low x pool), the
  /// cache demotes the next victims of that pool's eviction order without waiting, until
  /// ceil(high x pool) are free or on their way; an allocation that fits in the free room
  /// then never waits for a copy. The cache keeps at most what its running requests may ask
  /// for next (each its largest allocation so far; one slot each), within these shares
  /// (PrefixCache::demote_ahead). 0 <= low <= high < 1; low 0 turns it off. Why 2% and 4%, for
  /// every workload: an allocation is a prefill chunk or a decode page, a small part of a pool
  /// sized for many requests, and what is demoted ahead stays one promotion away on host, so at
  /// most 4% of the GPU pool moves early (Linux keeps its min/low/high free-page watermarks at a
  /// fraction of memory for the same reason: kswapd frees ahead so an allocation need not reclaim).
  /// Without a store tier, making host room drops at once: nothing to wait for.
  double gpu_free_low_watermark = 0.02;
  double gpu_free_high_watermark = 0.04;
  /// The same for the host pool when a store tier is attached (PrefixCache::create with a
  /// StoreEngine): below ceil(low x host pool) free pages, the host order's next victims are
  /// written to the store without waiting, up to ceil(high x host pool); making host room on
  /// demand then rarely waits for a store write (CacheStats::store_copy_waits). Same rule and
  /// same fractions as the GPU's; 0 <= low <= high < 1, low 0 turns it off.
  double host_free_low_watermark = 0.02;
  double host_free_high_watermark = 0.04;
  /// The low / high watermark of a pool of `capacity` pages or slots, in pages or slots.
  /// Rounded up, so a small pool (GPU snapshot slots are tens) keeps one free slot.
  std::size_t low_watermark(std::size_t capacity) const {
    return static_cast<std::size_t>(
        std::ceil(gpu_free_low_watermark * static_cast<double>(capacity)));
  }
  std::size_t high_watermark(std::size_t capacity) const {
    return static_cast<std::size_t>(
        std::ceil(gpu_free_high_watermark * static_cast<double>(capacity)));
  }
  std::size_t host_low_watermark(std::size_t capacity) const {
    return static_cast<std::size_t>(
        std::ceil(host_free_low_watermark * static_cast<double>(capacity)));
  }
  std::size_t host_high_watermark(std::size_t capacity) const {
    return static_cast<std::size_t>(
        std::ceil(host_free_high_watermark * static_cast<double>(capacity)));
  }

  /// Rejects nonsense with a message naming the field.
  Status validate() const;

  /// Host pages one snapshot spans: ceil(snapshot_bytes / page_bytes).
  std::size_t snapshot_pages() const {
    return page_bytes == 0 ? 0 : (snapshot_bytes + page_bytes - 1) / page_bytes;
  }
  /// The one host pool of PrefixCache: host_pages + host_snapshot_slots * snapshot_pages().
  std::size_t host_pool_pages() const {
    return std::size_t{host_pages} + std::size_t{host_snapshot_slots} * snapshot_pages();
  }

  /// Staging bytes one slice may need in one direction (a page slice or a snapshot chunk).
  std::size_t slice_bytes() const { return static_cast<std::size_t>(slice_pages) * page_bytes; }
};

}  // namespace radixtier
