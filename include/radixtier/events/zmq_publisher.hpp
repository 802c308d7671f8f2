// ZmqPublisher: the cache's KV events over ZMQ PUB, in vLLM's KV event wire format.
//
// Attach sink() to a PrefixCache (add_event_sink). The cache only pushes into a bounded
// queue (EventQueue: a full queue drops and counts, the cache never waits); a thread of the
// publisher drains it, packs up to max_batch_events events into one KVEventBatch (msgpack)
// and sends three frames: topic, sequence number (8 bytes big-endian), payload. The last
// replay_buffer batches are kept for a ROUTER replay socket: a request carrying a start
// sequence number (8 bytes big-endian) is answered with [seq, payload] for each kept batch
// from there on, then [-1 (8 bytes), empty]. docs/events-and-metrics.md has the layout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "radixtier/cache/event_queue.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

struct ZmqPublisherConfig {
  std::string endpoint = "tcp://*:5557";  ///< PUB socket (bind)
  std::string replay_endpoint;            ///< ROUTER replay socket (bind); empty: none
  std::string topic = "kv-events";
  std::size_t queue_capacity = 1 << 16;  ///< events between the cache and the publisher
  std::size_t replay_buffer = 10'000;    ///< batches kept for replay
  std::size_t max_batch_events = 1024;
  /// SnapshotStored/SnapshotRemoved are radixtier's own tags; a decoder that knows only
  /// vLLM's three event types wants them off.
  bool snapshot_events = true;
  int data_parallel_rank = -1;  ///< < 0: omitted from the batch, as vLLM does for None

  Status validate() const;
};

class ZmqPublisher {
 public:
  static Result<std::unique_ptr<ZmqPublisher>> create(const ZmqPublisherConfig& config);
  ~ZmqPublisher();  ///< publishes what is queued, then stops
  ZmqPublisher(const ZmqPublisher&) = delete;
  ZmqPublisher& operator=(const ZmqPublisher&) = delete;

  /// What the cache is given (it must be detached before the publisher is destroyed).
  EventSink& sink();
  /// Events the queue dropped because the publisher fell behind.
  std::uint64_t dropped() const;
  /// Batches published so far (the next batch's sequence number).
  std::uint64_t batches() const;
  /// Waits until every event queued before the call is published; false on timeout.
  bool flush(std::chrono::milliseconds timeout);
  /// The bound addresses (a wildcard port resolved), for subscribers.
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;

 private:
  struct Impl;
  explicit ZmqPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace radixtier
