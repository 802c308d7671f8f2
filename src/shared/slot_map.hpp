// SlotMap: which master serves each of the 16384 slots, as one CLUSTER SLOTS reply said.
//
// Contract: immutable once built (with_owner() makes a patched copy) (shared between calls by
// shared_ptr<const SlotMap>); a slot no range covers has no master (its keys fail). parse() takes
// the node's reply and the host it was asked of (a node may report its own address as "").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/shared/key_slot.hpp"
#include "radixtier/status.hpp"
#include "shared/redis_connection.hpp"

namespace radixtier::shared::detail {

class SlotMap {
 public:
  static Result<SlotMap> parse(const redisReply* reply, std::string_view asked_host);
  /// "host:port" of the slot's master, or null.
  const std::string* master_of(std::uint16_t slot) const {
    const auto i = owner_[slot];
    return i < 0 ? nullptr : &masters_[static_cast<std::size_t>(i)];
  }
  const std::vector<std::string>& masters() const { return masters_; }
  std::size_t assigned() const;
  /// A copy with `slot` served by `address` (what a MOVED reply said).
  SlotMap with_owner(std::uint16_t slot, const std::string& address) const;

 private:
  std::vector<std::string> masters_;
  std::array<std::int16_t, kClusterSlots> owner_{};
};

}  // namespace radixtier::shared::detail
