// RequestOptions: what a request says about itself besides its tokens.
//
// * namespace: the key namespace (LoRA adapter id, cache salt, tenant). Each namespace has
//   its own tree under its own root; two namespaces never share a node, so the same tokens
//   in two namespaces never share KV pages or snapshots. The eviction orders and the pools
//   stay global (one pool per resource, whatever the namespace).
// * priority: the retention priority, 0 (leave first) to 100 (leave last), the scale of
//   TensorRT-LLM's KvCacheRetentionConfig (its default is 35). A node carries the highest
//   priority of the requests that inserted or used it (it never decays while the node is in
//   the tree); eviction compares it before value and recency (node.hpp, "Eviction orders").
// * stream: the caller's stream the request's forward pass runs on (a cudaStream_t on the CUDA
//   engine; nullptr: the engine's default compute stream). Kept in the lock: every batch a
//   call made with that lock submits (its promotion, the copy into its live slot, the
//   materialization of its snapshot, the demotions that make room for its allocations) is
//   ordered after the work queued on it, and PrefixCache::stream_wait() orders it after the
//   copies. Rule: pass the stream the request's forward really runs on; work on another
//   stream is not ordered by the cache (a race the engine cannot see). Batches no request
//   makes (the watermark step, wherever it runs) use the engine's default stream.
#pragma once

#include <cstdint>
#include <string>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

/// A retention priority, 0..100.
using RetentionPriority = std::uint8_t;
inline constexpr RetentionPriority kMinPriority = 0;
inline constexpr RetentionPriority kMaxPriority = 100;
/// The priority of a request that names none (TensorRT-LLM's default retention priority).
inline constexpr RetentionPriority kDefaultPriority = 35;

struct RequestOptions {
  NamespaceId ns = kDefaultNamespace;
  RetentionPriority priority = kDefaultPriority;
  StreamHandle stream = nullptr;  ///< the caller's stream (nullptr: the engine's default)

  /// Rejects an invalid namespace id and a priority above kMaxPriority, naming the field.
  Status validate() const {
    if (!ns.valid()) return invalid_argument("RequestOptions.ns is the invalid namespace id");
    if (priority > kMaxPriority) {
      return invalid_argument("RequestOptions.priority is " + std::to_string(priority) +
                              ", above the maximum " + std::to_string(kMaxPriority));
    }
    return Status::ok();
  }
};

}  // namespace radixtier
