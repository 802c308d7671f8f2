// msgpack encoding of KV events as vLLM's KVEventBatch (msgspec array_like, tagged structs):
//   batch    [ts: float64, events: [event...], data_parallel_rank: int]  (rank omitted if < 0)
//   events   ["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//             lora_id (the key namespace; nil for the default one), medium]
//            ["BlockRemoved", block_hashes, medium]    ["AllBlocksCleared"]
//            ["SnapshotStored", block_hash, boundary, medium]   (radixtier's own)
//            ["SnapshotRemoved", block_hash, boundary, medium]  (radixtier's own)
#pragma once

#include <span>
#include <string>

#include "radixtier/cache/events.hpp"

namespace radixtier::events {

/// The payload frame of one batch. Snapshot events are left out unless `snapshots`.
std::string encode_batch(double ts, std::span<const CacheEvent> events, bool snapshots,
                         int data_parallel_rank);

}  // namespace radixtier::events
