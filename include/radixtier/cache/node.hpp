// Node: one edge of the radix tree, carrying its own residency.
//
// A node owns `tokens` (a whole number of pages) and the KV of exactly those pages; its
// boundary is the token count from the root to its end, where its snapshot (if any) was taken.
//
// KV residency (per node, all its pages together)        moved by
//   Gpu        gpu_pages set, host_pages empty            insert (adopt), promotion done
//   Host       gpu_pages empty, host_pages set            demotion done (GPU copy freed)
//   Both       both set (the host copy is clean)          write-through done, promotion done,
//                                                         demotion done while locked
//   Gone       both empty: a tombstone                    drop
// In flight (kv_xfer != kNone) the node is in one of the above plus a copy:
//   kDemote / kWriteThrough   gpu_pages valid, host_pages are the copy's destinations
//   kPromote                  host_pages valid, gpu_pages are the copy's destinations
// Transitions: Gpu -(evict, write-back)-> Gpu+kDemote -(done)-> Host (or Both if locked)
//              Gpu -(evict, no host room)-> Gone                         (drop)
//              Both -(evict GPU)-> Host      Both -(evict host)-> Gpu    (free, no copy)
//              Host -(admit)-> Host+kPromote -(done)-> Both
//              Gpu -(insert, write-through)-> Gpu+kWriteThrough -(done)-> Both
//              Host/Gone -(insert of the same tokens)-> Both/Gpu         (adopt fresh pages)
//              any+copy -(copy failed)-> the state before the copy: the intact source stays
//                  (demote, write-through: Gpu; promote: Host), the destination is freed
//              any+copy -(batch refused by the engine)-> the state before the copy
// A failed copy never hands out bytes (rule 7): a request whose promotion failed finds the
// node host-only, resumes above it and recomputes (wait()); the next admission may promote it
// again. A failed demotion does not make its room: the victim keeps its GPU copy, is marked
// (kv_demote_failed / snap_demote_failed = the room-making round) and skipped for the rest of
// that round, so the room comes from the next victim; when only marked victims are left, the
// round drops them (GPU copy freed, counted as a drop), so an engine that fails every copy
// still ends each round, never loops.
// Eviction from GPU runs on demand (make_gpu_*_room, for an allocation: submits, then waits)
// or ahead of need (PrefixCache::demote_ahead, the watermark step: submits, never waits; the
// copy lands and is reaped later). Both take the order's head and use the transitions above.
// The store tier (a StoreEngine below host: the disk) is a third row with the same
// transitions one tier down; its copies are clean (records never change once written):
//   Host -(host needs room, or the host watermark)-> Host+kStore -(done)-> Store (Host+Store
//        if locked or pinned meanwhile)             (host pages are the write's sources)
//   Host+Store -(evict host)-> Store                (free: the store copy is clean)
//   Store -(admit)-> Store+kLoad -(read done)-> Host+Store+kPromote -(done)-> all three
//        (kLoad: host_pages and gpu_pages are both destinations, held by the transfer)
//   Store -(admit, no host room for the whole store match)-> Store+kStage -(every page on
//        GPU)-> Gpu+Store   (kStage, a staged load: gpu_pages / gpu_snapshot are the
//        destinations, held by the load; host_pages stay empty: the records go store -> the
//        load's few host staging pages -> GPU a chunk at a time, and no host copy is kept)
//   Store -(store needs room, flush)-> Gone         (the records are erased)
//   any+kStore -(write failed)-> Host, dropped when the write was for room (degrades to
//        recompute as a drop did before the store existed)
//   any+kLoad -(read failed: kDataLoss)-> the records are erased, the resource is Gone there;
//        (an I/O error: kTransferFailed)-> Store; destinations freed either way (rule 7)
//   any+kStage -(a chunk failed)-> as kLoad (kDataLoss: Gone, else Store); the node's pages
//        that landed are freed with the rest when the load ends (no chunk writes them any
//        more), and nothing below the node is read. A node whose pages all landed first
//        stays Gpu+Store; the snapshot lands or fails on its own (one chunk)
// Only the default namespace has a store row; store_pages (one record per page) is all or
// nothing, like the other rows.
// The snapshot at the boundary follows the same machine (gpu_snapshot, host_snapshot,
// store_snapshot, snap_xfer), with "None" for Gone. A host snapshot lives in snapshot_pages() pages
// of the one host pool (host_snapshot[i] holds bytes [i * page_bytes, ...) of it), not contiguous.
//
// Eviction orders (one per pool: GPU KV pages, GPU snapshot slots, host pages, store slots;
// the host pool and the store order their KV and their snapshots in two sets whose heads are
// compared, so each is one order):
// a node is in a set iff the matching *_evictable() predicate holds (rule 4), sorted by its
// OrderKey, lowest first. Keys follow GreedyDual-Size-Frequency: priority = the pool's age
// (the priority of its last victim) at the node's last use + uses x value per byte, where a
// KV node's value is its tokens (one per kv_bytes_per_token bytes) and a snapshot's is the
// recompute back to the snapshot above it (snap_gap tokens). A key is a function of what the
// node stores about its last use, so a node that re-enters a set (a parent exposed by
// evicting its child, a copy that finished) takes its old place, never the most recent one.
// Class 0 goes before class 1 whatever the priority: dead KV (no snapshot at or below the
// node: it cannot be resumed from) and snapshots whose own KV left that tier. Within a class
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
#pragma once

