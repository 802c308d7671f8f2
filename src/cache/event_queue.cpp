#include "radixtier/cache/event_queue.hpp"

namespace radixtier {

const char* to_string(Medium medium) {
  switch (medium) {
    case Medium::kGpu:
      return "GPU";
    case Medium::kHost:
      return "CPU";
    case Medium::kStore:
      return "STORAGE";
  }
  return "?";
}

Result<std::unique_ptr<EventQueue>> EventQueue::create(std::size_t capacity) {
  if (capacity == 0) return invalid_argument("EventQueue: capacity must be > 0");
  return std::unique_ptr<EventQueue>(new EventQueue(capacity));
}

EventQueue::EventQueue(std::size_t capacity)
    : capacity_(capacity), slots_(new CacheEvent[capacity]) {}

EventQueue::~EventQueue() {
  delete pending_.load(std::memory_order_acquire);
}

void EventQueue::on_event(const CacheEvent& event) {
  const std::uint64_t t = tail_.load(std::memory_order_relaxed);
  if (lost_ || t - head_.load(std::memory_order_acquire) >= capacity_) {
    // Lossy until the restart: what follows a hole would only be applied to a stale copy.
    lost_ = true;
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  slots_[t % capacity_] = event;
  tail_.store(t + 1, std::memory_order_release);
}

void EventQueue::on_restart(std::vector<CacheEvent> events) {
  const std::size_t n = events.size();
  auto* r = new Restart{std::move(events), tail_.load(std::memory_order_relaxed)};
  restart_events_.fetch_add(n, std::memory_order_release);
  // Published before any event pushed after it (tail_'s release store orders them), so the
  // consumer, which reads tail_ first, takes it before popping those.
  if (Restart* replaced = pending_.exchange(r, std::memory_order_acq_rel)) {
    superseded_.fetch_add(replaced->events.size(), std::memory_order_release);
    delete replaced;
  }
  if (lost_) restarts_.fetch_add(1, std::memory_order_relaxed);
  lost_ = false;
}

bool EventQueue::take_restart() {
  if (pending_.load(std::memory_order_acquire) == nullptr) return false;
  std::unique_ptr<Restart> r(pending_.exchange(nullptr, std::memory_order_acq_rel));
  if (!r) return false;
  // The rest of a restart being popped and the ring's events queued before this one are
  // superseded: it begins with AllBlocksCleared.
  std::uint64_t gone = current_ ? current_->events.size() - current_pos_ : 0;
  std::uint64_t h = head_.load(std::memory_order_relaxed);
  for (; h < r->at; ++h, ++gone) slots_[h % capacity_] = AllBlocksCleared{};
  head_.store(h, std::memory_order_release);
  superseded_.fetch_add(gone, std::memory_order_release);
  current_ = std::move(r);
  current_pos_ = 0;
  return true;
}

bool EventQueue::pop(CacheEvent& out) {
  // tail_ first: a restart published before the events it reads is seen by take_restart().
  const std::uint64_t t = tail_.load(std::memory_order_acquire);
  take_restart();
  if (current_) {
    if (current_pos_ < current_->events.size()) {
      out = std::move(current_->events[current_pos_++]);
      if (current_pos_ == current_->events.size()) current_.reset();
      return true;
    }
    current_.reset();
  }
  const std::uint64_t h = head_.load(std::memory_order_relaxed);
  if (h >= t) return false;
  out = std::move(slots_[h % capacity_]);
  slots_[h % capacity_] = AllBlocksCleared{};  // release the moved-from vectors' memory
  head_.store(h + 1, std::memory_order_release);
  return true;
}

std::size_t EventQueue::size() const {
  const std::uint64_t t = tail_.load(std::memory_order_acquire);
  return static_cast<std::size_t>(t - head_.load(std::memory_order_acquire));
}

}  // namespace radixtier
