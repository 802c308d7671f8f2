#include "shared/circuit_breaker.hpp"

namespace radixtier::shared::detail {

const char* to_string(BreakerState state) {
  switch (state) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half-open";
  }
  return "unknown";
}

bool CircuitBreaker::allow(Clock::time_point now) {
  std::lock_guard lock(mu_);
  switch (state_) {
    case BreakerState::kClosed:
      return true;
    case BreakerState::kOpen:
    case BreakerState::kHalfOpen:
      if (now - since_ < cooldown_) return false;
      state_ = BreakerState::kHalfOpen;
      since_ = now;
      return true;
  }
  return false;
}

BreakerTransition CircuitBreaker::on_success() {
  std::lock_guard lock(mu_);
  consecutive_ = 0;
  if (state_ == BreakerState::kClosed) return BreakerTransition::kNone;
  state_ = BreakerState::kClosed;
  return BreakerTransition::kClosed;
}

BreakerTransition CircuitBreaker::on_failure(Clock::time_point now) {
  std::lock_guard lock(mu_);
  ++consecutive_;
  if (state_ == BreakerState::kHalfOpen) {
    state_ = BreakerState::kOpen;
    since_ = now;
    return BreakerTransition::kOpened;
  }
  if (state_ == BreakerState::kClosed && consecutive_ >= failures_) {
    state_ = BreakerState::kOpen;
    since_ = now;
    return BreakerTransition::kOpened;
  }
  return BreakerTransition::kNone;
}

BreakerState CircuitBreaker::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

}  // namespace radixtier::shared::detail
