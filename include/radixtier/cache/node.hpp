// Node: one edge of the radix tree, carrying its own residency as one row per tier.
//
// A node owns `tokens` (a whole number of pages) and the KV of exactly those pages; its
// boundary is the token count from the root to its end, where its snapshot (if any) was taken.
//
// Residency rows. The tiers are GPU, host and store (the disk), fastest first. A node holds
// one Row<T> per tier: its KV there (`pages`: empty, or one id per page of `tokens`, all or
// nothing), its snapshot there (GPU and host: snapshot_pages() pages of the tier's one pool,
// snapshot[i] holding bytes [i * page_bytes, ...); store: one record), the keys
// and hooks of the tier's two eviction orders, the tier's ages at the node's last uses and
// the count of children that hold KV on the tier. A row's ids are its tier's (GpuPageId,
// HostPageId, RecordId). "Gone" (a tombstone) is every row empty; "None" is a snapshot on no
// row. Only the default namespace has store rows.
//
// One copy at a time moves a node's KV (kv_xfer) and one its snapshot (snap_xfer), each
// between adjacent tiers (a staged load skips host: the store's records reach the GPU through
// a few staging pages and leave no host copy). The same transitions hold for the KV and the
// snapshot and between both pairs of adjacent tiers; "upper" and "lower" are the tiers of a
// pair (GPU/host, host/store). The code is written once for both pairs too
// (prefix_cache_links.cpp: evict<T>, drop_victim<T>, plan_down<T>, plan_up<T>):
//
//   from                  event                              copy      to
//   upper only            evict upper, lower has room        demote    upper+lower, then
//                         (GPU->host, host->store)           / kStore  lower only (kept on both
//                                                                      while locked / pinned)
//   upper only            evict upper, no room or dead       -         dropped on upper
//   upper                 insert under write-through         kWrite-   upper+lower
//                         (GPU->host)                        Through
//   upper+lower           evict upper                        -         lower only (free: clean)
//   upper+lower           evict lower                        -         upper only
//   lower only            admit (host->GPU)                  kPromote  upper+lower
//   store only            admit, host has room               kLoad     host+store, then
//                                                            (then     all three
//                                                            kPromote)
//   store only            admit, no host room for it all     kStage    GPU+store
//   any, copy in flight   the copy fails                     -         as before the copy:
//                                                                      the source stays, the
//                                                                      destination is freed
//   any, copy in flight   the engine refuses the batch       -         as before the copy
//   any, store read       read fails its check (kDataLoss)   -         the records erased
//   gone / lower only     insert of the same tokens          -         fresh GPU pages adopted
//   no GPU snapshot       insert with a snapshot slot        kMate-    GPU (the slot's bytes in
//                                                            rialize   fresh pool pages; the
//                                                                      slot is the copy's until
//                                                                      it lands, then freed)
//
// In flight, the row being copied to holds the copy's destinations (not usable yet):
//   kDemote / kWriteThrough   gpu -> host       kPromote   host -> gpu
//   kStore                    host -> store     kLoad      store -> host and gpu (both held)
//   kStage                    store -> gpu through staging pages (host row stays empty)
//   kMaterialize              a live slot -> gpu (device to device; host row as it was)
// A snapshot arriving on GPU (snap_to_gpu) is not evictable (one copy at a time) and not yet
// usable without a wait: an admission resuming from it submits the copy into its live slot
// ordered `after` the arriving copy's ticket (PrefixCache::submit_fill), so admit never waits.
// A failed copy never hands out bytes (rule 7): a request whose promotion failed finds the
// node host-only, resumes above it and recomputes (wait()); the next admission may promote it
// again. A failed demotion does not make its room: the victim keeps its GPU copy, is marked
// (kv_demote_failed / snap_demote_failed = the room-making round) and skipped for the rest of
// that round, so the room comes from the next victim; when only marked victims are left, the
// round drops them (GPU copy freed, counted as a drop), so an engine that fails every copy
// still ends each round, never loops. A store write that fails leaves the host copy (dropped
// when the write was for room); a store read that fails frees its destinations, and with
// kDataLoss erases the records (Gone there). A staged load whose chunk fails frees the node's
// landed pages with the rest when the load ends, and reads nothing below the node.
// Eviction from GPU runs on demand (make_gpu_*_room, for an allocation: submits, then waits)
// or ahead of need (PrefixCache::demote_ahead, the watermark step: submits, never waits); the
// host watermark writes to the store ahead of need the same way (store_ahead).
//
// Eviction orders (two per tier, KV and snapshots, in the row's hooks: Order<T, Held>; the
// host and store pools compare the heads of their two, so each is one order):
// a node is in a set iff kv_evictable<T>() / snapshot_evictable<T>() holds (rule 4), sorted by
// its OrderKey, lowest first. Keys follow GreedyDual-Size-Frequency: priority = the pool's
// age (the priority of its last victim) at the node's last use + uses x value per byte, where
// a KV node's value is its tokens (one per kv_bytes_per_token bytes) and a snapshot's is the
// recompute back to the snapshot above it (snap_gap tokens). A key is a function of what the
// node stores about its last use, so a node that re-enters a set (a parent exposed by
// evicting its child, a copy that finished) takes its old place, never the most recent one.
// A GPU KV node that ends at its GPU snapshot is valued as host KV with its snapshot is: its
// eviction makes the snapshot unresumable there, so it counts the snapshot's gap too, per byte
// of both (PrefixCache::kv_value).
// A *spent* snapshot had frontier resumes (snap_frontier_resumes: resumed where its path
// ended, as a conversation's next turn resumes the last finish) and now has a snapshot below
// it: the traffic that resumed there went on deeper. While none of the cache's last
// kSpentWindow resumes landed on a spent snapshot, its uses count without its insert and its
// frontier resumes (PrefixCache::snapshot_uses): an old finish of a conversation leaves by
// age instead of holding a state's pages for a turn's worth of tokens. A resume that does land
// on one (block-hashed traffic, where requests extend the same prompt and later ones stop at
// its end again) turns the discount off for the next kSpentWindow resumes.
// The class goes first whatever the priority (KeyClass): kDead, dead KV (no snapshot at or
// below the node: it cannot be resumed from) and snapshots whose own KV left that tier; then
// kCopy, a host copy of KV or a snapshot the GPU holds too, under write-back or once a shared
// tier published it (dropping it loses nothing while the GPU copy lives; a later eviction
// from GPU demotes it again; under write-through an unpublished copy is what a shared tier
// will publish from, and stays kLive); then
// kLive. Only a kLive victim ages its pool. Within a class
// the retention level goes first: kv_priority / snap_priority, the highest priority of the
// requests that inserted or used the node's KV / snapshot (it never decays while the node is
// in the tree; with kLru too), so a low-priority node leaves before a high-priority one
// whatever their value and recency.
//
// Host pins (PrefixCache::pin): host_pin counts the pins whose prefix includes the node (a
// parent is pinned at least as often as a child), snap_pin those that end at its snapshot. A
// pinned node's host copies are not host-evictable: they are never dropped for room, by
// drop_host() or flush(); its GPU copies leave as usual (freely: the host copy is clean).
// A pinned node never leaves the tree; a failed copy may still make it a tombstone (rule 7).
//
// A node with no children, no lock, nothing in flight and no KV leaves the tree (its
// snapshot, unusable without KV, goes with it). A tombstone with children stays: an insert
// that recomputes its tokens revives it and makes its subtree reachable again.
//
// Adding a tier: a Tier value, its TierIds, a row on Node (row<T>()), and its part in the
// cache (pool, orders, the engine that copies to the tier below).
#pragma once

