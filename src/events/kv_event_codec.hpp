// msgpack encoding of KV events as vLLM's KVEventBatch (vllm/distributed/kv_events.py):
// EventBatch is msgspec array_like, so a batch is an array; each event is a msgspec tagged
// struct with omit_defaults, a map under WireFormat::kVllmCurrent, an array under kVllmLegacy.
//   batch         [ts: float64, events: [event...], data_parallel_rank: int]
//   current       {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
//                  "block_size", "lora_id", "medium", "lora_name"[, "cache_salt"]}
//                 {"type": "BlockRemoved", "block_hashes", "medium"}  {"type": "AllBlocksCleared"}
//                 {"type": "SnapshotStored" | "SnapshotRemoved", "block_hash", "boundary",
//                 "medium"}
//   legacy        ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//                  lora_id, medium, lora_name]   ["BlockRemoved", block_hashes, medium]
//                 ["AllBlocksCleared"]   ["SnapshotStored" | "SnapshotRemoved", block_hash,
//                  boundary, medium]
// The fields vLLM declares with defaults (extra_keys, group_idx, ...) are left out, as
// omit_defaults leaves them out when they hold their default.
#pragma once

#include <span>
#include <string>

#include "radixtier/cache/events.hpp"
#include "radixtier/events/zmq_publisher.hpp"

namespace radixtier::events {

/// True for SnapshotStored / SnapshotRemoved (radixtier's own tags: the full stream only).
bool is_snapshot(const CacheEvent& e);

/// The payload frame of one batch, laid out as `config` says. Snapshot events are left out
/// unless `snapshots`.
std::string encode_batch(double ts, std::span<const CacheEvent> events,
                         const ZmqPublisherConfig& config, bool snapshots);

}  // namespace radixtier::events
