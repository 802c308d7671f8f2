// TierPart<T>: one tier of PrefixCache as a part. It owns the tier's eviction orders and pool
// ages (TierOrders<T>, tier_orders.hpp) and what the tier allocates from with the counts of
// what it holds (TierPools<T>, below). The copies between a tier and the one below are
// written once for every pair (prefix_cache_links.cpp: evict<T>, plan_down<T>, submit_link<T>).
//
//   tier    pools                                        held counters
//   kGpu    KV pages (GpuPageId), snapshot slots         pages of locked nodes (no eviction
//           (GpuSlotId)                                  can reclaim them)
//   kHost   one pool of pages (HostPageId): KV pages     pages held by KV and by snapshots
//           and snapshot pieces alike                    (the shares of a split pool)
//   kStore  the StoreEngine's slots (not an IdPool: the  nodes with a store snapshot
//           engine allocates its records)
//
// Invariants it keeps (PrefixCache::check_invariants() checks them with the nodes): every id
// of a pool is held by exactly one of free list, node, request, transfer (rule 2); the held
// counters equal the sums over the nodes and the copies in flight.
#pragma once

#include <cstddef>
#include <cstdint>

#include "radixtier/cache/id_pool.hpp"
#include "radixtier/cache/tier_orders.hpp"

namespace radixtier {

template <Tier T>
struct TierPools;

template <>
struct TierPools<Tier::kGpu> {
  TierPools(std::uint32_t page_count, std::uint32_t slot_count)
      : pages(page_count), slots(slot_count) {}
  IdPool<GpuPageId> pages;
  IdPool<GpuSlotId> slots;
  /// GPU pages of locked nodes (promotion destinations included): pages no eviction can
  /// reclaim. Every other node-held GPU page is reclaimable, leaf-first, because an unlocked
  /// node has no locked descendant.
  std::size_t locked_pages = 0;
};

template <>
struct TierPools<Tier::kHost> {
  explicit TierPools(std::uint32_t page_count) : pages(page_count) {}
  IdPool<HostPageId> pages;  ///< the one host pool: KV pages and snapshot pieces
  /// Host pages held by KV and by snapshots (nodes and their in-flight copies): the shares
  /// when the host pool is split.
  std::size_t kv_held = 0, snap_held = 0;
};

template <>
struct TierPools<Tier::kStore> {
  std::size_t snaps_held = 0;  ///< nodes with a store snapshot
};

template <Tier T>
struct TierPart : TierOrders<T>, TierPools<T> {
  using TierPools<T>::TierPools;
};

}  // namespace radixtier