#include <algorithm>
#include <boost/intrusive/parent_from_member.hpp>
#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/tier.hpp"
#include "radixtier/ids.hpp"
#include "radixtier/transfer/store_record.hpp"

namespace radixtier {

/// The first page of a child, as the key of its parent's child map.
struct PageKey {
  const Token* data;
  std::uint32_t size;
};

/// A page of a prompt held as int64 (a tokenizer's output, read in place by the Python
/// binding): looked up among a node's children as it is (the hash and the equality below are
/// transparent). A value outside int32 never equals a tree token.
struct WidePageKey {
  const std::int64_t* data;
  std::uint32_t size;
};

struct PageKeyHash {
  using is_transparent = void;
  template <class T>
  static std::size_t hash(const T* data, std::uint32_t size) noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ size;
    for (std::uint32_t i = 0; i < size; ++i) {
      h ^= static_cast<std::uint32_t>(data[i]);  // an int64 in int32's range hashes as it
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    return static_cast<std::size_t>(h);
  }
  std::size_t operator()(PageKey k) const noexcept { return hash(k.data, k.size); }
  std::size_t operator()(WidePageKey k) const noexcept { return hash(k.data, k.size); }
};

struct PageKeyEq {
  using is_transparent = void;
  bool operator()(PageKey a, PageKey b) const noexcept {
    return a.size == b.size && std::memcmp(a.data, b.data, a.size * sizeof(Token)) == 0;
  }
  bool operator()(PageKey a, WidePageKey b) const noexcept {
    return a.size == b.size && std::equal(a.data, a.data + a.size, b.data,
                                          [](Token x, std::int64_t y) { return x == y; });
  }
  bool operator()(WidePageKey a, PageKey b) const noexcept { return (*this)(b, a); }
};

/// The copy in flight of a node's KV or snapshot: GPU -> host (kDemote, kWriteThrough),
/// host -> GPU (kPromote), host -> store (kStore), store -> host on its way to GPU (kLoad),
/// store -> GPU through a few host staging pages, slice by slice (kStage: no host copy), or a
/// request's live slot -> fresh GPU pool pages on the device (kMaterialize: insert's snapshot).
enum class Xfer : std::uint8_t {
  kNone,
  kDemote,
  kWriteThrough,
  kPromote,
  kStore,
  kLoad,
  kStage,
  kMaterialize
};

using OrderHook =
    boost::intrusive::set_member_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>>;

/// An order key's class: a lower class leaves first, whatever the rest of the key.
enum class KeyClass : std::uint8_t {
  kDead = 0,  ///< nothing resumes from it on this tier (node.hpp, "Eviction orders")
  kCopy = 1,  ///< a host copy of what the GPU holds too: dropping it loses nothing yet
  kLive = 2,
};

/// Position in an eviction order: class first (kDead leaves first), then the retention level
/// (the requests' priority, lower first), then priority (the GreedyDual value), then the
/// time of last use (older first).
struct OrderKey {
  KeyClass cls = KeyClass::kLive;
  double priority = 0;
  std::uint64_t stamp = 0;
  std::uint8_t level = 0;  ///< retention priority, 0..100 (request_options.hpp)
  friend bool operator<(const OrderKey& a, const OrderKey& b) {
    if (a.cls != b.cls) return a.cls < b.cls;
    if (a.level != b.level) return a.level < b.level;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.stamp < b.stamp;
  }
  friend bool operator==(const OrderKey&, const OrderKey&) = default;
};

/// What a page and a snapshot are on each tier (a row's ids are its tier's own types).
template <Tier T>
struct TierIds;
template <>
struct TierIds<Tier::kGpu> {
  using Page = GpuPageId;
  using Snapshot = std::vector<GpuPageId>;  ///< snapshot_pages() pages of the GPU pool
};
template <>
struct TierIds<Tier::kHost> {
  using Page = HostPageId;
  using Snapshot = std::vector<HostPageId>;  ///< snapshot_pages() pages of the host pool
};
template <>
struct TierIds<Tier::kStore> {
  using Page = RecordId;
  using Snapshot = RecordId;  ///< one store record
};

/// What an eviction order holds: the KV of nodes or their snapshots.
enum class Held : std::uint8_t { kKv, kSnapshot };

/// One tier's residency on a node (see "Residency rows" above).
template <Tier T>
struct Row {
  using Page = typename TierIds<T>::Page;
  using Snapshot = typename TierIds<T>::Snapshot;

