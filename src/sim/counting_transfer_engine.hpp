// CountingTransferEngine: a transfer engine for simulation that moves no bytes.
//
// It checks ids against the pool sizes of a CacheConfig (nothing else), counts what a real
// engine would move per direction (pages, snapshots, bytes, batches, slices of at most
// `slice_pages` pages; a snapshot counts as one slice; device-to-device slot pieces in slices
// of `slice_pages` pieces), and completes every batch either at
// once (kImmediate) or when it is waited for (kAtWait: poll() says pending until then; waiting
// for one completes the tickets it runs `after` first, so no batch lands before those it is
// ordered after; an `after` id never issued is refused). So a
// million-token scenario with 77 MB snapshots runs in a few megabytes of memory.
// Thread-safe: one mutex guards the ticket table and the counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "radixtier/config.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::sim {

struct DirectionCounts {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;  ///< copies a real engine would issue (page slices + snapshots)
  std::uint64_t pages = 0;
  std::uint64_t snapshots = 0;
  std::uint64_t bytes = 0;
};

struct CountingStats {
  DirectionCounts d2h;
  DirectionCounts h2d;
  /// Device-to-device batches (slot pieces): `pages` counts the GPU pages touched (one per
  /// piece), `snapshots` the pieces at offset 0.
  DirectionCounts d2d;
  std::uint64_t rejected = 0;  ///< batches refused for an out-of-range id (or a bad shape)
};

class CountingTransferEngine final : public TransferEngine {
 public:
  enum class Completion { kImmediate, kAtWait };

  explicit CountingTransferEngine(const CacheConfig& config,
                                  Completion completion = Completion::kImmediate);

  Result<Ticket> submit(TransferBatch batch) override;
  TransferState poll(TicketId id) override;
  TransferState wait(TicketId id) override;
  void release(TicketId id) override;
  std::size_t slice_pages() const override { return slice_pages_; }
  EngineCapacity capacity() const override {
    return {gpu_pages_, host_pages_, gpu_slots_, host_slots_, page_bytes_, snapshot_bytes_};
  }

  CountingStats stats() const;
  /// Tickets submitted and not yet released.
  std::size_t outstanding() const;

 private:
  const std::uint32_t gpu_pages_, host_pages_, gpu_slots_, host_slots_;
  const std::size_t page_bytes_, snapshot_bytes_, slice_pages_;
  const Completion completion_;

  struct Entry {
    TransferState state;
    std::vector<TicketId> after;  ///< TransferBatch::after
  };
  /// Completes id after the pending tickets it runs after (mu_ held).
  void complete_locked(TicketId id);

  mutable std::mutex mu_;
  std::unordered_map<TicketId, Entry> tickets_;  // guarded by mu_
  std::uint32_t next_id_ = 0;                    // guarded by mu_
  CountingStats stats_;                          // guarded by mu_
};

}  // namespace radixtier::sim
