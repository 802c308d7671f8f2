// CircuitBreaker: one shard's breaker.
//
// State machine:
//   closed --`failures` consecutive on_failure()--> open
//   open --allow() after `cooldown`--> half-open (that caller is the one trial)
//   half-open --on_success()--> closed;  half-open --on_failure()--> open (cooldown restarts)
// on_success() in closed resets the failure count. While open (and half-open with its trial
// in flight) allow() is false: the shard's keys fail fast, no I/O. A trial that reports
// nothing for a whole cooldown is presumed lost and another caller may try.
// Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <mutex>

#include "radixtier/shared/shared_store.hpp"

namespace radixtier::shared::detail {

enum class BreakerState : std::uint8_t { kClosed, kOpen, kHalfOpen };
const char* to_string(BreakerState state);

/// What a report changed (for the opens / closes counters).
enum class BreakerTransition : std::uint8_t { kNone, kOpened, kClosed };

class CircuitBreaker {
 public:
  CircuitBreaker(std::uint32_t failures, Clock::duration cooldown)
      : failures_(failures), cooldown_(cooldown) {}

  bool allow(Clock::time_point now);
  BreakerTransition on_success();
  BreakerTransition on_failure(Clock::time_point now);
  BreakerState state() const;

 private:
  mutable std::mutex mu_;
  const std::uint32_t failures_;
  const Clock::duration cooldown_;
  BreakerState state_ = BreakerState::kClosed;
  std::uint32_t consecutive_ = 0;
  Clock::time_point since_{};  ///< opened at (open) / trial started at (half-open)
};

}  // namespace radixtier::shared::detail
