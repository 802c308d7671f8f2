// RedisCluster under real faults of a LocalCluster: kill -9 of a master (with and without a
// replica to fail over to), SIGSTOP (deadlines, breaker), CLIENT PAUSE.
#include <gtest/gtest.h>

#include <thread>

#include "radixtier/shared/redis_cluster.hpp"
#include "shared_test_util.hpp"

namespace radixtier::shared {
namespace {

using namespace testing;

struct Dataset {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::vector<std::size_t> master;  // layout master of each key
};

Dataset write_dataset(RedisCluster& client, const std::string& prefix, std::size_t n,
                      std::size_t masters) {
  Dataset d;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < n; ++i) {
    d.keys.push_back(prefix + std::to_string(i));
    d.values.push_back(binary_value(100 + (i * 977) % 20000, i + 31));
    d.master.push_back(layout_master(key_slot(d.keys.back()), masters));
  }
  for (std::size_t i = 0; i < n; ++i) items.push_back({d.keys[i], d.values[i]});
  const auto states = client.set(items, in(10s));
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(states[i], KeyState::kFound) << d.keys[i];
  return d;
}

std::chrono::milliseconds elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since);
}

TEST(RedisClusterFaults, KilledMasterWithoutReplicaFailsOnlyItsKeysByTheDeadline) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  const Dataset d = write_dataset(*client, "k9:", 120, 3);
  ASSERT_TRUE(cluster->kill9(1));
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    const auto got = client->get(d.keys, start + 200ms);
    EXPECT_LT(elapsed_ms(start), 200ms + 30ms);
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      if (d.master[i] == 1) {
        EXPECT_EQ(got[i].state, KeyState::kFailed) << d.keys[i];
      } else {
        ASSERT_EQ(got[i].state, KeyState::kFound) << d.keys[i];
        ASSERT_TRUE(got[i].value == d.values[i]) << d.keys[i];
      }
    }
  }
  const auto stats = client->stats();
  EXPECT_GE(stats.breaker_opens, 1u);
  EXPECT_GE(stats.connect_errors, 3u);
}

TEST(RedisClusterFaults, FailoverToAReplicaIsFollowed) {
  auto cluster = start_cluster(3, 1);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  const Dataset d = write_dataset(*client, "fo:", 90, 3);
  // The replica of master 0 holds every key of master 0 before the kill.
  const std::size_t replica = cluster->replica_index(0);
  for (int tries = 0;; ++tries) {
    auto master_keys = cluster->command(0, {"DBSIZE"});
    auto replica_keys = cluster->command(replica, {"DBSIZE"});
    ASSERT_TRUE(master_keys.is_ok() && replica_keys.is_ok());
    if (*master_keys == *replica_keys) break;
    ASSERT_LT(tries, 100) << "replica did not catch up";
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(cluster->kill9(0));
  // While the cluster notices: keys of master 0 fail, the others keep working.
  const auto during = client->get(d.keys, in(200ms));
  for (std::size_t i = 0; i < d.keys.size(); ++i) {
    if (d.master[i] != 0) {
      ASSERT_TRUE(during[i].value == d.values[i]) << d.keys[i];
    }
  }
  ASSERT_TRUE(cluster->wait_for_failover(0, 20s));
  auto owner = cluster->master_index_of_slot(0);
  ASSERT_TRUE(owner.is_ok());
  EXPECT_EQ(*owner, replica);

  bool all = false;
  const auto until = Clock::now() + 10s;
  while (!all && Clock::now() < until) {
    const auto got = client->get(d.keys, in(500ms));
    all = true;
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      if (got[i].state == KeyState::kFound) {
        ASSERT_TRUE(got[i].value == d.values[i]) << d.keys[i];
      } else {
        all = false;
      }
    }
    if (!all) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(all) << "the client did not follow the failover";
  EXPECT_GE(client->stats().slot_map_refreshes, 2u);
  // Writes go to the new master too.
  const std::string v = binary_value(777, 9);
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < d.keys.size(); ++i) items.push_back({d.keys[i], v});
  for (auto s : client->set(items, in(5s))) EXPECT_EQ(s, KeyState::kFound);
}

