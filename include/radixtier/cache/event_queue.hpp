// EventQueue: a bounded single-producer / single-consumer queue of KV events.
//
// The producer is the cache's thread (on_event, on_restart), the consumer any one other
// thread (pop). Neither ever blocks or waits for the other: a full queue drops the event and
// counts it (dropped()), so a stalled consumer costs the cache nothing but lost events.
//
// A loss is never silent. From the first drop the queue is lossy (lost_events()): it drops
// every later event too (they would leave holes in a stream that is stale anyway) until the
// cache restarts its stream at its next poll(): AllBlocksCleared and the current contents,
// handed over whole (on_restart) beyond the bound, so the restart itself cannot be cut. The
// consumer receives the events queued before the restart, then the restart, then what
// follows; a restart that replaces one the consumer has not finished supersedes it
// (superseded()). restarts() counts the restarts that ended a loss.
//
// States of the producer: kept (events go into the ring) -> lossy (the ring was full: every
// event is dropped) -> kept (on_restart). The consumer: ring -> restart (a pending one is
// taken before any event pushed after it) -> ring.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "radixtier/cache/events.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

class EventQueue final : public EventSink {
 public:
  /// capacity: events held at most (> 0), a restart's contents aside.
  static Result<std::unique_ptr<EventQueue>> create(std::size_t capacity);
  ~EventQueue() override;
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  /// Producer side: enqueues, or drops and counts when full or lossy. Never blocks.
  void on_event(const CacheEvent& event) override;
  /// Producer side: the restart, whole (ends the loss). Never blocks.
  void on_restart(std::vector<CacheEvent> events) override;
  /// Producer side: dropped something since the stream last restarted, and no restart is
  /// waiting for the consumer (a new one would only replace it: the cache is asked again
  /// once the consumer took it, so a slow consumer costs one tree walk per restart it takes).
  bool lost_events() const override {
    return lost_ && pending_.load(std::memory_order_acquire) == nullptr;
  }
  /// Consumer side: moves the next event into `out`; false when empty. Never blocks.
  bool pop(CacheEvent& out);

  std::size_t capacity() const { return capacity_; }
  /// Events waiting in the ring, a restart aside (a snapshot: the other side may move it).
  std::size_t size() const;
  /// Events accepted: into the ring or in a restart.
  std::uint64_t pushed() const {
    return tail_.load(std::memory_order_acquire) + restart_events_.load(std::memory_order_acquire);
  }
  /// Accepted events that will never be popped: what a later restart replaced.
  std::uint64_t superseded() const { return superseded_.load(std::memory_order_acquire); }
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  /// Restarts that ended a loss (the stream was restarted because events were dropped).
  std::uint64_t restarts() const { return restarts_.load(std::memory_order_relaxed); }

 private:
  explicit EventQueue(std::size_t capacity);
  struct Restart {
    std::vector<CacheEvent> events;
    std::uint64_t at = 0;  ///< ring position it goes before: the events from here follow it
  };
  /// Consumer: takes a pending restart (true); the ring's events before it are superseded.
  bool take_restart();

  const std::size_t capacity_;
  std::unique_ptr<CacheEvent[]> slots_;
  bool lost_ = false;  ///< producer only
  // Each counter is written by one side only; kept on separate cache lines.
  alignas(64) std::atomic<std::uint64_t> head_{0};  ///< next to pop (consumer)
  alignas(64) std::atomic<std::uint64_t> tail_{0};  ///< next to fill (producer)
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> restart_events_{0};  ///< producer
  std::atomic<std::uint64_t> restarts_{0};        ///< producer
  std::atomic<std::uint64_t> superseded_{0};      ///< both (fetch_add)
  std::atomic<Restart*> pending_{nullptr};        ///< producer stores, consumer takes
  std::unique_ptr<Restart> current_;              ///< consumer: the restart being popped
  std::size_t current_pos_ = 0;                   ///< consumer
};

}  // namespace radixtier
