// RedisCluster::get_into on a real 3-master LocalCluster: values are received into the
// caller's strings, whose memory is reused across calls (same data pointer for a value of the
// same or a smaller size), with the right bytes when a value shrinks or grows, a missing key
// (cleared, kMissing), a dead shard (its keys kFailed and cleared, the others intact) and a
// call cut by its deadline (nothing written after it returns; the next call is right).
#include <gtest/gtest.h>

#include <thread>

#include "radixtier/shared/redis_cluster.hpp"
#include "shared_test_util.hpp"

namespace radixtier::shared {
namespace {

using namespace testing;

struct Keys {
  std::vector<std::string> names;
  std::vector<std::string> values;
  std::vector<std::size_t> master;
};

// Two keys per master, values of `sizes` (cycled).
Keys keys_on_every_master(const std::string& prefix, std::span<const std::size_t> sizes) {
  Keys k;
  std::vector<std::size_t> per_master(3, 0);
  for (std::size_t i = 0; k.names.size() < 6; ++i) {
    std::string name = prefix + std::to_string(i);
    const std::size_t m = layout_master(key_slot(name), 3);
    if (per_master[m] == 2) continue;
    ++per_master[m];
    k.values.push_back(binary_value(sizes[k.names.size() % sizes.size()], i + 7));
    k.names.push_back(std::move(name));
    k.master.push_back(m);
  }
  return k;
}

void set_all(RedisCluster& client, const Keys& k) {
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < k.names.size(); ++i) items.push_back({k.names[i], k.values[i]});
  const auto states = client.set(items, in(20s));
  for (std::size_t i = 0; i < states.size(); ++i) ASSERT_EQ(states[i], KeyState::kFound) << i;
}

std::vector<const char*> data_pointers(const std::vector<GetReply>& replies) {
  std::vector<const char*> out;
  for (const auto& r : replies) out.push_back(r.value.data());
  return out;
}

TEST(RedisClusterGetInto, ReusesTheCallersBuffersWithTheRightBytes) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  const std::size_t sizes[] = {4u << 20, 100, 1u << 20};
  Keys k = keys_on_every_master("gi:", sizes);
  set_all(*client, k);

  std::vector<GetReply> replies;
  client->get_into(k.names, in(20s), replies);
  ASSERT_EQ(replies.size(), k.names.size());
  for (std::size_t i = 0; i < k.names.size(); ++i) {
    ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
    ASSERT_TRUE(replies[i].value == k.values[i]) << i;
  }

  // The same values again: every string keeps its memory.
  const auto first = data_pointers(replies);
  for (auto& r : replies) r.value[0] ^= 0x5a;  // stale bytes must be overwritten
  client->get_into(k.names, in(20s), replies);
  for (std::size_t i = 0; i < k.names.size(); ++i) {
    ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
    EXPECT_EQ(replies[i].value.data(), first[i]) << i;
    ASSERT_TRUE(replies[i].value == k.values[i]) << i;
  }

  // A 4 MiB value shrinks to 1000 bytes (same memory), a 100-byte one grows to 2 MiB.
  ASSERT_EQ(k.values[0].size(), 4u << 20);
  ASSERT_EQ(k.values[1].size(), 100u);
  k.values[0] = binary_value(1000, 901);
  k.values[1] = binary_value(2u << 20, 902);
  set_all(*client, k);
  client->get_into(k.names, in(20s), replies);
  for (std::size_t i = 0; i < k.names.size(); ++i) {
    ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
    ASSERT_EQ(replies[i].value.size(), k.values[i].size()) << i;
    ASSERT_TRUE(replies[i].value == k.values[i]) << i;
    if (i != 1) {
      EXPECT_EQ(replies[i].value.data(), first[i]) << i;
    }
  }
  EXPECT_GE(replies[0].value.capacity(), 4u << 20);  // never shrunk

