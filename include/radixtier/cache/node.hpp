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
//   Gone       both empty: a tombstone                    drop, failed transfer
// In flight (kv_xfer != kNone) the node is in one of the above plus a copy:
//   kDemote / kWriteThrough   gpu_pages valid, host_pages are the copy's destinations
//   kPromote                  host_pages valid, gpu_pages are the copy's destinations
// Transitions: Gpu -(evict, write-back)-> Gpu+kDemote -(done)-> Host (or Both if locked)
//              Gpu -(evict, no host room)-> Gone                         (drop)
//              Both -(evict GPU)-> Host      Both -(evict host)-> Gpu    (free, no copy)
//              Host -(admit)-> Host+kPromote -(done)-> Both
//              Gpu -(insert, write-through)-> Gpu+kWriteThrough -(done)-> Both
//              Host/Gone -(insert of the same tokens)-> Both/Gpu         (adopt fresh pages)
//              any+copy -(copy failed)-> Gone (demote, promote) / Gpu (write-through)
//              any+copy -(batch refused by the engine)-> the state before the copy
// The snapshot at the boundary follows the same machine (gpu_snapshot, host_snapshot,
// snap_xfer), with "None" for Gone.
//
// A node with no children, no lock, nothing in flight and no KV leaves the tree (its
// snapshot, unusable without KV, goes with it). A tombstone with children stays: an insert
// that recomputes its tokens revives it and makes its subtree reachable again.
#pragma once

#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier {

/// The first page of a child, as the key of its parent's child map.
struct PageKey {
  const Token* data;
  std::uint32_t size;
};

struct PageKeyHash {
  std::size_t operator()(PageKey k) const noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ k.size;
    for (std::uint32_t i = 0; i < k.size; ++i) {
      h ^= static_cast<std::uint32_t>(k.data[i]);
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    return static_cast<std::size_t>(h);
  }
};

struct PageKeyEq {
  bool operator()(PageKey a, PageKey b) const noexcept {
    return a.size == b.size && std::memcmp(a.data, b.data, a.size * sizeof(Token)) == 0;
  }
};

enum class Xfer : std::uint8_t { kNone, kDemote, kWriteThrough, kPromote };

using LruHook =
    boost::intrusive::list_member_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>>;

struct Node {
  Node* parent = nullptr;
  std::vector<Token> tokens;  ///< this node's own tokens, a whole number of pages
  std::size_t boundary = 0;   ///< tokens from the root to this node's end

  std::vector<GpuPageId> gpu_pages;    ///< empty or one per page of `tokens`
  std::vector<HostPageId> host_pages;  ///< empty or one per page of `tokens`
  GpuSlotId gpu_snapshot;
  HostSlotId host_snapshot;
  Xfer kv_xfer = Xfer::kNone;
  Xfer snap_xfer = Xfer::kNone;
  std::uint32_t kv_xfer_id = 0;    ///< the in-flight transfer moving the KV
  std::uint32_t snap_xfer_id = 0;  ///< the in-flight transfer moving the snapshot

  std::uint32_t lock_count = 0;        ///< running requests whose path includes this node
  std::uint32_t snapshot_lock = 0;     ///< running requests resuming from this snapshot
  std::uint32_t gpu_kv_children = 0;   ///< children with gpu_pages set
  std::uint32_t host_kv_children = 0;  ///< children with host_pages set
  std::uint64_t last_access = 0;       ///< time of the last use (admission, insert): recency

  std::unordered_map<PageKey, Node*, PageKeyHash, PageKeyEq> children;

  LruHook gpu_kv_hook, host_kv_hook, gpu_snap_hook, host_snap_hook;

  std::size_t page_count(std::uint32_t page_size) const { return tokens.size() / page_size; }
  bool has_gpu_kv() const { return !gpu_pages.empty(); }
  bool has_host_kv() const { return !host_pages.empty(); }
  /// KV "not gone": some copy exists or is being made from a valid source.
  bool has_kv() const { return has_gpu_kv() || has_host_kv(); }
  bool has_snapshot() const { return gpu_snapshot.valid() || host_snapshot.valid(); }
  bool is_root() const { return parent == nullptr; }
  PageKey first_page(std::uint32_t page_size) const { return {tokens.data(), page_size}; }

  // Rule 4: the exact conditions for membership in each eviction list.
  bool gpu_kv_evictable() const {
    return !is_root() && has_gpu_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           gpu_kv_children == 0;
  }
  bool host_kv_evictable() const {
    return !is_root() && has_host_kv() && kv_xfer == Xfer::kNone && lock_count == 0 &&
           host_kv_children == 0;
  }
  bool gpu_snapshot_evictable() const {
    return gpu_snapshot.valid() && snap_xfer == Xfer::kNone && snapshot_lock == 0;
  }
  bool host_snapshot_evictable() const {
    return host_snapshot.valid() && snap_xfer == Xfer::kNone && snapshot_lock == 0;
  }
};

template <LruHook Node::*Member>
using LruList = boost::intrusive::list<Node, boost::intrusive::member_hook<Node, LruHook, Member>,
                                       boost::intrusive::constant_time_size<true>>;

}  // namespace radixtier
