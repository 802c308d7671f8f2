// KV events: what the cache stores and removes, per tier, in the order it happens.
//
// A router that keeps a copy of each worker's contents needs exactly the residency changes a
// request could observe (inspect()'s view: a copy being written is not there yet). The cache
// reports them to every attached EventSink, from the thread that calls the cache:
//   BlockStored      pages of one node became usable on a medium (insert, a finished
//                    demotion, write-through, promotion or store write, a revived tombstone)
//   BlockRemoved     pages of one node left a medium (evicted, dropped, a failed copy)
//   AllBlocksCleared every earlier block and snapshot is gone (flush(), a sink attached, or a
//                    sink that lost events restarted: what the cache still holds follows as
//                    BlockStored/SnapshotStored, EventSink::on_restart)
//   SnapshotStored / SnapshotRemoved   the snapshot at a node's boundary, per medium
// A block is a page (block_size = page_size tokens), named by its content hash: hashes chain
// from the parent page (block_hash.hpp), so a router can compute them from a prompt's tokens
// alone. A snapshot is named by the hash of the last page before its boundary. Each key
// namespace hashes from its own seed (its id), so equal tokens in two namespaces are two
// blocks; BlockStored names the namespace (lora_id: its id; ZmqPublisher sends it as a
// lora_name or cache_salt string, which routers key on).
//
// With no sink attached the cache does no event work at all (one branch per state change).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <variant>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier {

/// Where a copy lives. vLLM's medium strings (vllm/distributed/kv_events.py, MEDIUM_GPU,
/// MEDIUM_CPU, MEDIUM_STORAGE): "GPU", "CPU", "STORAGE" (to_string()). kStore is the store
/// tier below host (the disk): a router may count it as a slower hit.
enum class Medium : std::uint8_t { kGpu, kHost, kStore };

const char* to_string(Medium medium);

struct BlockStored {
  std::vector<std::uint64_t> block_hashes;         ///< one per page, in token order
  std::optional<std::uint64_t> parent_block_hash;  ///< the page before; none at the root
  std::vector<Token> token_ids;                    ///< block_hashes.size() x block_size
  std::uint32_t block_size = 0;
  Medium medium = Medium::kGpu;
  /// The key namespace (RequestOptions::ns: LoRA adapter, cache salt, tenant); none for the
  /// default one. vLLM's lora_id field; the first page's parent hash is this id (or 0).
  std::optional<std::uint32_t> lora_id;
  bool operator==(const BlockStored&) const = default;
};

struct BlockRemoved {
  std::vector<std::uint64_t> block_hashes;
  Medium medium = Medium::kGpu;
  bool operator==(const BlockRemoved&) const = default;
};

struct AllBlocksCleared {
  bool operator==(const AllBlocksCleared&) const = default;
};

/// The snapshot of the recurrent state taken after `boundary` tokens.
struct SnapshotStored {
  std::uint64_t block_hash = 0;  ///< hash of the page that ends at `boundary`
  std::size_t boundary = 0;
  Medium medium = Medium::kGpu;
  bool operator==(const SnapshotStored&) const = default;
};

struct SnapshotRemoved {
  std::uint64_t block_hash = 0;
  std::size_t boundary = 0;
  Medium medium = Medium::kGpu;
  bool operator==(const SnapshotRemoved&) const = default;
};

using CacheEvent =
    std::variant<BlockStored, BlockRemoved, AllBlocksCleared, SnapshotStored, SnapshotRemoved>;

/// Receives the cache's events on the cache's thread. It must not call back into the cache
/// and should return quickly (EventQueue hands events to another thread without blocking).
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_event(const CacheEvent& event) = 0;
  /// A restart of this sink's stream, whole: AllBlocksCleared, then what the cache holds as
  /// stored events (on attach, on flush(), and after lost_events()). The default hands them
  /// to on_event() one by one; a bounded queue takes them in one piece, beyond its bound (they
  /// are bounded by the cache's contents), so a restart itself is never cut short.
  virtual void on_restart(std::vector<CacheEvent> events) {
    for (const CacheEvent& e : events) on_event(e);
  }
  /// True when this sink lost events since its stream last restarted (a full queue): its
  /// copy of the contents is stale, and the cache restarts its stream at its next poll(),
  /// which every entry point runs. A sink that never loses anything keeps the default.
  virtual bool lost_events() const { return false; }
};

/// An EventSink that calls a function.
class CallbackSink final : public EventSink {
 public:
  explicit CallbackSink(std::function<void(const CacheEvent&)> fn) : fn_(std::move(fn)) {}
  void on_event(const CacheEvent& event) override { fn_(event); }

 private:
  std::function<void(const CacheEvent&)> fn_;
};

}  // namespace radixtier
