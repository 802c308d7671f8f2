// Helpers of the shared-tier tests: a real LocalCluster, a client on it, binary values.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "radixtier/shared/key_slot.hpp"
#include "radixtier/shared/redis_cluster.hpp"
#include "shared/local_cluster.hpp"

namespace radixtier::shared::testing {

using namespace std::chrono_literals;

/// `size` bytes from `seed`, zero bytes included (every 7th byte is 0).
inline std::string binary_value(std::size_t size, std::uint64_t seed) {
  std::string v(size, '\0');
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = (i % 7 == 3) ? '\0' : static_cast<char>(x);
  }
  return v;
}

/// The master of `slot` in LocalCluster's initial layout (equal shares).
inline std::size_t layout_master(std::uint16_t slot, std::size_t masters) {
  std::size_t m = 0;
  while (m + 1 < masters && (m + 1) * kClusterSlots / masters <= slot) ++m;
  return m;
}

inline Deadline in(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

inline std::unique_ptr<LocalCluster> start_cluster(std::size_t masters, std::size_t replicas,
                                                   LocalClusterOptions options = {}) {
  auto cluster = LocalCluster::start(masters, replicas, std::move(options));
  EXPECT_TRUE(cluster.is_ok()) << cluster.status().to_string();
  if (!cluster) return nullptr;
  return std::move(cluster).value();
}

inline RedisClusterConfig config_for(const LocalCluster& cluster) {
  RedisClusterConfig config;
  config.seeds = cluster.seeds();
  config.connect_timeout = 300ms;
  config.breaker_failures = 3;
  config.breaker_cooldown = 300ms;
  config.slot_refresh_interval = 50ms;
  return config;
}

inline std::unique_ptr<RedisCluster> connect_client(const RedisClusterConfig& config) {
  auto client = RedisCluster::connect(config);
  EXPECT_TRUE(client.is_ok()) << client.status().to_string();
  if (!client) return nullptr;
  return std::move(client).value();
}

}  // namespace radixtier::shared::testing
