// RedisCluster: SharedStore on a Redis 7 Cluster (a RESP client of its own, plain TCP: no TLS).
//
// Routing: a key goes to the master of key_slot(key) in the slot map, fetched by connect()
// with CLUSTER SLOTS and refreshed (rate-limited) after MOVED and after connection errors
// (so a failover, a replica promoted to master, is followed).
//
// One call: its keys are grouped by shard; each shard's commands are pipelined on that
// shard's connection of the call's role (probe: EXISTS, fetch: GET, publish: SET; one mutex
// each, so a big SET never delays a probe) through a window of max_inflight_bytes (value
// bytes for set(), expected reply bytes for get()), and replies are read from all shards
// with one poll() until the call's deadline, so a slow shard holds back only its own keys:
// a slow shard never eats the others' time. A shard that did not answer by the deadline has
// its keys kFailed and its connection closed (a late reply is never matched to a later
// command); it reconnects on the next call that needs it.
//
// Replies: MOVED -> retry at the named node (and refresh the map); ASK -> ASKING + retry at
// the named node (map unchanged); a redirect naming ":port" (unknown-endpoint) goes to the
// host that replied; one naming nothing usable, or a slot no range covers, asks for a refresh;
// any other error (CLUSTERDOWN, TRYAGAIN, LOADING, OOM...) -> kFailed for that key: the shard
// answered, so it is no breaker failure.
//
// A hostile or broken server (issue 32): every batch of commands written together ends with
// ECHO <nonce>, and the batch's replies are taken only when that nonce comes back in its
// place, so a reply too many, too few or arriving late is never matched to another command;
// a bulk longer than the call accepts (EXISTS and SET none, GET its bound) is refused from
// its length, before any allocation; bytes after the last reply owed, or waiting on an idle
// connection, close it. Each counts in protocol_errors; the keys concerned are kFailed.
// Setup replies (AUTH, CLUSTER SLOTS) are parsed within bounds of bytes, elements and depth,
// by the deadline. Nothing thrown inside (std::bad_alloc) leaves a call: its keys are
// kFailed, the connections it held closed (internal_errors). Credentials go only to nodes in
// auth_networks (default: the seeds' networks).
//
// Breaker per shard (CircuitBreaker): closed -> open after breaker_failures consecutive
// timeouts / connection errors; while open its keys are kFailed at once, no I/O; after
// breaker_cooldown one call is the half-open trial: success closes it, failure reopens it.
//
// Thread-safe: calls may run concurrently. A call never blocks on a connection another call
// holds: it tries the lock again while the free shards' I/O runs (until its deadline), and
// every shard's connect runs at once (non-blocking), so a busy or black-holed shard costs
// only its own keys. Host names are resolved at connect() and in the background, never on a
// request path (a name not resolved yet fails its keys until it is).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "radixtier/shared/redis_cluster_config.hpp"
#include "radixtier/shared/shared_store.hpp"
#include "radixtier/status.hpp"

namespace radixtier::shared {

/// Counters since connect() (a snapshot: each field read atomically, not all together).
struct RedisClusterStats {
  std::uint64_t calls = 0;
  std::uint64_t keys_found = 0;
  std::uint64_t keys_missing = 0;
  std::uint64_t keys_failed = 0;
  std::uint64_t moved = 0;
  std::uint64_t ask = 0;
  std::uint64_t timeouts = 0;        ///< shard passes that missed their deadline
  std::uint64_t reconnects = 0;      ///< connections opened again after one was closed
  std::uint64_t connect_errors = 0;  ///< connects (or AUTH) that failed
  std::uint64_t breaker_opens = 0;
  std::uint64_t breaker_closes = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t slot_map_refreshes = 0;
  /// Replies refused: a bulk longer than the call accepts, bytes nobody asked for, a batch
  /// whose closing ECHO did not come back as sent (its connection closed, its keys kFailed).
  std::uint64_t protocol_errors = 0;
  /// Exceptions (std::bad_alloc) caught inside a call: its keys kFailed, its connections
  /// closed; none ever leaves the client.
  std::uint64_t internal_errors = 0;
};

enum class BreakerStateView : std::uint8_t { kClosed, kOpen, kHalfOpen };
const char* to_string(BreakerStateView state);

/// One shard (a master the client has routed to) and its breaker.
struct ShardInfo {
  std::string address;  ///< "host:port"
  BreakerStateView breaker = BreakerStateView::kClosed;
  bool in_slot_map = false;  ///< a master in the current slot map (else a former one)
};

class RedisCluster final : public SharedStore {
 public:
  /// Validates `config`, asks CLUSTER SLOTS of the first seed that answers, builds the map.
  static Result<std::unique_ptr<RedisCluster>> connect(const RedisClusterConfig& config);
  ~RedisCluster() override;
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  std::vector<KeyState> exists(std::span<const std::string> keys, Deadline deadline) override;
  /// EXISTS on the publish connections: a publisher's checks never queue behind, or ahead
  /// of, a lookup's probe.
  std::vector<KeyState> exists_before_write(std::span<const std::string> keys,
                                            Deadline deadline) override;
  std::vector<GetReply> get(std::span<const std::string> keys, Deadline deadline) override;
  /// get() whose windows assume values of `expected_value_bytes` (0: the config's).
  std::vector<GetReply> get(std::span<const std::string> keys, Deadline deadline,
                            std::size_t expected_value_bytes);
  /// Reads each value from the socket straight into replies[i].value (one copy, kernel to
  /// the caller's string; resized to the value's length, reallocated only when it outgrows
  /// its capacity): see SharedStore::get_into. Same routing, deadline and late-reply rules
  /// as get() (a connection left mid-value is closed before the call returns, so nothing is
  /// ever written into `replies` after it).
  void get_into(std::span<const std::string> keys, Deadline deadline,
                std::vector<GetReply>& replies) override;
  /// get_into() whose windows assume values of `expected_value_bytes` (0: the config's).
  void get_into(std::span<const std::string> keys, Deadline deadline,
                std::vector<GetReply>& replies, std::size_t expected_value_bytes);
  /// get_into() within `bounds` (a value longer than min(bounds.max_value_bytes,
  /// config.max_value_bytes) fails its key from its length alone and closes its connection).
  void get_into(std::span<const std::string> keys, Deadline deadline,
                std::vector<GetReply>& replies, const GetBounds& bounds) override;
  std::vector<KeyState> set(std::span<const SetItem> items, Deadline deadline) override;

  RedisClusterStats stats() const;
  /// Every shard the client knows, sorted by address.
  std::vector<ShardInfo> shards() const;
  /// Asks CLUSTER SLOTS now (not rate-limited), by `deadline`.
  Status refresh_slot_map(Deadline deadline);
  /// The config, password masked.
  std::string describe() const;

 private:
  struct Impl;
  explicit RedisCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace radixtier::shared
