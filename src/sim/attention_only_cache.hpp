// AttentionOnlyCache: the attention-only twin of a hybrid cache, for measuring the hybrid tax.
//
// It wraps a PrefixCache built for a model whose snapshots cost nothing (snapshot_bytes = 1,
// the smallest size CacheConfig accepts; the simulator gives the snapshot bytes to the KV
// pools instead) and makes every page boundary resumable, as it is for a pure-attention
// model: insert() attaches a snapshot of its own at every new page boundary, from a
// snapshot-slot pool sized so that it never runs short (PrefixCache::insert_every_page: the
// same as inserting the pages one at a time, in time linear in them). The
// scheduler, its chunking, its placement policy and the cache's LRU tiers are unchanged; the
// usable match becomes the deepest cached page boundary.
//
// Free means free on both tiers: KV keeps exactly the hybrid's bytes per tier. The host tier is
// split (twin_config(): KV in host_pages, the snapshots in a share of their own, the same
// GreedyDual keys), and after every insert each evictable GPU snapshot is demoted to that share
// (snapshots_off_gpu(): a 1-byte copy), so no cached snapshot holds a GPU page KV could use; a
// resume promotes its snapshot back for the one request (a page until its live slot is filled).
//
// Every other call is forwarded unchanged. The snapshots it attaches are the tree's; it
// never hands the caller a slot it did not allocate.
#pragma once

#include <memory>
#include <unordered_map>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier::sim {

class AttentionOnlyCache final : public CacheBackend {
 public:
  /// `config` as the hybrid run's (the same bytes); the twin's pools: snapshot_bytes 1, the
  /// snapshot bytes of both tiers given to KV, a snapshot slot for every page (twin_config()).
  static Result<std::unique_ptr<AttentionOnlyCache>> create(const CacheConfig& twin,
                                                            TransferEngine& engine);
  /// The twin of a hybrid CacheConfig: the same bytes per tier, all of them KV.
  static CacheConfig twin_config(const CacheConfig& hybrid);

  std::uint32_t page_size() const override { return inner_->page_size(); }
  Result<Admission> admit(std::span<const Token> prompt) override;
  Result<Admission> admit(std::span<const Token> prompt, const RequestOptions& options) override;
  Result<TransferState> poll(LockId lock) override { return inner_->poll(lock); }
  Result<std::size_t> wait(LockId lock) override;
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override {
    return inner_->path_pages(lock);
  }
  Result<GpuSlotId> path_snapshot(LockId lock) const override {
    return inner_->path_snapshot(lock);
  }
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override {
    return inner_->alloc_pages(lock, n);
  }
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override {
    return inner_->alloc_snapshot_slot(lock);
  }
  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override {
    return inner_->free_pages(lock, pages);
  }
  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override {
    return inner_->free_snapshot_slot(lock, slot);
  }
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  Status release(LockId lock) override;
  CacheStats stats() const override { return inner_->stats(); }
  /// The inner cache's sizes per tier (what the twin's budgets are checked against).
  CacheSizes sizes() const { return inner_->sizes(); }
  const CacheConfig& config() const { return inner_->config(); }
  std::string check_invariants() const override { return inner_->check_invariants(); }

 private:
  explicit AttentionOnlyCache(std::unique_ptr<PrefixCache> inner) : inner_(std::move(inner)) {}
  /// Demotes every evictable GPU snapshot to the host's snapshot share (twin_config()).
  void snapshots_off_gpu();

  std::unique_ptr<PrefixCache> inner_;
  std::unordered_map<std::uint64_t, std::size_t> boundary_;  ///< lock -> inserted boundary
};

}  // namespace radixtier::sim
