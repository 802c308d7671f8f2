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

void EventQueue::on_event(const CacheEvent& event) {
  const std::uint64_t t = tail_.load(std::memory_order_relaxed);
  if (t - head_.load(std::memory_order_acquire) >= capacity_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  slots_[t % capacity_] = event;
  tail_.store(t + 1, std::memory_order_release);
}

bool EventQueue::pop(CacheEvent& out) {
  const std::uint64_t h = head_.load(std::memory_order_relaxed);
  if (h == tail_.load(std::memory_order_acquire)) return false;
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
