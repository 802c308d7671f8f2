// RequestTable: the running requests' part of PrefixCache. It owns each lock's record (the
// deepest node of the locked path, the node whose snapshot the request resumes from, the root
// of its namespace, its retention priority), the lock ids, which request owns each
// request-held GPU page and GPU snapshot slot (rule 9, RequestOwnership) and the largest
// allocation seen so far (the unit of the GPU watermarks).
//
// Invariants it keeps (PrefixCache::check_invariants() checks them with the pools and nodes):
//   - lock ids are unique among the live locks (a 32-bit counter that wraps skips live ids);
//   - every page or slot a request owns is owned by a live lock, and only by it (check()).
// The counts a lock adds to its path (lock_count, snapshot_lock) are the nodes' own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "radixtier/cache/node.hpp"
#include "radixtier/cache/request_options.hpp"
#include "radixtier/cache/request_ownership.hpp"

namespace radixtier {

/// The next id after `counter` that is not a key of `in_use` (nor the invalid value), so ids
/// stay unique when a long-running server wraps the 32-bit counter.
template <class Map>
std::uint32_t next_free_id(std::uint32_t& counter, const Map& in_use) {
  while (counter == StrongId<LockTag>::kInvalid || in_use.count(counter) != 0) ++counter;
  return counter++;
}

/// What a running request holds in the tree.
struct LockRecord {
  Node* node;       ///< deepest node of the locked path
  Node* snap_node;  ///< node whose snapshot the request resumes from (nullptr: none)
  Node* root;       ///< the root of the request's namespace
  RetentionPriority priority;
  /// The request's live slot for the state it resumes from (invalid: none yet); it is the
  /// request's own (slot_owner), filled from snap_node's cached pages (rule 6).
  GpuSlotId live{};
  const Node* filled = nullptr;  ///< whose snapshot the live slot holds (nullptr: none yet)
  /// The device copy into the live slot in flight (TransfersInFlight::device; 0: none). It is
  /// submitted at admission, `after` the snapshot's promotion when that is still arriving; a
  /// snapshot still on its way from the store gets its fill once its promotion starts.
  std::uint32_t fill_xfer = 0;
  /// The copy into the live slot failed (or was refused): reported as kFailed until wait()
  /// resumes the request (earlier when the prefix itself was lost, else from the root).
  bool fill_failed = false;
  /// The caller's stream (RequestOptions::stream): every batch a call with this lock submits
  /// is ordered after it.
  StreamHandle stream = nullptr;
  /// stream_wait() was called: path_pages()/path_snapshot() hand out the ids before the copies
  /// land (the caller's stream is ordered after them).
  bool stream_waited = false;
  /// snap_node's cached snapshot is locked (Node::snapshot_lock) until the live slot holds
  /// its copy; from then on the request computes in its slot and the cached pages may leave.
  bool holds_snapshot() const { return snap_node != nullptr && filled != snap_node; }
};

class RequestTable {
 public:
  using Map = std::unordered_map<std::uint32_t, LockRecord>;

  RequestTable(std::uint32_t gpu_pages, std::uint32_t gpu_slots)
      : page_owner(gpu_pages), slot_owner(gpu_slots) {}

  /// A lock id no live lock has.
  LockId new_id() { return LockId(next_free_id(next_, locks_)); }
  LockRecord& add(LockId id, const LockRecord& rec) {
    return locks_.emplace(id.value(), rec).first->second;
  }
  /// nullptr: no such live lock.
  const LockRecord* find(LockId id) const {
    auto it = locks_.find(id.value());
    return it == locks_.end() ? nullptr : &it->second;
  }
  LockRecord& at(LockId id) { return locks_.at(id.value()); }
  void erase(LockId id) { locks_.erase(id.value()); }
  std::size_t size() const { return locks_.size(); }
  Map::const_iterator begin() const { return locks_.begin(); }
  Map::const_iterator end() const { return locks_.end(); }

  /// An allocation of n pages was made: the largest so far is the watermarks' unit.
  void note_alloc(std::size_t n) { alloc_burst_ = std::max(alloc_burst_, n); }
  std::size_t alloc_burst() const { return alloc_burst_; }

  /// Which request owns each request-held GPU page and snapshot slot (rule 9).
  RequestOwnership<GpuPageId> page_owner;
  RequestOwnership<GpuSlotId> slot_owner;

 private:
  Map locks_;
  std::uint32_t next_ = 0;
  std::size_t alloc_burst_ = 0;
};

}  // namespace radixtier
