// TierPart<T>: one tier of PrefixCache as a part. It owns the tier's eviction orders and pool
// ages (TierOrders<T>, tier_orders.hpp), what the tier allocates from with the counts of what
// it holds, and the engine that copies between it and the tier below (TierPools<T>, below). The
// copies between a tier and the one below are written once for every pair (prefix_cache_links.cpp:
// evict<T>, plan_down<T>, submit_link<T>).
//
//   tier    pools                                   held counters             link below
//   kGpu    KV pages (GpuPageId), snapshot slots    pages of locked nodes     TransferEngine
//           (GpuSlotId)                             (never reclaimable)
//   kHost   one pool of pages (HostPageId): KV      pages held by KV and by   StoreEngine
//           pages and snapshot pieces alike         snapshots (split shares)  (or none)
//   kStore  the StoreEngine's slots (the engine     nodes with a store        -
//           allocates its records)                  snapshot
//
// Invariants it keeps (PrefixCache::check_invariants() checks them with the nodes): every id
// of a pool is held by exactly one of free list, node, request, transfer (rule 2); the held
// counters equal the sums over the nodes and the copies in flight.
#pragma once

#include <cstddef>
#include <cstdint>

#include "radixtier/cache/id_pool.hpp"
#include "radixtier/cache/tier_orders.hpp"
#include "radixtier/transfer/store_engine.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

template <Tier T>
struct TierPools;

template <>
struct TierPools<Tier::kGpu> {
  TierPools(std::uint32_t page_count, std::uint32_t slot_count, TransferEngine& engine)
      : pages(page_count), slots(slot_count), link(&engine) {}
  IdPool<GpuPageId> pages;  ///< the GPU pool: KV pages and cached snapshots' pages
  IdPool<GpuSlotId> slots;  ///< live slots: running requests' state, never cached data
  /// GPU pages held by KV and by snapshots (nodes and their in-flight copies).
  std::size_t kv_held = 0, snap_held = 0;
  /// GPU pages of locked nodes (promotion destinations included): pages no eviction can
  /// reclaim. Every other node-held GPU page is reclaimable, leaf-first, because an unlocked
  /// node has no locked descendant.
  std::size_t locked_pages = 0;
  TransferEngine* link;  ///< copies between GPU and host (not owned)
};

template <>
struct TierPools<Tier::kHost> {
  explicit TierPools(std::uint32_t page_count) : pages(page_count) {}
  IdPool<HostPageId> pages;  ///< the one host pool: KV pages and snapshot pieces
  /// Host pages held by KV and by snapshots (nodes and their in-flight copies): the shares
  /// when the host pool is split.
  std::size_t kv_held = 0, snap_held = 0;
  StoreEngine* link = nullptr;  ///< copies between host and the store (not owned; none: null)
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
