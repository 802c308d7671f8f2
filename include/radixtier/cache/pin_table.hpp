// PinTable: the host pins' part of PrefixCache (PrefixCache::pin). It owns each pin's
// record (the node at the end of the pinned prefix and its namespace root), the pin ids and
// the count of host pages the pins hold, which the budget (CacheConfig::host_pin_share)
// charges.
//
// Invariants (PrefixCache::check_invariants() checks them with the nodes): the counts a pin
// adds to its prefix (host_pin on every node, snap_pin at its end) are exactly the live pins';
// pinned_pages() is the pages of every pinned node and pinned snapshot, each counted once,
// and never above the budget.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "radixtier/cache/node.hpp"
#include "radixtier/cache/request_table.hpp"

namespace radixtier {

struct PinRecord {
  Node* node;  ///< the node at the end of the pinned prefix
  Node* root;  ///< the root of its namespace
};

class PinTable {
 public:
  using Map = std::unordered_map<std::uint32_t, PinRecord>;

  PinId add(const PinRecord& rec) {
    const PinId id(next_free_id(next_, pins_));
    pins_.emplace(id.value(), rec);
    return id;
  }
  /// nullptr: no such pin.
  const PinRecord* find(PinId id) const {
    auto it = pins_.find(id.value());
    return it == pins_.end() ? nullptr : &it->second;
  }
  void erase(PinId id) { pins_.erase(id.value()); }
  std::size_t size() const { return pins_.size(); }
  Map::const_iterator begin() const { return pins_.begin(); }
  Map::const_iterator end() const { return pins_.end(); }

  /// Host pool pages held by pinned KV and pinned snapshots (each node counted once).
  std::size_t pinned_pages = 0;

 private:
  Map pins_;
  std::uint32_t next_ = 0;
};

}  // namespace radixtier
