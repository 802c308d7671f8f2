#include "radixtier/shared/redis_cluster_config.hpp"

#include <string>

#include "shared/endpoint.hpp"

namespace radixtier::shared {

Status RedisClusterConfig::validate() const {
  if (seeds.empty()) return invalid_argument("redis cluster: seeds is empty");
  for (const auto& seed : seeds) {
    auto ep = detail::parse_endpoint(seed);
    if (!ep) return ep.status();
  }
  if (!user.empty() && password.empty()) {
    return invalid_argument("redis cluster: user is set without a password");
  }
  if (connect_timeout.count() <= 0) {
    return invalid_argument("redis cluster: connect_timeout must be > 0");
  }
  if (breaker_failures == 0) return invalid_argument("redis cluster: breaker_failures must be > 0");
  if (breaker_cooldown.count() <= 0) {
    return invalid_argument("redis cluster: breaker_cooldown must be > 0");
  }
  if (max_inflight_bytes == 0) {
    return invalid_argument("redis cluster: max_inflight_bytes must be > 0");
  }
  if (expected_value_bytes == 0) {
    return invalid_argument("redis cluster: expected_value_bytes must be > 0");
  }
  if (slot_refresh_interval.count() < 0) {
    return invalid_argument("redis cluster: slot_refresh_interval must be >= 0");
  }
  if (max_value_bytes == 0) return invalid_argument("redis cluster: max_value_bytes must be > 0");
  for (const auto& network : auth_networks) {
    auto n = detail::parse_network(network);
    if (!n) return n.status();
  }
  return Status::ok();
}

std::string RedisClusterConfig::describe() const {
  std::string out = "seeds=[";
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    if (i) out += ",";
    out += seeds[i];
  }
  out += "] user=" + (user.empty() ? std::string("(default)") : user);
  out += std::string(" password=") + (password.empty() ? "(none)" : "***");
  out += " connect_timeout_ms=" + std::to_string(connect_timeout.count());
  out += " breaker_failures=" + std::to_string(breaker_failures);
  out += " breaker_cooldown_ms=" + std::to_string(breaker_cooldown.count());
  out += " max_inflight_bytes=" + std::to_string(max_inflight_bytes);
  out += " expected_value_bytes=" + std::to_string(expected_value_bytes);
  out += " slot_refresh_interval_ms=" + std::to_string(slot_refresh_interval.count());
  out += " max_redirects=" + std::to_string(max_redirects);
  out += " max_value_bytes=" + std::to_string(max_value_bytes);
  out += " auth_networks=[";
  for (std::size_t i = 0; i < auth_networks.size(); ++i) {
    if (i) out += ",";
    out += auth_networks[i];
  }
  out += auth_networks.empty() ? "(the seeds')]" : "]";
  return out;
}

}  // namespace radixtier::shared