  // A missing key where a value was: kMissing, cleared, its memory kept.
  std::vector<std::string> with_absent = k.names;
  with_absent[2] = "gi:absent";
  const std::size_t capacity2 = replies[2].value.capacity();
  client->get_into(with_absent, in(20s), replies);
  EXPECT_EQ(replies[2].state, KeyState::kMissing);
  EXPECT_TRUE(replies[2].value.empty());
  EXPECT_EQ(replies[2].value.capacity(), capacity2);
  for (std::size_t i = 0; i < k.names.size(); ++i) {
    if (i == 2) continue;
    ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
    ASSERT_TRUE(replies[i].value == k.values[i]) << i;
  }

  // Fewer keys: the vector follows the call's length; get() gives the same answers.
  const std::vector<std::string> two = {k.names[4], k.names[5]};
  client->get_into(two, in(20s), replies);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_TRUE(replies[0].value == k.values[4]);
  EXPECT_TRUE(replies[1].value == k.values[5]);
  const auto fresh = client->get(two, in(20s));
  ASSERT_EQ(fresh.size(), 2u);
  EXPECT_TRUE(fresh[0].value == k.values[4]);
  EXPECT_TRUE(fresh[1].value == k.values[5]);
}

TEST(RedisClusterGetInto, ADeadShardFailsAndClearsOnlyItsKeys) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  const std::size_t sizes[] = {1u << 20, 5000};
  const Keys k = keys_on_every_master("gd:", sizes);
  set_all(*client, k);
  std::vector<GetReply> replies;
  client->get_into(k.names, in(20s), replies);
  const auto before = data_pointers(replies);

  ASSERT_TRUE(cluster->kill9(1));
  for (int round = 0; round < 3; ++round) {
    const auto start = Clock::now();
    client->get_into(k.names, start + 300ms, replies);
    EXPECT_LT(Clock::now() - start, 300ms + 50ms);
    ASSERT_EQ(replies.size(), k.names.size());
    for (std::size_t i = 0; i < k.names.size(); ++i) {
      if (k.master[i] == 1) {
        EXPECT_EQ(replies[i].state, KeyState::kFailed) << i;
        EXPECT_TRUE(replies[i].value.empty()) << i;
      } else {
        ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
        EXPECT_EQ(replies[i].value.data(), before[i]) << i;
        ASSERT_TRUE(replies[i].value == k.values[i]) << i;
      }
    }
  }
}

TEST(RedisClusterGetInto, ACallCutByItsDeadlineWritesNothingAfterItReturns) {
  auto cluster = start_cluster(1, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  std::vector<std::string> names;
  std::vector<std::string> values;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < 8; ++i) {
    names.push_back("gt:" + std::to_string(i));
    values.push_back(binary_value(8u << 20, i + 3));
  }
  for (std::size_t i = 0; i < names.size(); ++i) items.push_back({names[i], values[i]});
  for (auto s : client->set(items, in(30s))) ASSERT_EQ(s, KeyState::kFound);

  std::vector<GetReply> replies;
  for (int round = 0; round < 5; ++round) {
    // 64 MiB by 2 ms: cut, most likely in the middle of a value.
    client->get_into(names, in(2ms), replies);
    std::vector<std::string> snapshot;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (replies[i].state == KeyState::kFound) {
        ASSERT_TRUE(replies[i].value == values[i]) << i;
      } else {
        EXPECT_EQ(replies[i].state, KeyState::kFailed) << i;
        EXPECT_TRUE(replies[i].value.empty()) << i;
      }
      snapshot.push_back(replies[i].value);
    }
    std::this_thread::sleep_for(50ms);  // a late reply would land now
    for (std::size_t i = 0; i < names.size(); ++i) {
      EXPECT_TRUE(replies[i].value == snapshot[i]) << "written after the call returned: " << i;
    }
    // The next call on the same buffers matches no late reply.
    client->get_into(names, in(30s), replies);
    for (std::size_t i = 0; i < names.size(); ++i) {
      ASSERT_EQ(replies[i].state, KeyState::kFound) << i;
      ASSERT_TRUE(replies[i].value == values[i]) << i;
    }
  }
  EXPECT_GE(client->stats().timeouts, 1u);
}

}  // namespace
}  // namespace radixtier::shared
