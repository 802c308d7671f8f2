// IndexTierCache: the index-based baseline behind the scheduler-facing CacheBackend, for the
// A/B comparison against PrefixCache. It re-implements the existing design faithfully,
// weaknesses included (see /work/shared/reference/index-tier.md and docs/index-tier.md):
//
//   HybridRadixTree   GPU tree, every node's KV on GPU, snapshots live or tombstoned,
//                     eviction candidates rebuilt by whole-tree walks
//   HostPrefixIndex   second index keyed by whole prefixes, each entry a full KV copy
//   this class        the hooks that connect them, admission, request bookkeeping
//
// Every copy goes through the TransferEngine and is synchronous: submit, then wait at once,
// in slices of `slice_pages` pages (one batch per slice, one batch per snapshot). So wait()
// and poll() always report a finished promotion.
//
// Id holders (rule 2): GPU pages and slots are free, kNode (a tree node) or kRequest (handed
// to a caller by alloc_*); host pages and slots are free or kNode (an index entry). No id is
// ever held by an in-flight transfer between calls, because no transfer outlives a call.
//
// Locks: admit() locks the matched node (+1 snapshot lock there, +1 full lock up to the
// root); insert() moves the lock to the inserted boundary; release() undoes it exactly.
//
// `gpu_only`: host_pages == 0 and host_snapshot_slots == 0 -> no hooks are wired; snapshot
// eviction then removes leaves with their KV, as the tree does without a tier.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "baseline/host_prefix_index.hpp"
#include "baseline/hybrid_radix_tree.hpp"
#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/cache/id_pool.hpp"
#include "radixtier/cache/request_ownership.hpp"
#include "radixtier/config.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::index_tier {

/// Counters of the baseline's own costs, beyond CacheStats.
struct IndexTierStats {
  std::uint64_t tree_walk_nodes = 0;       ///< nodes visited rebuilding eviction candidates
  std::uint64_t lookup_hashed_tokens = 0;  ///< tokens hashed by host index lookups
  std::uint64_t host_lookups = 0;
  std::uint64_t host_entries = 0;  ///< entries now
  std::uint64_t host_entries_dropped = 0;
  std::uint64_t host_bytes_in_use = 0;        ///< now
  std::uint64_t snapshots_revived = 0;        ///< via on_match_dead_snapshot
  std::uint64_t promotions = 0;               ///< admissions that copied a host entry back
  std::uint64_t promotions_abandoned = 0;     ///< the entry changed while making room
  std::uint64_t kv_writes_too_large = 0;      ///< prefixes larger than the whole host budget
  std::uint64_t snapshot_writes_dropped = 0;  ///< bank full twice: silently dropped
  std::size_t tree_nodes = 0;
};

class IndexTierCache final : public CacheBackend, private TreeHooks {
 public:
  /// Validates the config; the engine must outlive the cache.
  static Result<std::unique_ptr<IndexTierCache>> create(const CacheConfig& config,
                                                        TransferEngine& engine);
  ~IndexTierCache() override;
  IndexTierCache(const IndexTierCache&) = delete;
  IndexTierCache& operator=(const IndexTierCache&) = delete;

  // --- CacheBackend ----------------------------------------------------------------------
  std::uint32_t page_size() const override { return config_.page_size; }
  Result<Admission> admit(std::span<const Token> prompt) override;
  /// The default namespace only (CacheBackend's default: the baseline has no namespaces).
  using CacheBackend::admit;
  Result<TransferState> poll(LockId lock) override;
  Result<std::size_t> wait(LockId lock) override;
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override;
  Result<GpuSlotId> path_snapshot(LockId lock) const override;
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override;
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override;
  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override;
  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override;
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  Status release(LockId lock) override;
  CacheStats stats() const override;
  std::string check_invariants() const override;

  // --- baseline-specific -----------------------------------------------------------------
  IndexTierStats index_stats() const;
  const CacheConfig& config() const { return config_; }
  bool host_tier() const { return host_tier_; }
  std::size_t gpu_pages_free() const { return gpu_pages_.free_count(); }
  std::size_t gpu_slots_free() const { return gpu_slots_.free_count(); }

 private:
  struct LockRecord {
    TreeNode* node;  ///< the locked node (root: nothing locked)
  };

  IndexTierCache(const CacheConfig& config, TransferEngine& engine);

  // TreeHooks: wired only when a host tier exists.
  GpuSlotId on_match_dead_snapshot(const TreeNode& node) override;
  void on_evict_kv(const TreeNode& node) override;
  void on_evict_node(const TreeNode& node) override;

  // Synchronous copies through the engine (submit, then wait at once). False on failure.
  bool copy_pages(Direction dir, std::span<const GpuPageId> gpu, std::span<const HostPageId> host);
  bool copy_snapshot(Direction dir, GpuSlotId gpu, HostSlotId host);

  /// GPU slot for the tree (kNode) or a request, evicting snapshots when none is free.
  std::optional<GpuSlotId> take_gpu_slot(Holder to);
  /// Host -> GPU for the whole entry of `prefix`, inserted into the tree. Returns the pages
  /// the tree already had (for hit accounting) or nullopt when abandoned.
  std::optional<std::size_t> promote(std::span<const Token> prefix);
  Result<const LockRecord*> find_lock(LockId id) const;

  CacheConfig config_;
  TransferEngine& engine_;
  bool host_tier_;
  IdPool<GpuPageId> gpu_pages_;
  IdPool<GpuSlotId> gpu_slots_;
  RequestOwnership<GpuPageId> page_owner_;  ///< which request owns each request-held id
  RequestOwnership<GpuSlotId> slot_owner_;
  HostPrefixIndex host_;
  HybridRadixTree tree_;
  std::unordered_map<std::uint32_t, LockRecord> locks_;
  std::uint32_t next_lock_ = 0;

  CacheStats stats_;
  IndexTierStats extra_;
  std::uint64_t kv_pages_kept_on_host_ = 0;   ///< evicted node pages whose host write succeeded
  std::uint64_t snapshots_kept_on_host_ = 0;  ///< evicted snapshots whose host write succeeded
};

}  // namespace radixtier::index_tier