#include <algorithm>
#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <unordered_map>
#include <vector>

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
/// store -> GPU through a few host staging pages, slice by slice (kStage: no host copy).
enum class Xfer : std::uint8_t { kNone, kDemote, kWriteThrough, kPromote, kStore, kLoad, kStage };

using OrderHook =
    boost::intrusive::set_member_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>>;

/// Position in an eviction order: class first (0 leaves first), then the retention level
/// (the requests' priority, lower first), then priority (the GreedyDual value), then the
/// time of last use (older first).
struct OrderKey {
  std::uint8_t cls = 1;
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

struct Node {
  Node* parent = nullptr;
  std::vector<Token> tokens;  ///< this node's own tokens, a whole number of pages
  std::size_t boundary = 0;   ///< tokens from the root to this node's end

  std::vector<GpuPageId> gpu_pages;    ///< empty or one per page of `tokens`
  std::vector<HostPageId> host_pages;  ///< empty or one per page of `tokens`
  GpuSlotId gpu_snapshot;
  std::vector<HostPageId> host_snapshot;  ///< empty, or the host pages of the snapshot
  std::vector<RecordId> store_pages;      ///< empty or one store record per page of `tokens`
  RecordId store_snapshot;                ///< the snapshot's store record (invalid: none)
  Xfer kv_xfer = Xfer::kNone;
  Xfer snap_xfer = Xfer::kNone;
  /// The in-flight transfer moving the KV / the snapshot: an id of the GPU-host transfers,
  /// for kStore and kLoad of the store transfers, for kStage of the staged loads.
  std::uint32_t kv_xfer_id = 0;
  std::uint32_t snap_xfer_id = 0;

