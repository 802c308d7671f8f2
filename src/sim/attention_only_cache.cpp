// The attention-only twin (see attention_only_cache.hpp).
#include "sim/attention_only_cache.hpp"

namespace radixtier::sim {

CacheConfig AttentionOnlyCache::twin_config(const CacheConfig& hybrid) {
  CacheConfig c = hybrid;
  const std::uint64_t gpu_bytes = std::uint64_t{hybrid.gpu_pages} * hybrid.page_bytes +
                                  std::uint64_t{hybrid.gpu_snapshot_slots} * hybrid.snapshot_bytes;
  const std::uint64_t host_bytes =
      std::uint64_t{hybrid.host_pages} * hybrid.page_bytes +
      std::uint64_t{hybrid.host_snapshot_slots} * hybrid.snapshot_bytes;
  c.snapshot_bytes = 1;
  c.gpu_pages = static_cast<std::uint32_t>(gpu_bytes / hybrid.page_bytes);
  c.host_pages = static_cast<std::uint32_t>(host_bytes / hybrid.page_bytes);
  // One slot per page of either tier, plus the scheduler's own: a tree node holds at least one
  // page and at most one snapshot per tier, so no snapshot is ever dropped for want of a slot.
  c.gpu_snapshot_slots = c.gpu_pages + c.host_pages + hybrid.gpu_snapshot_slots;
  c.host_snapshot_slots = c.gpu_pages + c.host_pages;
  // Free snapshots must not buy KV room: with one host pool, KV would take the pages given to
  // the snapshots (a "0 GiB" twin kept tens of GB of KV there). The split host tier (the same
  // GreedyDual keys) keeps KV within host_pages and the snapshots in their own share.
  if (c.snapshot_eviction == SnapshotEviction::kCostAware) {
    c.snapshot_eviction = SnapshotEviction::kUtility;
  }
  return c;
}

Result<std::unique_ptr<AttentionOnlyCache>> AttentionOnlyCache::create(const CacheConfig& twin,
                                                                       TransferEngine& engine) {
  auto inner = PrefixCache::create(twin, engine);
  if (!inner) return inner.status();
  return std::unique_ptr<AttentionOnlyCache>(new AttentionOnlyCache(std::move(*inner)));
}

Result<Admission> AttentionOnlyCache::admit(std::span<const Token> prompt) {
  return admit(prompt, RequestOptions{});
}

Result<Admission> AttentionOnlyCache::admit(std::span<const Token> prompt,
                                            const RequestOptions& options) {
  auto a = inner_->admit(prompt, options);
  if (a) boundary_[a->lock.value()] = a->cached_tokens;
  return a;
}

Result<std::size_t> AttentionOnlyCache::wait(LockId lock) {
  auto resumed = inner_->wait(lock);  // after a failed copy the lock may move up
  if (resumed) {
    if (auto it = boundary_.find(lock.value()); it != boundary_.end()) it->second = *resumed;
  }
  return resumed;
}

Status AttentionOnlyCache::release(LockId lock) {
  Status s = inner_->release(lock);
  if (s) boundary_.erase(lock.value());
  return s;
}

Result<InsertResult> AttentionOnlyCache::insert(LockId lock, std::span<const Token> tokens,
                                                std::span<const GpuPageId> pages,
                                                std::optional<GpuSlotId> snapshot) {
  auto it = boundary_.find(lock.value());
  const std::uint32_t ps = page_size();
  if (it == boundary_.end() || tokens.size() % ps != 0 || pages.size() * ps != tokens.size() ||
      tokens.size() <= it->second) {
    auto r = inner_->insert(lock, tokens, pages, snapshot);  // the inner cache judges it
    if (r) snapshots_off_gpu();
    return r;
  }
  // Every page boundary past the last one inserted, each with a snapshot of its own; the last
  // one with the caller's snapshot if it has one (PrefixCache::insert_every_page: the calls
  // one page at a time, without walking from the root for each).
  std::size_t reached = it->second;
  auto r = inner_->insert_every_page(lock, it->second, tokens, pages, snapshot, reached);
  it->second = reached;
  if (r) snapshots_off_gpu();
  return r;
}

void AttentionOnlyCache::snapshots_off_gpu() {
  // A snapshot of one byte still takes a page of the GPU pool: a third of it, before this,
  // on a conversation trace. Demoting them all right away leaves the pool to KV.
  const TierSizes gpu = inner_->sizes().gpu;
  if (gpu.snapshots_evictable == 0) return;
  EvictRequest off;
  off.snapshots = static_cast<std::uint32_t>(gpu.snapshots_evictable);
  off.tier = Tier::kGpu;
  (void)inner_->evict(off);  // a refused demotion leaves the snapshot where it is
}

}  // namespace radixtier::sim