TEST(RedisClusterFaults, StoppedMasterKeepsDeadlinesThenBreakerOpensAndCloses) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto config = config_for(*cluster);
  config.breaker_failures = 3;
  config.breaker_cooldown = 400ms;
  auto client = connect_client(config);
  ASSERT_TRUE(client);
  const Dataset d = write_dataset(*client, "st:", 120, 3);
  const std::size_t stopped = 2;
  ASSERT_TRUE(cluster->stop(stopped));

  // Timeouts until the breaker opens: every call returns by its deadline (+30 ms).
  for (int call = 0; call < 3; ++call) {
    const auto start = Clock::now();
    const auto got = client->get(d.keys, start + 50ms);
    EXPECT_LT(elapsed_ms(start), 80ms) << "call " << call;
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      if (d.master[i] == stopped) {
        EXPECT_EQ(got[i].state, KeyState::kFailed);
      } else {
        ASSERT_EQ(got[i].state, KeyState::kFound) << d.keys[i];
        ASSERT_TRUE(got[i].value == d.values[i]);
      }
    }
  }
  auto stats = client->stats();
  EXPECT_GE(stats.timeouts, 3u);
  EXPECT_EQ(stats.breaker_opens, 1u);
  std::size_t open = 0;
  for (const auto& s : client->shards()) open += s.breaker == BreakerStateView::kOpen;
  EXPECT_EQ(open, 1u);

  // Open: the stopped shard's keys fail at once (no I/O to it), well before the deadline.
  {
    const auto start = Clock::now();
    const auto states = client->exists(d.keys, start + 2s);
    EXPECT_LT(elapsed_ms(start), 100ms);
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      EXPECT_EQ(states[i], d.master[i] == stopped ? KeyState::kFailed : KeyState::kFound);
    }
  }
  // Still stopped after the cooldown: the half-open trial fails and reopens it.
  std::this_thread::sleep_for(450ms);
  {
    const auto start = Clock::now();
    (void)client->exists(d.keys, start + 50ms);
    EXPECT_LT(elapsed_ms(start), 80ms);
  }
  EXPECT_EQ(client->stats().breaker_opens, 2u);

  ASSERT_TRUE(cluster->cont(stopped));
  std::this_thread::sleep_for(450ms);
  const auto got = client->get(d.keys, in(2s));
  for (std::size_t i = 0; i < d.keys.size(); ++i) {
    ASSERT_EQ(got[i].state, KeyState::kFound) << d.keys[i];
    ASSERT_TRUE(got[i].value == d.values[i]);
  }
  stats = client->stats();
  EXPECT_EQ(stats.breaker_closes, 1u);
  EXPECT_GE(stats.reconnects, 1u);  // the timed-out connections were closed
  for (const auto& s : client->shards()) EXPECT_EQ(s.breaker, BreakerStateView::kClosed);
}

TEST(RedisClusterFaults, ClientPauseTimesOutCleanlyThenRecovers) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  const Dataset d = write_dataset(*client, "cp:", 90, 3);
  ASSERT_TRUE(cluster->client_pause(1, 1000ms));
  const auto pause_end = Clock::now() + 1000ms;
  for (int call = 0; call < 2; ++call) {
    const auto start = Clock::now();
    const auto got = client->get(d.keys, start + 100ms);
    EXPECT_LT(elapsed_ms(start), 130ms);
    for (std::size_t i = 0; i < d.keys.size(); ++i) {
      if (d.master[i] == 1) {
        EXPECT_EQ(got[i].state, KeyState::kFailed);
      } else {
        ASSERT_TRUE(got[i].value == d.values[i]) << d.keys[i];
      }
    }
  }
  EXPECT_GE(client->stats().timeouts, 2u);
  std::this_thread::sleep_until(pause_end + 400ms);  // the pause and a breaker cooldown
  const auto got = client->get(d.keys, in(2s));
  for (std::size_t i = 0; i < d.keys.size(); ++i) {
    ASSERT_EQ(got[i].state, KeyState::kFound) << d.keys[i];
    ASSERT_TRUE(got[i].value == d.values[i]);
  }
}

}  // namespace
}  // namespace radixtier::shared
