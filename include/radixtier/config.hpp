// One validated configuration struct for the cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "radixtier/status.hpp"

namespace radixtier {

/// When a GPU copy reaches host memory.
enum class WritePolicy {
  kWriteBack,     ///< copy to host only when the GPU copy is evicted (demotion costs a copy)
  kWriteThrough,  ///< copy to host in the background right after insert (eviction is free)
};

const char* to_string(WritePolicy policy);

/// Which snapshot leaves a tier first when a slot is needed.
enum class SnapshotEviction {
  kLru,      ///< least recently used
  kUtility,  ///< lowest (recompute saved per byte) x recency among the LRU tail, as Marconi
};

const char* to_string(SnapshotEviction eviction);

struct CacheConfig {
  std::uint32_t page_size = 64;           ///< tokens per page
  std::uint32_t gpu_pages = 0;            ///< GPU KV pool, in pages
  std::uint32_t host_pages = 0;           ///< pinned host KV pool, in pages (0: no host tier)
  std::uint32_t gpu_snapshot_slots = 0;   ///< GPU snapshot slots
  std::uint32_t host_snapshot_slots = 0;  ///< host snapshot slots (0: no host snapshots)
  std::size_t page_bytes = 0;             ///< bytes of one page, all attention layers, K and V
  std::size_t snapshot_bytes = 0;         ///< bytes of one snapshot of the full recurrent state
  std::uint32_t slice_pages = 128;        ///< at most this many pages per copy slice
  WritePolicy write_policy = WritePolicy::kWriteBack;
  SnapshotEviction snapshot_eviction = SnapshotEviction::kLru;

  /// Rejects nonsense with a message naming the field.
  Status validate() const;

  /// Staging bytes one slice may need in one direction (a page slice or a snapshot chunk).
  std::size_t slice_bytes() const { return static_cast<std::size_t>(slice_pages) * page_bytes; }
};

}  // namespace radixtier
