// RedisCluster on a real 3-master LocalCluster: round trips, live reshard (ASK, MOVED),
// maxmemory (OOM, eviction), AUTH. Every value check compares real bytes.
#include "radixtier/shared/redis_cluster.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "shared_test_util.hpp"

namespace radixtier::shared {
namespace {

using namespace testing;

TEST(RedisCluster, PipelinedRoundTripOfBinaryValuesAcrossAllShards) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto config = config_for(*cluster);
  config.max_inflight_bytes = 6u << 20;  // several rounds for the big values
  auto client = connect_client(config);
  ASSERT_TRUE(client);

  const std::size_t sizes[] = {1, 2, 7, 100, 4095, 4096, 4097, 65536, 1u << 20, 4u << 20};
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::set<std::size_t> masters_hit;
  for (std::size_t i = 0; i < 300; ++i) {
    const std::size_t size = i < 280 ? sizes[i % 7] : sizes[7 + i % 3];
    keys.push_back("rt:" + std::to_string(i));
    values.push_back(binary_value(size, i));
    masters_hit.insert(layout_master(key_slot(keys.back()), 3));
  }
  keys.push_back(std::string("rt:bin\0key", 10));  // a key with a zero byte
  values.push_back(std::string("\0\0\0", 3));
  EXPECT_EQ(masters_hit.size(), 3u);

  std::vector<SetItem> items;
  for (std::size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], values[i]});
  const auto set_states = client->set(items, in(20s));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(set_states[i], KeyState::kFound) << keys[i];
  }

  std::vector<std::string> probe = keys;
  probe.push_back("rt:absent:1");
  probe.push_back("rt:absent:2");
  const auto exist = client->exists(probe, in(5s));
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(exist[i], KeyState::kFound) << i;
  EXPECT_EQ(exist[keys.size()], KeyState::kMissing);
  EXPECT_EQ(exist[keys.size() + 1], KeyState::kMissing);
  // The same on the publish connections (a publisher's check before it writes: every key
  // came back failed, so nothing was ever skipped and no published prefix was extended).
  const auto before_write = client->exists_before_write(probe, in(5s));
  EXPECT_EQ(before_write, exist);
  EXPECT_EQ(client->stats().internal_errors, 0u);

  const auto got = client->get(probe, in(20s), 1u << 20);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i].state, KeyState::kFound) << keys[i];
    ASSERT_EQ(got[i].value.size(), values[i].size()) << keys[i];
    ASSERT_TRUE(got[i].value == values[i]) << keys[i];
  }
  EXPECT_EQ(got[keys.size()].state, KeyState::kMissing);
  EXPECT_TRUE(got[keys.size()].value.empty());

  // The config's expected size (1 MiB) for a get without hint gives the same bytes.
  const std::vector<std::string> big = {keys[280], keys[281], keys[282]};
  const auto again = client->get(big, in(10s));
  for (std::size_t i = 0; i < big.size(); ++i) {
    ASSERT_EQ(again[i].state, KeyState::kFound);
    EXPECT_TRUE(again[i].value == values[280 + i]);
  }

  const auto stats = client->stats();
  EXPECT_EQ(stats.calls, 5u);  // set, exists, exists_before_write, get, get
  EXPECT_EQ(stats.keys_failed, 0u);
  EXPECT_EQ(stats.timeouts, 0u);
  EXPECT_GT(stats.bytes_read, 3u * (4u << 20));
  EXPECT_GT(stats.bytes_written, 3u * (4u << 20));
  const auto shards = client->shards();
  ASSERT_EQ(shards.size(), 3u);
  for (const auto& s : shards) {
    EXPECT_EQ(s.breaker, BreakerStateView::kClosed);
    EXPECT_TRUE(s.in_slot_map);
  }
}

