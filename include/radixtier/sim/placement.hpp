// PlacementCache: extra snapshot placement rules for the simulator, as a CacheBackend
// decorator (the scheduler's SnapshotPolicy is a closed set of kinds, and its SnapshotQuery
// does not carry where a prompt branches off a cached path, so these rules live here).
//
// The scheduler runs with `every-chunk`, so it offers every chunk end, the final prompt
// boundary and the finish boundary. This decorator hands out placeholder slots (no bytes exist
// in the simulator, so the copy into the slot is free), and at insert() decides whether the
// boundary keeps a snapshot: the base policy's answer (the same SnapshotQuery the scheduler
// would build), or
//   tail    the last chunk boundary below the final prompt boundary: a later request that
//           shares the prompt but not its last partial chunk or block (an agent turn that
//           diverges before the previous end; the next turn of a Mooncake trace conversation,
//           whose last partial block gets a new hash id) resumes there
//   branch  the chunk boundary at or below the point where this prompt leaves the deepest
//           cached KV path (PrefixCache only): the second request to share a prefix keeps a
//           snapshot there, so the third one hits
// Only then is a real GPU snapshot slot taken from the wrapped cache (which may evict), so
// offers that are not kept cost nothing. Simulation only: a real engine copies the live state
// into the slot before insert(), so these rules belong in SnapshotPolicy there.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "radixtier/cache_backend.hpp"
#include "radixtier/prefix_cache.hpp"
#include "radixtier/scheduler/snapshot_policy.hpp"

namespace radixtier::sim {

struct Placement {
  sched::SnapshotPolicy base = sched::SnapshotPolicy::end_only();
  bool tail = false;
  bool branch = false;
  bool extended() const { return tail || branch; }
  /// base[+tail][+branch], e.g. "budgeted+tail"
  std::string name() const;
};

/// "POLICY[+tail][+branch]" where POLICY is what SnapshotPolicy::parse accepts.
Result<Placement> parse_placement(std::string_view text);

class PlacementCache final : public CacheBackend {
 public:
  /// `node`: the same cache as `inner` when it is a PrefixCache (enables `branch`), else null.
  PlacementCache(CacheBackend& inner, const PrefixCache* node, Placement placement,
                 std::size_t chunk_tokens, std::size_t snapshot_bytes,
                 std::size_t kv_bytes_per_token);

  std::uint32_t page_size() const override { return inner_.page_size(); }
  Result<Admission> admit(std::span<const Token> prompt) override;
  TransferState poll(LockId lock) override { return inner_.poll(lock); }
  Status wait(LockId lock) override { return inner_.wait(lock); }
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override {
    return inner_.path_pages(lock);
  }
  Result<GpuSlotId> path_snapshot(LockId lock) const override { return inner_.path_snapshot(lock); }
  Result<std::vector<GpuPageId>> alloc_pages(std::size_t n) override {
    return inner_.alloc_pages(n);
  }
  Result<GpuSlotId> alloc_snapshot_slot() override;
  Status free_pages(std::span<const GpuPageId> pages) override { return inner_.free_pages(pages); }
  Status free_snapshot_slot(GpuSlotId slot) override;
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  Status release(LockId lock) override;
  CacheStats stats() const override { return inner_.stats(); }
  std::string check_invariants() const override { return inner_.check_invariants(); }

  /// Placeholder slot ids start here (above any real slot id).
  static constexpr std::uint32_t kPlaceholderBase = 1u << 30;

 private:
  struct Prompt {
    std::size_t length = 0, cached = 0, branch = 0;
  };
  bool keep(const Prompt& p, std::size_t boundary) const;

  CacheBackend& inner_;
  const PrefixCache* node_;
  Placement placement_;
  std::size_t chunk_tokens_, snapshot_bytes_, kv_bytes_per_token_;
  std::map<std::uint32_t, Prompt> prompts_;  ///< by lock id
  std::set<std::uint32_t> placeholders_;     ///< handed out, not yet consumed
  std::uint32_t next_placeholder_ = kPlaceholderBase;
};

}  // namespace radixtier::sim
