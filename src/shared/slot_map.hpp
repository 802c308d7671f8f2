// SlotMap: which master serves each of the 16384 slots, as one CLUSTER SLOTS reply said.
//
// Contract: immutable once built (with_owners() makes a patched copy) (shared between calls by
// shared_ptr<const SlotMap>); a slot no range covers has no master (its keys fail and ask
// for a refresh). parse() takes the node's reply and the host it was asked of: a node that
// reports its own address as "", "?" or nil (cluster-preferred-endpoint-type
// unknown-endpoint) is reached at the address the reply came from, as Redis documents.
// masters() holds only masters that serve a slot (at most one per slot, so an owner index
// always fits its int32).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "radixtier/shared/key_slot.hpp"
#include "radixtier/status.hpp"
#include "shared/redis_connection.hpp"

namespace radixtier::shared::detail {

class SlotMap {
 public:
  static Result<SlotMap> parse(const SetupReply& reply, std::string_view asked_host);
  /// "host:port" of the slot's master, or null.
  const std::string* master_of(std::uint16_t slot) const {
    const auto i = owner_[slot];
    return i < 0 ? nullptr : &masters_[static_cast<std::size_t>(i)];
  }
  const std::vector<std::string>& masters() const { return masters_; }
  std::size_t assigned() const;
  /// A copy with each slot served by its address (what MOVED replies said; later pairs
  /// win); masters left without a slot are dropped.
  SlotMap with_owners(std::span<const std::pair<std::uint16_t, std::string>> moved) const;

 private:
  void compact();
  std::vector<std::string> masters_;
  std::array<std::int32_t, kClusterSlots> owner_{};
};

}  // namespace radixtier::shared::detail
