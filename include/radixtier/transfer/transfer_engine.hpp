// The transfer engine: moves KV pages and snapshots between the GPU and the host tier.
//
// A batch names page copies and snapshot copies (whole, or in host-page pieces) in one
// direction, or (kDeviceToDevice) slot pieces between live snapshot slots and GPU pages.
// submit() hands back a
// move-only Ticket at once; the copy runs asynchronously, split by the engine into slices of
// at most `slice_pages` pages (a snapshot is cut into chunks of the same byte size), so the
// staging memory an engine needs is one slice per direction, never a whole prefix.
//
// Ticket states:   Pending --(all slices copied)--> Done
//                  Pending --(any slice failed)---> Failed   (destination bytes are garbage)
//
// Contract with the caller (the cache keeps it): while a ticket is pending, neither the
// sources nor the destinations of its batch are freed or reused. The interface maps onto
// CUDA directly: one stream per direction, a ticket is an event recorded after the last
// slice, poll() is cudaEventQuery, wait() is cudaEventSynchronize.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"

namespace radixtier {

enum class Direction {
  kDeviceToHost,    ///< demotion or write-through
  kHostToDevice,    ///< promotion
  kDeviceToDevice,  ///< between GPU pages and live snapshot slots (slot_pieces only)
};

const char* to_string(Direction dir);

struct PageCopy {
  GpuPageId gpu;
  HostPageId host;
};

struct SnapshotCopy {
  GpuSlotId gpu;
  HostSlotId host;
};

/// One host page's share of a snapshot: bytes [offset, offset + n) of GPU snapshot slot `gpu`,
/// n = min(page_bytes, snapshot_bytes - offset), to or from host page `host`. The cache keeps a
/// host snapshot in ceil(snapshot_bytes / page_bytes) pages of the one host pool that also
/// holds KV, in any order (not contiguous); `offset` is a multiple of page_bytes.
struct SnapshotPieceCopy {
  GpuSlotId gpu;
  std::size_t offset = 0;
  HostPageId host;
};

/// One GPU page's share of a live snapshot slot, copied on the device (kDeviceToDevice): bytes
/// [offset, offset + n) of slot `slot`, n = min(page_bytes, snapshot_bytes - offset), into GPU
/// page `page` (to_slot false: a request's state materialized into the GPU pool) or out of it
/// (to_slot true: a cached snapshot resumed into a request's live slot). A cached snapshot on
/// GPU spans ceil(snapshot_bytes / page_bytes) pages of the GPU pool that also holds KV, in any
/// order; `offset` is a multiple of page_bytes. Bytes of `page` past n are left as they are.
struct SlotPieceCopy {
  GpuSlotId slot;
  std::size_t offset = 0;
  GpuPageId page;
  bool to_slot = false;
};

/// A stream of the caller's, opaque to the cache: a cudaStream_t on the CUDA engine (nullptr:
/// the engine's default compute stream, CudaEngineOptions::compute_stream). An engine without
/// streams (the host engine) has nothing to order on and ignores it.
using StreamHandle = void*;

struct TransferBatch {
  Direction direction = Direction::kDeviceToHost;
  std::vector<PageCopy> pages;
  std::vector<SnapshotCopy> snapshots;    ///< whole snapshots to host snapshot slots
  std::vector<SnapshotPieceCopy> pieces;  ///< snapshots in host pages (PrefixCache)
  /// kDeviceToDevice: live slots <-> GPU pages (a D2D batch holds nothing else; a D2H or H2D
  /// batch holds none of these).
  std::vector<SlotPieceCopy> slot_pieces;
  /// The caller's stream this batch is ordered after (compute -> copy): a demotion reads a
  /// page only after the work queued on it that writes the page, a promotion or a device copy
  /// overwrites a page or slot only after the work queued on it that may still read it.
  /// nullptr: the engine's default compute stream. The rule for a caller: pass the stream
  /// that last used what the batch touches; a stream that did not is a race the engine
  /// cannot see (docs/cuda.md, "Streams").
  StreamHandle stream = nullptr;
  /// Tickets this batch runs after on the device: no byte of it moves before every byte of
  /// theirs landed (a device copy out of snapshot pages a promotion is still filling). A
  /// ticket that failed makes this one fail too, even when its owner released it before this
  /// one ran; one released after it landed is done. An id never issued is refused
  /// (kInvalidArgument, nothing copied).
  std::vector<TicketId> after;

