// ZmqPublisher: the cache's KV events over ZMQ PUB, as vLLM's ZmqEventPublisher sends them
// (vllm/distributed/kv_events.py), so that vLLM's, Dynamo's and llm-d's subscribers decode
// them unchanged. docs/events-and-metrics.md has the layout and what each router needs.
//
// Attach sink() to a PrefixCache (add_event_sink). The cache only pushes into a bounded
// queue (EventQueue: a full queue drops and counts, the cache never waits); a thread of the
// publisher drains it, packs up to max_batch_events events into one KVEventBatch (msgpack,
// [ts, events, data_parallel_rank]) and sends three frames: topic, sequence number (8 bytes
// big-endian), payload. The last replay_buffer batches are kept for a ROUTER replay socket:
// a request carrying a start sequence number (8 bytes big-endian) is answered with
// [topic, seq, payload] for each kept batch from there on, then ["", -1 (8 bytes), ""]
// (ReplayFormat::kSeqPayload: [seq, payload] and [-1, ""], as vLLM before its topic frame).
//
// Nothing is lost silently: when the queue is full it drops (dropped()) until the cache
// restarts the stream at its next poll(): AllBlocksCleared and then the contents as
// BlockStored, on the same sequence numbers (restarts()), so a subscriber's copy is exact
// again without asking for anything; the sequence numbers themselves never skip, and what a
// subscriber misses on the wire (ZMQ's high-water mark) the replay socket serves.
//
// The vLLM stream carries BlockStored, BlockRemoved and AllBlocksCleared only. With
// snapshot_endpoint set, a second PUB socket carries the full stream: the same events plus
// SnapshotStored / SnapshotRemoved, in the cache's order, so a subscriber of the vLLM
// endpoint (whatever topic it subscribes to, "" included) never receives a snapshot tag.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "radixtier/cache/event_queue.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

/// How each event is laid out in a batch (vLLM's KVCacheEvent msgspec encoding).
enum class WireFormat : std::uint8_t {
  /// Each event a msgpack map tagged under "type" ({"type": "BlockStored", "block_hashes":
  /// ..., "lora_name": ...}): vLLM since its events dropped array_like (#42892).
  kVllmCurrent,
  /// Each event a positional array ["BlockStored", block_hashes, parent_block_hash,
  /// token_ids, block_size, lora_id, medium, lora_name]: vLLM's array_like events.
  kVllmLegacy,
};

/// The frames of a replay reply.
enum class ReplayFormat : std::uint8_t {
  kTopicSeqPayload,  ///< [topic, seq, payload]; end ["", -1, ""] (vLLM's _service_replay now)
  kSeqPayload,       ///< [seq, payload]; end [-1, ""] (vLLM before the topic frame, SGLang)
};

/// The BlockStored field that names a key namespace (RequestOptions::ns) for routers.
enum class NamespaceField : std::uint8_t {
  /// lora_name = the namespace's name, lora_id = its id: llm-d keys its blocks on
  /// lora_name, Dynamo hashes with it, vLLM's own events carry the adapter there.
  kLoraName,
  /// cache_salt = the namespace's name (Dynamo's field for salted hashing; map events only,
  /// others ignore the key), lora_id and lora_name nil.
  kCacheSalt,
};

/// Which media's events go out.
enum class MediaFilter : std::uint8_t {
  kAll,  ///< GPU, CPU (the host tier) and STORAGE: for consumers that key blocks by medium
  /// GPU only: for consumers that file every medium under the GPU tier (Dynamo builds before
  /// mid-2026), where a CPU removal (drop_host(), a host victim) would remove a block that is
  /// still on the GPU from their GPU view.
  kGpuOnly,
};

struct ZmqPublisherConfig {
  /// PUB socket. Bound or connected by vLLM's rule (ZmqEventPublisher._socket_setup): bound
  /// when it holds "*" or "::" or starts with ipc:// or inproc://, connected otherwise (a
  /// central subscriber, as llm-d's, binds and every engine connects to it).
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  ///< ROUTER replay socket, always bound; empty: none
  std::string topic = "kv-events";
  WireFormat wire_format = WireFormat::kVllmCurrent;
  ReplayFormat replay_format = ReplayFormat::kTopicSeqPayload;
  /// Sent as the third element of every batch (vLLM's publisher always sets it; Dynamo
  /// requires it). One publisher per data-parallel rank, each on its own endpoint.
  int data_parallel_rank = 0;
  NamespaceField namespace_field = NamespaceField::kLoraName;
  MediaFilter media = MediaFilter::kAll;
  /// The name each non-default namespace goes out as; an unnamed one is "ns-<id>". The
  /// default namespace (0) has none (lora_name / cache_salt nil), as vLLM's base model.
  std::map<std::uint32_t, std::string> namespace_names;
  /// The full stream (every event, the snapshot events included) on a PUB socket of its own,
  /// bound or connected by the same rule; empty: snapshot events are not published.
  std::string snapshot_endpoint;
  std::string snapshot_replay_endpoint;  ///< its replay socket; empty: none
  std::string snapshot_topic = "kv-snapshots";
  std::size_t queue_capacity = 1 << 16;  ///< events between the cache and the publisher
  std::size_t replay_buffer = 10'000;    ///< batches kept for replay, per stream
  std::size_t max_batch_events = 1024;

  Status validate() const;
  /// The name namespace `ns` goes out as ("" for the default namespace).
  std::string namespace_name(std::uint32_t ns) const;
};

/// vLLM's rule: true when `endpoint` is bound, false when it is connected.
bool zmq_endpoint_binds(const std::string& endpoint);

class ZmqPublisher {
 public:
  static Result<std::unique_ptr<ZmqPublisher>> create(const ZmqPublisherConfig& config);
  ~ZmqPublisher();  ///< publishes what is queued, then stops
  ZmqPublisher(const ZmqPublisher&) = delete;
  ZmqPublisher& operator=(const ZmqPublisher&) = delete;

  /// What the cache is given (it must be detached before the publisher is destroyed).
  EventSink& sink();
  /// Events the queue dropped because the publisher fell behind. A drop is never silent:
  /// the cache restarts the stream at its next poll() (AllBlocksCleared, then the contents).
  std::uint64_t dropped() const;
  /// Those restarts: streams restarted because events were dropped.
  std::uint64_t restarts() const;
  /// The queue between the cache and the publisher (CacheMetrics reports its counts).
  const EventQueue& queue() const;
  /// Batches published on the vLLM stream so far (its next sequence number).
  std::uint64_t batches() const;
  /// Batches published on the full stream so far (0 without snapshot_endpoint).
  std::uint64_t snapshot_batches() const;
  /// Waits until every event queued before the call is published; false on timeout.
  bool flush(std::chrono::milliseconds timeout);
  /// The sockets' addresses (a bound wildcard port resolved; a connected one as given).
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;
  const std::string& snapshot_endpoint() const;
  const std::string& snapshot_replay_endpoint() const;

 private:
  struct Impl;
  explicit ZmqPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace radixtier
