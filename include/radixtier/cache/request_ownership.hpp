// RequestOwnership: which running request owns each request-held id of one space (GPU pages
// or GPU snapshot slots), so that rule 9 of the brief holds: an id allocated for a request
// is that request's alone until it hands it to the tree or frees it. No other request can
// insert, free or read it through the cache, and releasing the request returns what it
// still owns.
//
// Per id: the owner's lock (or none) and the id's position in the owner's list, so adding,
// removing and checking an id are O(1) and releasing a request is O(what it owns).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

template <class Id>
class RequestOwnership {
 public:
  explicit RequestOwnership(std::uint32_t capacity) : owner_(capacity), pos_(capacity, 0) {}

  /// The request that owns `id` (an invalid LockId: none). `id` must be in range.
  LockId owner(Id id) const { return owner_[id.value()]; }
  std::size_t owned_count() const { return total_; }
  std::size_t owned_count(LockId lock) const {
    auto it = by_lock_.find(lock);
    return it == by_lock_.end() ? 0 : it->second.size();
  }

  /// `id` (owned by nobody) now belongs to `lock`.
  void add(LockId lock, Id id) {
    std::vector<Id>& list = by_lock_[lock];
    owner_[id.value()] = lock;
    pos_[id.value()] = static_cast<std::uint32_t>(list.size());
    list.push_back(id);
    ++total_;
  }

  /// `id` (owned by someone) belongs to nobody now: the tree adopted it or it was freed.
  void remove(Id id) {
    const LockId lock = owner_[id.value()];
    std::vector<Id>& list = by_lock_.at(lock);
    const std::uint32_t p = pos_[id.value()];
    list[p] = list.back();
    pos_[list[p].value()] = p;
    list.pop_back();
    if (list.empty()) by_lock_.erase(lock);
    owner_[id.value()] = LockId();
    --total_;
  }

  /// Everything `lock` owns (in no particular order), which then belongs to nobody.
  std::vector<Id> take_all(LockId lock) {
    auto it = by_lock_.find(lock);
    if (it == by_lock_.end()) return {};
    std::vector<Id> ids = std::move(it->second);
    by_lock_.erase(it);
    for (Id id : ids) owner_[id.value()] = LockId();
    total_ -= ids.size();
    return ids;
  }

  /// Ok when `lock` owns `id`; otherwise an error for `op` that names the real owner.
  Status check_owner(LockId lock, Id id, const char* op) const {
    const LockId o = owner_[id.value()];
    if (o == lock) return Status::ok();
    std::ostringstream os;
    os << op << ": " << id;
    if (o.valid())
      os << " belongs to request " << o << ", not to " << lock;
    else
      os << " is not held by " << lock << " (it is free, in the tree or in a copy)";
    return invalid_argument(os.str());
  }

  /// Consistency of the index: every listed id points back at its owner and position.
  std::string check(const char* name) const {
    std::size_t listed = 0;
    for (const auto& [lock, list] : by_lock_) {
      if (list.empty()) return std::string(name) + ": an empty owner list was kept";
      for (std::size_t i = 0; i < list.size(); ++i) {
        const Id id = list[i];
        if (owner_[id.value()] != lock || pos_[id.value()] != i)
          return std::string(name) + ": an owned id does not point back at its owner";
      }
      listed += list.size();
    }
    if (listed != total_) return std::string(name) + ": owned count differs from the lists";
    return {};
  }

 private:
  std::vector<LockId> owner_;
  std::vector<std::uint32_t> pos_;
  std::unordered_map<LockId, std::vector<Id>> by_lock_;
  std::size_t total_ = 0;
};

}  // namespace radixtier
