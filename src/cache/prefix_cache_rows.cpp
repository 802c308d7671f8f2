// The residency rows of PrefixCache's nodes (node.hpp, "Residency rows"), written once for
// every tier: setting a row's KV or snapshot (which keeps the parent's child counter, the
// snapshot counts of the ancestors, the tier's held-page counts and the eviction orders
// exact), freeing a row's ids back to its tier, and dropping what a tier holds.
#include <cassert>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

void PrefixCache::release(GpuPageId id) {
  gpu_.pages.give_back(id);
}
void PrefixCache::release(HostPageId id) {
  host_.pages.give_back(id);
}
void PrefixCache::release(RecordId id) {
  (void)host_.link->erase(id);
}
void PrefixCache::release(const std::vector<GpuPageId>& ids) {
  for (GpuPageId id : ids) gpu_.pages.give_back(id);
}
void PrefixCache::release(const std::vector<HostPageId>& ids) {
  for (HostPageId id : ids) host_.pages.give_back(id);
}

template <Tier T>
void PrefixCache::set_pages(Node* n, std::vector<typename Row<T>::Page> pages) {
  Row<T>& row = n->row<T>();
  const bool had = row.has_kv();
  if constexpr (T == Tier::kGpu) {
    if (n->lock_count > 0) gpu_.locked_pages += pages.size() - row.pages.size();
  }
  if constexpr (T != Tier::kStore) {
    tier<T>().kv_held += pages.size();
    tier<T>().kv_held -= row.pages.size();
  }
  row.pages = std::move(pages);
  if (had != row.has_kv() && n->parent) {
    row.has_kv() ? ++n->parent->row<T>().kv_children : --n->parent->row<T>().kv_children;
    refresh(n->parent);
  }
  refresh(n);
  if constexpr (T == Tier::kHost) note_host_usage();
}

template <Tier T>
void PrefixCache::set_snapshot(Node* n, typename Row<T>::Snapshot snapshot) {
  Row<T>& row = n->row<T>();
  const bool had = n->has_snapshot();
  if constexpr (T != Tier::kStore) {
    tier<T>().snap_held += snapshot.size();
    tier<T>().snap_held -= row.snapshot.size();
  } else {
    store_tier_.snaps_held += std::size_t(snapshot.valid()) - std::size_t(row.snapshot.valid());
  }
  row.snapshot = std::move(snapshot);
  note_snapshot_change(n, had);
  refresh(n);
  if constexpr (T == Tier::kHost) note_host_usage();
}

std::vector<GpuPageId> PrefixCache::take_gpu_pages(std::size_t n) {
  std::vector<GpuPageId> pages;
  pages.reserve(n);
  for (std::size_t i = 0; i < n; ++i) pages.push_back(*gpu_.pages.take(Holder::kTransfer));
  return pages;
}

template <Tier T>
void PrefixCache::free_kv(Node* n) {
  for (auto id : n->row<T>().pages) release(id);
  set_pages<T>(n, {});
}

template <Tier T>
void PrefixCache::drop_kv(Node* n) {
  dropped_pages<T>() += n->row<T>().pages.size();
  free_kv<T>(n);
  remove_if_empty(n);
}

template <Tier T>
void PrefixCache::drop_snapshot(Node* n) {
  release(n->row<T>().snapshot);
  // Counted as lost when no memory tier (GPU, host) keeps a copy of it.
  const bool kept =
      (T != Tier::kGpu && n->gpu.has_snapshot()) || (T != Tier::kHost && n->host.has_snapshot());
  if (!kept) ++stats_.snapshots_dropped;
  set_snapshot<T>(n, {});
}

template <Tier T>
std::uint64_t& PrefixCache::dropped_pages() {
  if constexpr (T == Tier::kGpu) {
    return stats_.kv_pages_dropped_gpu;
  } else if constexpr (T == Tier::kHost) {
    return stats_.kv_pages_dropped_host;
  } else {
    return stats_.kv_pages_dropped_store;
  }
}

#define RADIXTIER_ROW_TRANSITIONS(T)                                         \
  template void PrefixCache::set_pages<T>(Node*, std::vector<Row<T>::Page>); \
  template void PrefixCache::set_snapshot<T>(Node*, Row<T>::Snapshot);       \
  template void PrefixCache::free_kv<T>(Node*);                              \
  template void PrefixCache::drop_kv<T>(Node*);                              \
  template void PrefixCache::drop_snapshot<T>(Node*);                        \
  template std::uint64_t& PrefixCache::dropped_pages<T>();
RADIXTIER_ROW_TRANSITIONS(Tier::kGpu)
RADIXTIER_ROW_TRANSITIONS(Tier::kHost)
RADIXTIER_ROW_TRANSITIONS(Tier::kStore)
#undef RADIXTIER_ROW_TRANSITIONS

}  // namespace radixtier