TEST(RedisCluster, LiveReshardFollowsAskThenMoved) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);

  const std::uint16_t slot = key_slot("{reshard}");
  const std::size_t from = layout_master(slot, 3);
  const std::size_t to = (from + 1) % 3;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < 20; ++i) {
    keys.push_back("{reshard}k" + std::to_string(i));
    values.push_back(binary_value(1000 + i * 4099, 100 + i));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], values[i]});
  for (auto s : client->set(items, in(5s))) ASSERT_EQ(s, KeyState::kFound);

  auto check_all = [&](const char* when) {
    const auto got = client->get(keys, in(5s));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(got[i].state, KeyState::kFound) << when << " " << keys[i];
      ASSERT_TRUE(got[i].value == values[i]) << when << " " << keys[i];
    }
    const auto exist = client->exists(keys, in(5s));
    for (auto s : exist) ASSERT_EQ(s, KeyState::kFound) << when;
  };

  ASSERT_TRUE(cluster->migrate_slot_begin(slot, from, to, 10));
  check_all("mid-migration");
  EXPECT_GT(client->stats().ask, 0u);
  EXPECT_EQ(client->stats().moved, 0u);
  // A write mid-migration lands where a read finds it.
  const std::string late_key = "{reshard}late";
  const std::string late_value = binary_value(5000, 7);
  ASSERT_EQ(client->set(std::vector<SetItem>{{late_key, late_value}}, in(5s))[0], KeyState::kFound);

  ASSERT_TRUE(cluster->migrate_slot_finish(slot, from, to));
  auto owner = cluster->master_index_of_slot(slot);
  ASSERT_TRUE(owner.is_ok()) << owner.status().to_string();
  EXPECT_EQ(*owner, to);
  check_all("after migration");
  EXPECT_GT(client->stats().moved, 0u);
  const auto late = client->get(std::vector<std::string>{late_key}, in(5s));
  ASSERT_EQ(late[0].state, KeyState::kFound);
  EXPECT_TRUE(late[0].value == late_value);
  // The map was refreshed: no more redirects.
  const auto moved = client->stats().moved;
  const auto asked = client->stats().ask;
  check_all("after refresh");
  EXPECT_EQ(client->stats().moved, moved);
  EXPECT_EQ(client->stats().ask, asked);
  EXPECT_EQ(client->stats().breaker_opens, 0u);
}

TEST(RedisCluster, MaxMemoryFailsOrEvictsNeverAWrongValue) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto client = connect_client(config_for(*cluster));
  ASSERT_TRUE(client);
  // Master 0 refuses every write (OOM: nothing left to evict below 1 byte); master 1 evicts.
  ASSERT_TRUE(cluster->set_maxmemory(0, 1));
  ASSERT_TRUE(cluster->set_maxmemory(1, 4u << 20));

  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < 120; ++i) {
    keys.push_back("mm:" + std::to_string(i));
    values.push_back(binary_value(256 * 1024, 1000 + i));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], values[i]});
  const auto set_states = client->set(items, in(20s));
  std::size_t refused = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::size_t m = layout_master(key_slot(keys[i]), 3);
    if (m == 0) {
      EXPECT_EQ(set_states[i], KeyState::kFailed) << keys[i];
      ++refused;
    } else if (m == 2) {
      EXPECT_EQ(set_states[i], KeyState::kFound) << keys[i];
    }
  }
  EXPECT_GT(refused, 0u);

  const auto got = client->get(keys, in(20s));
  std::size_t missing = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::size_t m = layout_master(key_slot(keys[i]), 3);
    if (got[i].state == KeyState::kFound) {
      ASSERT_TRUE(got[i].value == values[i]) << keys[i];
    } else {
      EXPECT_EQ(got[i].state, KeyState::kMissing) << keys[i];
      ++missing;
      EXPECT_NE(m, 2u) << keys[i];
    }
  }
  EXPECT_GT(missing, refused);  // master 1 evicted some
  const auto stats = client->stats();
  EXPECT_EQ(stats.breaker_opens, 0u);  // OOM is an answer, not a shard failure
  EXPECT_EQ(stats.timeouts, 0u);
  for (const auto& s : client->shards()) EXPECT_EQ(s.breaker, BreakerStateView::kClosed);
}

