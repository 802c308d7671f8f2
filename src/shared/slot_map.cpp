#include "shared/slot_map.hpp"

#include <algorithm>

namespace radixtier::shared::detail {

Result<SlotMap> SlotMap::parse(const redisReply* reply, std::string_view asked_host) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    return Status{ErrorCode::kTransferFailed,
                  "redis: CLUSTER SLOTS reply is not an array: " + reply_to_string(reply)};
  }
  SlotMap map;
  map.owner_.fill(-1);
  for (std::size_t r = 0; r < reply->elements; ++r) {
    const redisReply* range = reply->element[r];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2) {
      return Status{ErrorCode::kTransferFailed, "redis: malformed CLUSTER SLOTS range"};
    }
    const long long first = range->element[0]->integer;
    const long long last = range->element[1]->integer;
    const redisReply* node = range->element[2];
    if (first < 0 || last >= kClusterSlots || first > last ||
        node->element[0]->type != REDIS_REPLY_STRING ||
        node->element[1]->type != REDIS_REPLY_INTEGER) {
      return Status{ErrorCode::kTransferFailed, "redis: malformed CLUSTER SLOTS node"};
    }
    std::string host(node->element[0]->str, node->element[0]->len);
    if (host.empty() || host == "?") host = std::string(asked_host);
    const std::string address = host + ":" + std::to_string(node->element[1]->integer);
    auto it = std::find(map.masters_.begin(), map.masters_.end(), address);
    const auto index = static_cast<std::int16_t>(it - map.masters_.begin());
    if (it == map.masters_.end()) map.masters_.push_back(address);
    for (long long s = first; s <= last; ++s) map.owner_[static_cast<std::size_t>(s)] = index;
  }
  return map;
}

SlotMap SlotMap::with_owner(std::uint16_t slot, const std::string& address) const {
  SlotMap copy = *this;
  auto it = std::find(copy.masters_.begin(), copy.masters_.end(), address);
  const auto index = static_cast<std::int16_t>(it - copy.masters_.begin());
  if (it == copy.masters_.end()) copy.masters_.push_back(address);
  copy.owner_[slot] = index;
  return copy;
}

std::size_t SlotMap::assigned() const {
  return static_cast<std::size_t>(
      std::count_if(owner_.begin(), owner_.end(), [](std::int16_t o) { return o >= 0; }));
}

}  // namespace radixtier::shared::detail
