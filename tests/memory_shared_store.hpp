// An in-memory SharedStore for the shared tier's unit tests (its logic: keys, values, fetch
// fallbacks, publishing); the tests against real Redis servers are in tests/shared/.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "radixtier/shared/shared_store.hpp"

namespace radixtier::testing {

class MemorySharedStore final : public shared::SharedStore {
 public:
  std::vector<shared::KeyState> exists(std::span<const std::string> keys,
                                       shared::Deadline) override {
    std::lock_guard lock(mu_);
    std::vector<shared::KeyState> out;
    for (const auto& k : keys) out.push_back(fail_ ? shared::KeyState::kFailed : state(k));
    return out;
  }
  std::vector<shared::GetReply> get(std::span<const std::string> keys, shared::Deadline) override {
    std::lock_guard lock(mu_);
    std::vector<shared::GetReply> out;
    for (const auto& k : keys) {
      shared::GetReply r;
      if (fail_) {
        r.state = shared::KeyState::kFailed;
      } else if (auto it = data_.find(k); it != data_.end()) {
        r.state = shared::KeyState::kFound;
        r.value = it->second;
      } else {
        r.state = shared::KeyState::kMissing;
      }
      out.push_back(std::move(r));
    }
    return out;
  }
  std::vector<shared::KeyState> set(std::span<const shared::SetItem> items,
                                    shared::Deadline) override {
    std::lock_guard lock(mu_);
    std::vector<shared::KeyState> out;
    for (const auto& it : items) {
      if (fail_) {
        out.push_back(shared::KeyState::kFailed);
        continue;
      }
      data_[std::string(it.key)] = std::string(it.value);
      ++sets_;
      out.push_back(shared::KeyState::kFound);
    }
    return out;
  }

  void fail(bool on) {
    std::lock_guard lock(mu_);
    fail_ = on;
  }
  std::map<std::string, std::string>& data() { return data_; }
  std::size_t sets() const { return sets_; }

 private:
  shared::KeyState state(const std::string& k) const {
    return data_.count(k) ? shared::KeyState::kFound : shared::KeyState::kMissing;
  }
  std::mutex mu_;
  std::map<std::string, std::string> data_;
  bool fail_ = false;
  std::size_t sets_ = 0;
};

}  // namespace radixtier::testing