TEST(RedisCluster, AuthWithTheRightPasswordOnlyAndNeverPrintsIt) {
  const std::string password = "s3cret-Pw-42";
  LocalClusterOptions options;
  options.password = password;
  auto cluster = start_cluster(3, 0, options);
  ASSERT_TRUE(cluster);

  auto config = config_for(*cluster);
  config.password = password;
  EXPECT_EQ(config.describe().find(password), std::string::npos);
  auto client = connect_client(config);
  ASSERT_TRUE(client);
  EXPECT_EQ(client->describe().find(password), std::string::npos);
  std::vector<std::string> keys;
  for (int i = 0; i < 30; ++i) keys.push_back("auth:" + std::to_string(i));
  std::vector<std::string> values;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(binary_value(300 + i, i));
  for (std::size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], values[i]});
  for (auto s : client->set(items, in(5s))) EXPECT_EQ(s, KeyState::kFound);
  const auto got = client->get(keys, in(5s));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i].state, KeyState::kFound);
    EXPECT_TRUE(got[i].value == values[i]);
  }

  // A stopped master: fresh probe connections send AUTH in their pipelines, so the stopped
  // shard (not answering AUTH) holds back only its own keys, within the deadline.
  ASSERT_TRUE(cluster->stop(0));
  for (int call = 0; call < 2; ++call) {
    const auto start = Clock::now();
    const auto states = client->exists(keys, start + 100ms);
    EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start), 130ms);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const bool stopped = layout_master(key_slot(keys[i]), 3) == 0;
      EXPECT_EQ(states[i], stopped ? KeyState::kFailed : KeyState::kFound) << keys[i];
    }
  }
  ASSERT_TRUE(cluster->cont(0));

  const std::string wrong = "wrong-Pw-77";
  auto bad_config = config_for(*cluster);
  bad_config.password = wrong;
  auto bad = RedisCluster::connect(bad_config);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().to_string().find(wrong), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(bad.status().to_string().find(password), std::string::npos);
  EXPECT_EQ(bad_config.describe().find(wrong), std::string::npos);
  EXPECT_NE(bad_config.describe().find("***"), std::string::npos);

  auto none = RedisCluster::connect(config_for(*cluster));  // no password at all
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().to_string().find(password), std::string::npos);
}

TEST(RedisCluster, ConcurrentCallsFromManyThreadsGetTheirOwnBytes) {
  auto cluster = start_cluster(3, 0);
  ASSERT_TRUE(cluster);
  auto config = config_for(*cluster);
  config.max_inflight_bytes = 256 * 1024;  // many windows per call
  auto client = connect_client(config);
  ASSERT_TRUE(client);
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> keys;
      std::vector<std::string> values;
      std::vector<SetItem> items;
      for (int i = 0; i < 40; ++i) {
        keys.push_back("mt:" + std::to_string(t) + ":" + std::to_string(i));
        values.push_back(binary_value(1 + (i * 7919 + t * 31) % 100000, t * 1000 + i));
      }
      for (int i = 0; i < 40; ++i) items.push_back({keys[i], values[i]});
      for (int round = 0; round < 10; ++round) {
        for (auto s : client->set(items, in(5s))) failed += s != KeyState::kFound;
        for (auto s : client->exists(keys, in(5s))) failed += s != KeyState::kFound;
        const auto got = client->get(keys, in(5s), 50000);
        for (int i = 0; i < 40; ++i) {
          failed += got[i].state != KeyState::kFound;
          wrong += got[i].state == KeyState::kFound && got[i].value != values[i];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(client->stats().keys_failed, 0u);
}

TEST(RedisCluster, ConfigValidation) {
  RedisClusterConfig config;
  EXPECT_FALSE(config.validate());
  config.seeds = {"127.0.0.1:7000"};
  EXPECT_TRUE(config.validate());
  config.seeds = {"nohost"};
  EXPECT_FALSE(config.validate());
  config.seeds = {"127.0.0.1:70000"};
  EXPECT_FALSE(config.validate());
  config.seeds = {"127.0.0.1:7000"};
  config.breaker_failures = 0;
  EXPECT_FALSE(config.validate());
  config.breaker_failures = 1;
  config.max_inflight_bytes = 0;
  EXPECT_FALSE(config.validate());
  config.max_inflight_bytes = 1;
  config.user = "alice";
  EXPECT_FALSE(config.validate());  // a user without a password
  // No node listens: connect fails cleanly.
  config.user.clear();
  config.seeds = {"127.0.0.1:1"};
  EXPECT_FALSE(RedisCluster::connect(config).is_ok());
}

}  // namespace
}  // namespace radixtier::shared