  std::vector<Page> pages;        ///< empty or one per page of the node's tokens
  Snapshot snapshot{};            ///< the snapshot at the node's boundary (empty: none)
  std::uint32_t kv_children = 0;  ///< children whose row holds KV
  double kv_age = 0;              ///< the tier's age at the last use of the KV
  double snap_age = 0;            ///< ... of the snapshot
  OrderHook kv_hook, snap_hook;   ///< the tier's orders (Order<T, Held>)
  OrderKey kv_key, snap_key;      ///< valid while linked

  bool has_kv() const { return !pages.empty(); }
  bool has_snapshot() const {
    if constexpr (T == Tier::kStore) {
      return snapshot.valid();
    } else {
      return !snapshot.empty();
    }
  }
  /// Pool pages the KV (h = kKv) or the snapshot takes on this row (a paged tier: GPU, host).
  std::size_t held_pages(Held h) const requires(T != Tier::kStore) {
    return h == Held::kKv ? pages.size() : snapshot.size();
  }
  OrderHook& hook(Held h) { return h == Held::kKv ? kv_hook : snap_hook; }
  OrderKey& key(Held h) { return h == Held::kKv ? kv_key : snap_key; }
  const OrderKey& key(Held h) const { return h == Held::kKv ? kv_key : snap_key; }
};

struct Node {
  Node* parent = nullptr;
  std::vector<Token> tokens;  ///< this node's own tokens, a whole number of pages
  std::size_t boundary = 0;   ///< tokens from the root to this node's end