  std::uint32_t lock_count = 0;         ///< running requests whose path includes this node
  std::uint32_t snapshot_lock = 0;      ///< running requests resuming from this snapshot
  std::uint32_t gpu_kv_children = 0;    ///< children with gpu_pages set
  std::uint32_t host_kv_children = 0;   ///< children with host_pages set
  std::uint32_t store_kv_children = 0;  ///< children with store_pages set
  std::uint64_t last_access = 0;        ///< clock of the last use of the KV
  // What the eviction keys are made of (see "Eviction orders" above).
  std::uint64_t snap_access = 0;                ///< clock of the last use of the snapshot
  std::uint32_t kv_uses = 0;                    ///< admissions through this node + its insert
  std::uint32_t snap_uses = 0;                  ///< resumes from this snapshot + its insert
  double kv_age_gpu = 0, kv_age_host = 0;       ///< pool ages at the last use of the KV
  double snap_age_gpu = 0, snap_age_host = 0;   ///< pool ages at the last use of the snapshot
  double kv_age_store = 0, snap_age_store = 0;  ///< the store's age at those uses
  std::size_t snap_gap = 0;           ///< tokens back to the snapshot above, at the last use
  std::uint32_t snapshots_below = 0;  ///< nodes at or below this one that have a snapshot
  /// The room-making round in which a demotion of the KV / the snapshot failed (0: none):
  /// that round skips it as a victim while others are left (see the state machine above).
  std::uint64_t kv_demote_failed = 0, snap_demote_failed = 0;
  std::uint8_t kv_priority = 0;    ///< highest priority of the requests that used the KV
  std::uint8_t snap_priority = 0;  ///< highest priority of the requests that used the snapshot
  std::uint32_t host_pin = 0;      ///< pins whose prefix includes this node
  std::uint32_t snap_pin = 0;      ///< pins that end at this node (they keep its snapshot)

  std::unordered_map<PageKey, Node*, PageKeyHash, PageKeyEq> children;

  OrderHook gpu_kv_hook, host_kv_hook, gpu_snap_hook, host_snap_hook;
  OrderKey gpu_kv_key, host_kv_key, gpu_snap_key, host_snap_key;  ///< valid while linked
  OrderHook store_kv_hook, store_snap_hook;
  OrderKey store_kv_key, store_snap_key;

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
  bool has_gpu_kv() const { return !gpu_pages.empty(); }
  bool has_host_kv() const { return !host_pages.empty(); }
  bool has_store_kv() const { return !store_pages.empty(); }
  /// KV "not gone": some copy exists or is being made from a valid source.
  bool has_kv() const { return has_gpu_kv() || has_host_kv() || has_store_kv(); }
  bool has_host_snapshot() const { return !host_snapshot.empty(); }
  bool has_snapshot() const {
    return gpu_snapshot.valid() || has_host_snapshot() || store_snapshot.valid();
  }
  /// gpu_pages / gpu_snapshot are a copy's destinations (not usable yet).
  bool kv_to_gpu() const {
    return kv_xfer == Xfer::kPromote || kv_xfer == Xfer::kLoad || kv_xfer == Xfer::kStage;
  }
  bool snap_to_gpu() const {
    return snap_xfer == Xfer::kPromote || snap_xfer == Xfer::kLoad || snap_xfer == Xfer::kStage;
  }
  /// host_pages / host_snapshot are a copy's destinations.
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

  // Rule 4: the exact conditions for membership in each eviction list.
  bool gpu_kv_evictable() const {
    return !is_root() && has_gpu_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           gpu_kv_children == 0;
  }
  bool host_kv_evictable() const {
    return !is_root() && has_host_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           host_kv_children == 0 && host_pin == 0;
  }
  bool gpu_snapshot_evictable() const {
    return gpu_snapshot.valid() && snap_xfer == Xfer::kNone && snapshot_lock == 0;
  }
  bool host_snapshot_evictable() const {
    return has_host_snapshot() && snap_xfer == Xfer::kNone && snapshot_lock == 0 && snap_pin == 0;
  }
  bool store_kv_evictable() const {
    return !is_root() && has_store_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           store_kv_children == 0;
  }
  bool store_snapshot_evictable() const {
    return store_snapshot.valid() && snap_xfer == Xfer::kNone && snapshot_lock == 0;
  }
};

template <OrderKey Node::*Key>
struct OrderLess {
  bool operator()(const Node& a, const Node& b) const { return a.*Key < b.*Key; }
};

/// One eviction order: the evictable nodes of one kind on one tier, lowest key first.
template <OrderHook Node::*Hook, OrderKey Node::*Key>
using Order = boost::intrusive::multiset<Node, boost::intrusive::member_hook<Node, OrderHook, Hook>,
                                         boost::intrusive::compare<OrderLess<Key>>,
                                         boost::intrusive::constant_time_size<true>>;

}  // namespace radixtier
