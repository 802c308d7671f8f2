// RedisClusterConfig: the one validated config of a RedisCluster client.
//
// Contract: validate() checks every field and names the first bad one; describe() prints every
// field with the password masked ("***" when set): the password never appears in any string
// this library builds (errors, describe, logs).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::shared {

struct RedisClusterConfig {
  /// "host:port" of cluster nodes; CLUSTER SLOTS is asked of the first that answers.
  std::vector<std::string> seeds;
  /// ACL user ("" = the default user: AUTH <password>); used only when password is set.
  std::string user;
  /// AUTH password ("" = no AUTH). Never printed.
  std::string password;
  /// Bound on one TCP connect + AUTH (also bounded by each call's deadline).
  std::chrono::milliseconds connect_timeout{500};
  /// Consecutive timeouts / connection errors of one shard that open its breaker.
  std::uint32_t breaker_failures = 3;
  /// How long an open breaker fails its shard's keys fast before one half-open trial.
  std::chrono::milliseconds breaker_cooldown{1000};
  /// Bound on bytes in flight per shard connection: set() sends a shard's items through a
  /// pipelined window whose unacknowledged value bytes stay under it, get() one whose
  /// expected reply bytes stay under it (a window always holds at least one key); each shard
  /// has its own window, so a slow shard holds back only its own keys. Deep pipelines of
  /// multi-MiB values make the server buffer every reply at once: measured on loopback
  /// (radixtier_shared_bench), 8 MiB windows of 4 MiB values read several times faster than
  /// 32 MiB or 256 MiB ones.
  std::size_t max_inflight_bytes = std::size_t{8} << 20;
  /// Expected bytes of one GET value when a get() gives no hint.
  std::size_t expected_value_bytes = std::size_t{1} << 20;
  /// Least time between two slot-map refreshes caused by connection errors or MOVED.
  std::chrono::milliseconds slot_refresh_interval{100};
  /// Most MOVED/ASK redirects one key follows in one call.
  std::uint32_t max_redirects = 5;
  /// Longest value a get() without bounds accepts (a longer bulk reply fails its key and
  /// closes its connection before anything is allocated for it). Redis's own
  /// proto-max-bulk-len default.
  std::size_t max_value_bytes = std::size_t{512} << 20;
  /// Where AUTH may go: IP networks ("10.1.0.0/16", "fd00::/64", one address = /32 or /128).
  /// Empty: the seeds' networks (each address a seed resolves to at connect(), /24 for IPv4,
  /// /64 for IPv6). A MOVED, ASK or CLUSTER SLOTS naming a node outside them gets no
  /// credentials: its keys fail. Checked against the address actually connected to.
  std::vector<std::string> auth_networks;

  Status validate() const;
  /// Every field, the password masked.
  std::string describe() const;
};

}  // namespace radixtier::shared
