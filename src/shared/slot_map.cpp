#include "shared/slot_map.hpp"

#include <algorithm>
#include <unordered_map>

namespace radixtier::shared::detail {

namespace {

Status malformed(const std::string& what) {
  return Status{ErrorCode::kTransferFailed, "redis: malformed CLUSTER SLOTS " + what};
}

}  // namespace

Result<SlotMap> SlotMap::parse(const SetupReply& reply, std::string_view asked_host) {
  using T = SetupReply::Type;
  if (reply.type != T::kArray) {
    return Status{ErrorCode::kTransferFailed,
                  "redis: CLUSTER SLOTS reply is not an array: " + reply_to_string(reply)};
  }
  SlotMap map;
  map.owner_.fill(-1);
  std::unordered_map<std::string, std::int32_t> index_of;
  for (const SetupReply& range : reply.elements) {
    if (range.type != T::kArray || range.elements.size() < 3 ||
        range.elements[0].type != T::kInteger || range.elements[1].type != T::kInteger ||
        range.elements[2].type != T::kArray || range.elements[2].elements.size() < 2) {
      return malformed("range");
    }
    const long long first = range.elements[0].integer;
    const long long last = range.elements[1].integer;
    const SetupReply& node = range.elements[2];
    const SetupReply& host_reply = node.elements[0];
    const SetupReply& port_reply = node.elements[1];
    if (first < 0 || last >= kClusterSlots || first > last ||
        (host_reply.type != T::kBulk && host_reply.type != T::kNil) ||
        port_reply.type != T::kInteger || port_reply.integer <= 0 || port_reply.integer > 65535) {
      return malformed("node");
    }
    std::string host = host_reply.type == T::kBulk ? host_reply.text : std::string();
    // unknown-endpoint ("?", nil) or an empty host: the node that answered.
    if (host.empty() || host == "?") host = std::string(asked_host);
    const std::string address = host + ":" + std::to_string(port_reply.integer);
    auto [it, fresh] = index_of.emplace(address, static_cast<std::int32_t>(map.masters_.size()));
    if (fresh) map.masters_.push_back(address);
    for (long long s = first; s <= last; ++s) map.owner_[static_cast<std::size_t>(s)] = it->second;
  }
  map.compact();  // a later range may have taken every slot of an earlier master
  return map;
}

SlotMap SlotMap::with_owners(std::span<const std::pair<std::uint16_t, std::string>> moved) const {
  SlotMap copy = *this;
  std::unordered_map<std::string, std::int32_t> index_of;
  for (std::size_t i = 0; i < copy.masters_.size(); ++i) {
    index_of.emplace(copy.masters_[i], static_cast<std::int32_t>(i));
  }
  for (const auto& [slot, address] : moved) {
    if (slot >= kClusterSlots) continue;
    auto [it, fresh] = index_of.emplace(address, static_cast<std::int32_t>(copy.masters_.size()));
    if (fresh) copy.masters_.push_back(address);
    copy.owner_[slot] = it->second;
  }
  copy.compact();
  return copy;
}

void SlotMap::compact() {
  std::vector<std::int32_t> remap(masters_.size(), -1);
  for (std::int32_t o : owner_) {
    if (o >= 0) remap[static_cast<std::size_t>(o)] = 0;
  }
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    if (remap[i] < 0) continue;
    remap[i] = static_cast<std::int32_t>(kept.size());
    kept.push_back(std::move(masters_[i]));
  }
  for (std::int32_t& o : owner_) {
    if (o >= 0) o = remap[static_cast<std::size_t>(o)];
  }
  masters_ = std::move(kept);
}

std::size_t SlotMap::assigned() const {
  return static_cast<std::size_t>(
      std::count_if(owner_.begin(), owner_.end(), [](std::int32_t o) { return o >= 0; }));
}

}  // namespace radixtier::shared::detail
