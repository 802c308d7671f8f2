#include "radixtier/shared/shared_store.hpp"

namespace radixtier::shared {

const char* to_string(KeyState state) {
  switch (state) {
    case KeyState::kFound:
      return "found";
    case KeyState::kMissing:
      return "missing";
    case KeyState::kFailed:
      return "failed";
  }
  return "unknown";
}

void SharedStore::get_into(std::span<const std::string> keys, Deadline deadline,
                           std::vector<GetReply>& replies) {
  std::vector<GetReply> got = get(keys, deadline);
  replies.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i < got.size()) {
      replies[i].state = got[i].state;
      replies[i].value = std::move(got[i].value);
    } else {
      replies[i].state = KeyState::kFailed;  // an engine that answered short: a miss
    }
    if (replies[i].state != KeyState::kFound) replies[i].value.clear();
  }
}

void SharedStore::get_into(std::span<const std::string> keys, Deadline deadline,
                           std::vector<GetReply>& replies, const GetBounds& bounds) {
  get_into(keys, deadline, replies);
  for (GetReply& r : replies) {
    if (r.state == KeyState::kFound && r.value.size() > bounds.max_value_bytes) {
      r.state = KeyState::kFailed;
      r.value.clear();
    }
  }
}

}  // namespace radixtier::shared
