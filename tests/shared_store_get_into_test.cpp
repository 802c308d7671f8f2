// SharedStore::get_into's default (an engine that implements get() only): the replies follow
// get()'s answers key by key, the vector takes the call's length, a value that is not kFound
// is empty, and an engine answering short leaves the rest kFailed.
#include <gtest/gtest.h>

#include "memory_shared_store.hpp"

namespace radixtier::shared {
namespace {

using radixtier::testing::MemorySharedStore;

// Answers the first `answered` keys only (a misbehaving engine).
class ShortStore final : public SharedStore {
 public:
  explicit ShortStore(std::size_t answered) : answered_(answered) {}
  std::vector<KeyState> exists(std::span<const std::string> keys, Deadline) override {
    return std::vector<KeyState>(keys.size(), KeyState::kFailed);
  }
  std::vector<GetReply> get(std::span<const std::string> keys, Deadline) override {
    std::vector<GetReply> out;
    for (std::size_t i = 0; i < std::min(answered_, keys.size()); ++i) {
      out.push_back(GetReply{KeyState::kFound, std::string(1, 'v')});
    }
    return out;
  }
  std::vector<KeyState> set(std::span<const SetItem> items, Deadline) override {
    return std::vector<KeyState>(items.size(), KeyState::kFailed);
  }

 private:
  std::size_t answered_;
};

TEST(SharedStoreGetInto, DefaultFollowsGetKeyByKey) {
  MemorySharedStore store;
  store.data()["a"] = "alpha";
  store.data()["b"] = std::string(5000, 'b');
  const std::vector<std::string> keys = {"a", "missing", "b"};
  std::vector<GetReply> replies(5);
  replies[1].value = "stale";
  replies[4].value = "beyond";
  store.get_into(keys, Clock::now() + std::chrono::seconds(1), replies);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0].state, KeyState::kFound);
  EXPECT_EQ(replies[0].value, "alpha");
  EXPECT_EQ(replies[1].state, KeyState::kMissing);
  EXPECT_TRUE(replies[1].value.empty());
  EXPECT_EQ(replies[2].state, KeyState::kFound);
  EXPECT_EQ(replies[2].value, std::string(5000, 'b'));

  store.fail(true);
  store.get_into(keys, Clock::now() + std::chrono::seconds(1), replies);
  for (const auto& r : replies) {
    EXPECT_EQ(r.state, KeyState::kFailed);
    EXPECT_TRUE(r.value.empty());
  }
}

TEST(SharedStoreGetInto, DefaultFailsWhatAnEngineLeftUnanswered) {
  ShortStore store(1);
  const std::vector<std::string> keys = {"x", "y", "z"};
  std::vector<GetReply> replies(3);
  replies[2].value = "stale";
  store.get_into(keys, Clock::now() + std::chrono::seconds(1), replies);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0].state, KeyState::kFound);
  EXPECT_EQ(replies[0].value, "v");
  EXPECT_EQ(replies[1].state, KeyState::kFailed);
  EXPECT_EQ(replies[2].state, KeyState::kFailed);
  EXPECT_TRUE(replies[2].value.empty());
}

}  // namespace
}  // namespace radixtier::shared