  Row<Tier::kGpu> gpu;
  Row<Tier::kHost> host;
  Row<Tier::kStore> store;
  template <Tier T>
  Row<T>& row() {
    if constexpr (T == Tier::kGpu) {
      return gpu;
    } else if constexpr (T == Tier::kHost) {
      return host;
    } else {
      return store;
    }
  }
  template <Tier T>
  const Row<T>& row() const {
    return const_cast<Node*>(this)->row<T>();
  }

  Xfer kv_xfer = Xfer::kNone;
  Xfer snap_xfer = Xfer::kNone;
  /// The in-flight transfer moving the KV / the snapshot: an id of the GPU-host transfers,
  /// for kStore and kLoad of the store transfers, for kStage of the staged loads.
  std::uint32_t kv_xfer_id = 0;
  std::uint32_t snap_xfer_id = 0;

  std::uint32_t lock_count = 0;     ///< running requests whose path includes this node
  std::uint32_t snapshot_lock = 0;  ///< running requests resuming from this snapshot
  std::uint64_t last_access = 0;    ///< clock of the last use of the KV
  // What the eviction keys are made of (see "Eviction orders" above; the ages are per row).
  std::uint64_t snap_access = 0;  ///< clock of the last use of the snapshot
  std::uint32_t kv_uses = 0;      ///< admissions through this node + its insert
  std::uint32_t snap_uses = 0;    ///< resumes from this snapshot + its insert
  /// Resumes from this snapshot while it was the end of all its path holds: no snapshot
  /// below it and no child with KV (a conversation's next turn resuming its last finish).
  std::uint32_t snap_frontier_resumes = 0;
  std::size_t snap_gap = 0;           ///< tokens back to the snapshot above, at the last use
  std::uint32_t snapshots_below = 0;  ///< nodes at or below this one that have a snapshot
  /// The room-making round in which a demotion of the KV / the snapshot failed (0: none):
  /// that round skips it as a victim while others are left (see the state machine above).
  std::uint64_t kv_demote_failed = 0, snap_demote_failed = 0;
  std::uint8_t kv_priority = 0;    ///< highest priority of the requests that used the KV
  std::uint8_t snap_priority = 0;  ///< highest priority of the requests that used the snapshot
  std::uint32_t host_pin = 0;      ///< pins whose prefix includes this node
  /// Its host copies went to a shared tier (PrefixCache::mark_published): under write-through
  /// too, a host copy of what the GPU holds is then class kCopy.
  bool published = false;
  std::uint32_t snap_pin = 0;  ///< pins that end at this node (they keep its snapshot)

  std::unordered_map<PageKey, Node*, PageKeyHash, PageKeyEq> children;

  /// The store path hash at this node's end (store_record.hpp), computed lazily for the
  /// records it writes; a split keeps the lower part's (its end does not move).
  bool end_path_known = false;
  PathHash end_path;

  // KV events (events.hpp), kept only while an event sink is attached: the residency last
  // reported (bit 0 GPU, bit 1 host) and the hash of the node's last page, computed lazily.
  std::uint8_t reported_kv = 0, reported_snapshot = 0;
  bool tail_hash_known = false;
  std::uint64_t tail_hash = 0;