  bool empty() const {
    return pages.empty() && snapshots.empty() && pieces.empty() && slot_pieces.empty();
  }
};

/// Bytes one piece moves (0 when the offset is past the snapshot's end).
inline std::size_t piece_bytes(const SnapshotPieceCopy& p, std::size_t page_bytes,
                               std::size_t snapshot_bytes) {
  return p.offset >= snapshot_bytes ? 0 : std::min(page_bytes, snapshot_bytes - p.offset);
}
inline std::size_t piece_bytes(const SlotPieceCopy& p, std::size_t page_bytes,
                               std::size_t snapshot_bytes) {
  return p.offset >= snapshot_bytes ? 0 : std::min(page_bytes, snapshot_bytes - p.offset);
}

/// Why a batch holds what its direction does not allow (a kDeviceToDevice batch holds
/// slot_pieces only; a D2H or H2D batch holds none), or nullptr. Every engine rejects such a
/// batch whole (kInvalidArgument), like one with an out-of-range id.
inline const char* batch_shape_error(const TransferBatch& b) {
  if (b.direction == Direction::kDeviceToDevice) {
    if (!b.pages.empty() || !b.snapshots.empty() || !b.pieces.empty())
      return "a device-to-device batch holds slot pieces only (no pages, snapshots or snapshot "
             "pieces)";
    return nullptr;
  }
  if (!b.slot_pieces.empty()) return "slot pieces belong in a device-to-device batch only";
  return nullptr;
}

enum class TransferState { kPending, kDone, kFailed };

const char* to_string(TransferState state);

class TransferEngine;

/// Move-only handle of one submitted batch. Destroying a pending ticket waits for it first:
/// an engine must never copy into or out of memory its owner already reused.
class Ticket {
 public:
  Ticket() = default;
  Ticket(TransferEngine* engine, TicketId id) : engine_(engine), id_(id) {}
  Ticket(Ticket&& other) noexcept { *this = std::move(other); }
  Ticket& operator=(Ticket&& other) noexcept;
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;
  ~Ticket() { reset(); }

  TicketId id() const { return id_; }
  bool valid() const { return engine_ != nullptr; }
  TransferState poll() const;
  TransferState wait() const;
  /// Waits if pending, then lets the engine forget the ticket.
  void reset();

 private:
  TransferEngine* engine_ = nullptr;
  TicketId id_;
};

/// What an engine can address: ids below these counts, pages and snapshots of these sizes.
/// PrefixCache::create() refuses a config that does not fit in it.
struct EngineCapacity {
  static constexpr std::uint32_t kUnbounded = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t gpu_pages = kUnbounded;
  std::uint32_t host_pages = kUnbounded;
  std::uint32_t gpu_snapshot_slots = kUnbounded;
  std::uint32_t host_snapshot_slots = kUnbounded;
  std::size_t page_bytes = 0;      ///< bytes of one page; 0: the engine moves no bytes (any size)
  std::size_t snapshot_bytes = 0;  ///< bytes of one snapshot; 0: any size
};

/// The host KV pool an engine copies into and out of, as pages: CacheConfig::host_pool_pages()
/// pages of page_bytes (snapshot pieces land in them too). A disk tier reads and writes these
/// bytes (disk::DiskStoreEngine), whichever engine owns them: HostArenas for the host engine,
/// the pinned pool for the CUDA engine.
class HostPages {
 public:
  virtual ~HostPages() = default;
  virtual std::size_t page_bytes() const = 0;
  virtual std::uint32_t host_pages() const = 0;
  /// The bytes of one page; an id outside the pool throws std::out_of_range.
  virtual std::span<std::byte> host_page(HostPageId id) = 0;
};

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;

  /// Validates every id against the engine's pools; an invalid batch is rejected whole and
  /// nothing is copied.
  virtual Result<Ticket> submit(TransferBatch batch) = 0;
  virtual TransferState poll(TicketId id) = 0;
  virtual TransferState wait(TicketId id) = 0;
  /// Forgets a finished ticket (called by Ticket::reset after wait).
  virtual void release(TicketId id) = 0;
  virtual std::size_t slice_pages() const = 0;
  /// The pools this engine copies between (an engine without memory reports kUnbounded).
  virtual EngineCapacity capacity() const = 0;
  /// The host pages this engine copies into and out of; nullptr for an engine that moves no
  /// bytes.
  virtual HostPages* host_memory() { return nullptr; }
  /// Makes `stream` wait until the ticket's copies landed (with `layer`: the KV of the layers
  /// up to `layer`'s group and every snapshot of the batch). An engine with streams waits on
  /// the device, without a host wait, so work queued on `stream` after this call may be
  /// launched before the copy ends; this default (an engine without streams) waits on the
  /// host. kTransferFailed when the ticket is known to have failed. A device wait cannot know
  /// a failure yet to come: check the ticket (poll) before using what the stream computed.
  virtual Status stream_wait(TicketId id, StreamHandle stream, std::optional<std::uint32_t> layer) {
    (void)stream;
    (void)layer;
    if (wait(id) == TransferState::kDone) return Status::ok();
    return Status(ErrorCode::kTransferFailed, "stream_wait: the copy failed");
  }
  /// True when stream_wait() orders on the device (no host wait).
  virtual bool waits_on_device() const { return false; }
};

}  // namespace radixtier
