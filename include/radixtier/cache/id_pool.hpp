// IdPool: a free list over one index space (GPU pages, host pages, snapshot slots) that also
// records who holds each id, so rule 2 of the brief ("every id is in exactly one place") is
// checkable and a double free is an error, not a corruption.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier {

enum class Holder : std::uint8_t {
  kFree,      ///< on the free list
  kNode,      ///< owned by one tree node
  kRequest,   ///< owned by one running request
  kTransfer,  ///< the destination of one in-flight transfer
};
inline constexpr std::size_t kHolderCount = 4;

template <class Id>
class IdPool {
 public:
  explicit IdPool(std::uint32_t capacity) : holder_(capacity, Holder::kFree) {
    free_.reserve(capacity);
    // Pop order 0, 1, 2, ... keeps ids small in tests.
    for (std::uint32_t i = capacity; i > 0; --i) free_.push_back(Id(i - 1));
    counts_[static_cast<std::size_t>(Holder::kFree)] = capacity;
  }

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(holder_.size()); }
  std::uint32_t free_count() const { return count(Holder::kFree); }
  std::uint32_t count(Holder h) const { return counts_[static_cast<std::size_t>(h)]; }
  bool in_range(Id id) const { return id.valid() && id.value() < holder_.size(); }
  Holder holder(Id id) const { return holder_[id.value()]; }

  /// Takes one id off the free list for `to`; nullopt when empty.
  std::optional<Id> take(Holder to) {
    if (free_.empty()) return std::nullopt;
    Id id = free_.back();
    free_.pop_back();
    move(id, Holder::kFree, to);
    return id;
  }

  void give_back(Id id) {
    move(id, holder_[id.value()], Holder::kFree);
    free_.push_back(id);
  }

  /// Changes the holder of an id that is not free (free ids move only via take/give_back).
  void reassign(Id id, Holder to) { move(id, holder_[id.value()], to); }

  /// Rule 2 for this space: the free list holds exactly the ids marked free, each once.
  std::string check(const char* name) const {
    std::vector<bool> seen(holder_.size(), false);
    for (Id id : free_) {
      if (!in_range(id)) return std::string(name) + ": out-of-range id on the free list";
      if (seen[id.value()]) return std::string(name) + ": id twice on the free list";
      seen[id.value()] = true;
      if (holder_[id.value()] != Holder::kFree)
        return std::string(name) + ": id on the free list is held by someone";
    }
    if (free_.size() != count(Holder::kFree))
      return std::string(name) + ": free list size differs from the free count";
    std::uint64_t total = 0;
    for (auto c : counts_) total += c;
    if (total != holder_.size()) return std::string(name) + ": holder counts do not add up";
    return {};
  }

 private:
  void move(Id id, Holder from, Holder to) {
    holder_[id.value()] = to;
    --counts_[static_cast<std::size_t>(from)];
    ++counts_[static_cast<std::size_t>(to)];
  }

  std::vector<Holder> holder_;
  std::vector<Id> free_;
  std::array<std::uint32_t, kHolderCount> counts_{};
};

}  // namespace radixtier
