// SharedStore: the one interface the shared tier (shared_tier.hpp) talks to: a key-value
// store shared by every instance of a fleet. RedisCluster (redis_cluster.hpp) implements it on
// a Redis 7 Cluster; another engine (Mooncake Store, Valkey) would implement the same three
// calls (get_into() has a default built on get()).
//
// Every call is pipelined (one round per shard where the engine has shards) and ends by an
// absolute deadline: a key the store did not answer by then, or answered with an error, is
// kFailed. kFailed is a miss to the caller and never a wrong value: a reply that arrives after
// its call returned is discarded with its connection, never matched to a later call.
//
// Threading: every call may come from any thread; calls on one engine may run concurrently
// (the engine serializes what must be serialized, per connection).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace radixtier::shared {

using Clock = std::chrono::steady_clock;
/// An absolute deadline: a call returns by then, whatever the store does.
using Deadline = Clock::time_point;

/// What a call learned about one key.
enum class KeyState : std::uint8_t {
  kFound,    ///< exists (EXISTS), its value came back (GET), written (SET)
  kMissing,  ///< the store answered: no such key (EXISTS, GET); SET never reports it
  kFailed,   ///< no answer by the deadline, a shard down or its breaker open, an error reply
};

const char* to_string(KeyState state);

/// One key's GET: the value when kFound (empty otherwise).
struct GetReply {
  KeyState state = KeyState::kFailed;
  std::string value;
};

/// What one GET call may receive: a value longer than max_value_bytes is kFailed and never
/// received into memory (the engine refuses it from its length alone); the tier knows each
/// value's exact size and passes it. expected_value_bytes sizes an engine's windows (0: its
/// own default).
struct GetBounds {
  std::size_t max_value_bytes = SIZE_MAX;
  std::size_t expected_value_bytes = 0;
};

/// One key-value pair to SET (views: valid until set() returns).
struct SetItem {
  std::string_view key;
  std::string_view value;
};

class SharedStore {
 public:
  virtual ~SharedStore() = default;
  /// Which of `keys` exist (small replies: the probe connections).
  virtual std::vector<KeyState> exists(std::span<const std::string> keys, Deadline deadline) = 0;
  /// exists() for a writer about to write `keys` (the publisher): an engine with separate
  /// connections runs it beside the probes (RedisCluster: on the publish connections).
  virtual std::vector<KeyState> exists_before_write(std::span<const std::string> keys,
                                                    Deadline deadline) {
    return exists(keys, deadline);
  }
  /// The values of `keys`, in order (bulk replies: the fetch connections).
  virtual std::vector<GetReply> get(std::span<const std::string> keys, Deadline deadline) = 0;
  /// get() into the caller's `replies`, reusing their strings' memory: `replies` is resized
  /// to keys.size(); replies[i] is keys[i]'s answer (same states and deadline as get()); a
  /// kFound value holds exactly the value's bytes, any other is empty. An engine that reads
  /// into the strings (RedisCluster) reallocates a value only when it outgrows its capacity
  /// and never shrinks one, so a caller that hands the same vector back for values of
  /// similar sizes touches no fresh memory (no page faults). A value's string may be
  /// overwritten even when the key ends kFailed (then it is cleared). This default calls
  /// get() and moves its strings in (no reuse).
  virtual void get_into(std::span<const std::string> keys, Deadline deadline,
                        std::vector<GetReply>& replies);
  /// get_into() within `bounds`: a value longer than bounds.max_value_bytes is kFailed (and
  /// cleared). This default calls the three-argument get_into() and checks the lengths after
  /// (an engine that can refuse a length before reading it, RedisCluster, overrides it).
  virtual void get_into(std::span<const std::string> keys, Deadline deadline,
                        std::vector<GetReply>& replies, const GetBounds& bounds);
  /// Writes every item (plain SET: content-addressed keys make a rewrite harmless); per item
  /// kFound (written) or kFailed.
  virtual std::vector<KeyState> set(std::span<const SetItem> items, Deadline deadline) = 0;
};

}  // namespace radixtier::shared
