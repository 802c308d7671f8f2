// EventQueue: a bounded single-producer / single-consumer queue of KV events.
//
// The producer is the cache's thread (on_event), the consumer any one other thread (pop).
// Neither ever blocks or waits for the other: a full queue drops the event and counts it
// (dropped()), so a stalled consumer costs the cache nothing but lost events. After a drop
// the consumer's copy of the contents is stale; re-attaching the queue to the cache
// (PrefixCache::add_event_sink) restarts the stream with AllBlocksCleared and the contents.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "radixtier/cache/events.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

class EventQueue final : public EventSink {
 public:
  /// capacity: events held at most (> 0).
  static Result<std::unique_ptr<EventQueue>> create(std::size_t capacity);

  /// Producer side: enqueues, or drops and counts when full. Never blocks.
  void on_event(const CacheEvent& event) override;
  /// Consumer side: moves the oldest event into `out`; false when empty. Never blocks.
  bool pop(CacheEvent& out);

  std::size_t capacity() const { return capacity_; }
  /// Events waiting (a snapshot: the other side may move it meanwhile).
  std::size_t size() const;
  std::uint64_t pushed() const { return tail_.load(std::memory_order_acquire); }
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  explicit EventQueue(std::size_t capacity);

  const std::size_t capacity_;
  std::unique_ptr<CacheEvent[]> slots_;
  // Each counter is written by one side only; kept on separate cache lines.
  alignas(64) std::atomic<std::uint64_t> head_{0};  ///< next to pop (consumer)
  alignas(64) std::atomic<std::uint64_t> tail_{0};  ///< next to fill (producer)
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace radixtier