  std::size_t page_count(std::uint32_t page_size) const { return tokens.size() / page_size; }
  /// KV "not gone": some copy exists or is being made from a valid source.
  bool has_kv() const { return gpu.has_kv() || host.has_kv() || store.has_kv(); }
  bool has_snapshot() const {
    return gpu.has_snapshot() || host.has_snapshot() || store.has_snapshot();
  }
  /// gpu.pages / gpu.snapshot are a copy's destinations (not usable yet).
  bool kv_to_gpu() const {
    return kv_xfer == Xfer::kPromote || kv_xfer == Xfer::kLoad || kv_xfer == Xfer::kStage;
  }
  bool snap_to_gpu() const {
    return snap_xfer == Xfer::kPromote || snap_xfer == Xfer::kLoad || snap_xfer == Xfer::kStage ||
           snap_xfer == Xfer::kMaterialize;
  }
  /// The snapshot's bytes are on the GPU, or a device copy (kMaterialize) is writing them
  /// there: resuming from it needs no host copy (the fill is ordered after the device copy).
  bool snap_on_device() const {
    return gpu.has_snapshot() && (!snap_to_gpu() || snap_xfer == Xfer::kMaterialize);
  }
  /// host.pages / host.snapshot are a copy's destinations.
  bool kv_to_host() const {
    return kv_xfer == Xfer::kDemote || kv_xfer == Xfer::kWriteThrough || kv_xfer == Xfer::kLoad;
  }
  bool snap_to_host() const {
    return snap_xfer == Xfer::kDemote || snap_xfer == Xfer::kWriteThrough ||
           snap_xfer == Xfer::kLoad;
  }
  static bool store_copy(Xfer x) { return x == Xfer::kStore || x == Xfer::kLoad; }
  /// Some snapshot at or below this node: its KV can be resumed from (else it is dead KV).
  bool kv_live() const { return snapshots_below > 0; }
  bool is_root() const { return parent == nullptr; }
  PageKey first_page(std::uint32_t page_size) const { return {tokens.data(), page_size}; }

  // Rule 4: the exact conditions for membership in each eviction order, one per tier and
  // kind. KV leaves a tier leaf-first (no child holds KV there) and only when nothing locks
  // it; a pin keeps the host copies (node.hpp, "Host pins").
  template <Tier T>
  bool kv_evictable() const {
    return !is_root() && row<T>().has_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           row<T>().kv_children == 0 && (T != Tier::kHost || host_pin == 0);
  }
  template <Tier T>
  bool snapshot_evictable() const {
    return row<T>().has_snapshot() && snap_xfer == Xfer::kNone && snapshot_lock == 0 &&
           (T != Tier::kHost || snap_pin == 0);
  }
  template <Tier T, Held H>
  bool evictable() const {
    return H == Held::kKv ? kv_evictable<T>() : snapshot_evictable<T>();
  }
};

/// The hook of Order<T, H> inside a node's row (boost::intrusive function_hook traits).
template <Tier T, Held H>
struct RowHook {
  using hook_type = OrderHook;
  using hook_ptr = OrderHook*;
  using const_hook_ptr = const OrderHook*;
  using value_type = Node;
  using pointer = Node*;
  using const_pointer = const Node*;
  static constexpr OrderHook Row<T>::*kHook =
      H == Held::kKv ? &Row<T>::kv_hook : &Row<T>::snap_hook;
  static constexpr Row<T> Node::*row_member() {
    if constexpr (T == Tier::kGpu) {
      return &Node::gpu;
    } else if constexpr (T == Tier::kHost) {
      return &Node::host;
    } else {
      return &Node::store;
    }
  }
  static constexpr Row<T> Node::*kRow = row_member();
  static hook_ptr to_hook_ptr(value_type& n) { return &((n.*kRow).*kHook); }
  static const_hook_ptr to_hook_ptr(const value_type& n) { return &((n.*kRow).*kHook); }
  static pointer to_value_ptr(hook_ptr h) {
    return boost::intrusive::get_parent_from_member<Node>(
        boost::intrusive::get_parent_from_member<Row<T>>(h, kHook), kRow);
  }
  static const_pointer to_value_ptr(const_hook_ptr h) {
    return to_value_ptr(const_cast<hook_ptr>(h));
  }
};

template <Tier T, Held H>
struct OrderLess {
  bool operator()(const Node& a, const Node& b) const {
    return a.row<T>().key(H) < b.row<T>().key(H);
  }
};

/// One eviction order: the nodes whose KV / snapshot is evictable on tier T now, lowest key
/// first.
template <Tier T, Held H>
using Order = boost::intrusive::multiset<Node, boost::intrusive::function_hook<RowHook<T, H>>,
                                         boost::intrusive::compare<OrderLess<T, H>>,
                                         boost::intrusive::constant_time_size<true>>;

}  // namespace radixtier
