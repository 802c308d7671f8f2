// The host transfer engine: a byte-exact stand-in for GPU copies on machines without a GPU.
//
// HostArenas owns four real byte arenas: the "GPU" KV pool, the pinned host pool
// (CacheConfig::host_pool_pages() pages: KV pages and the pages snapshot pieces land in), the
// "GPU" snapshot slots and the host snapshot slots (the index-tier baseline's bank). A model
// running on the CPU reads and writes the GPU arenas exactly as a GPU model would read its
// pools, so every demoted and promoted byte is a real byte.
//
// HostTransferEngine copies between them. Every batch is cut into slices of at most
// `slice_pages` pages (snapshots into chunks of slice_pages * page_bytes bytes); each slice
// is copied source -> staging -> destination through one staging buffer per direction, so
// staging memory is bounded by one slice per direction whatever the batch size. A
// device-to-device batch (slot pieces between the "GPU" snapshot slots and the "GPU" KV
// pages) is cut into slices of slice_pages pieces too, copied directly: a GPU copies it on
// the device, without host staging.
//
// Modes:
//   kThreaded: a worker thread runs batches in submission order (a delayed one is skipped
//              until resumed, and so is one whose `after` tickets are still pending), as copy
//              streams would.
//   kManual:   nothing runs until the test calls complete(id) (any order) or wait(id): this
//              is how property tests complete transfers in an arbitrary order (device-to-device
//              batches ready to run run at submit unless set_device_copies_at_submit(false)).
//              Either first
//              runs the pending tickets the batch runs `after` (theirs first), so no byte of
//              it moves before theirs.
// TransferBatch::after: an id this engine never issued is refused (kInvalidArgument, nothing
// copied); a ticket released after it landed counts as landed; a ticket that failed (released
// or not) fails the batch that runs after it (its destinations poisoned, as any failed copy leaves
// them). TransferBatch::stream is ignored (no streams: stream_wait() is the default host wait).
// Faults: fail_ticket(id) / fail_nth_submission(n) make a chosen copy fail after its first
// slice, with its destination poisoned; delay_ticket(id) holds a copy until resume(id).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "radixtier/config.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

class HostArenas final : public HostPages {
 public:
  explicit HostArenas(const CacheConfig& config);

  /// The bytes of one page or snapshot. Every id is bounds-checked in every build (one
  /// compare): an id outside the arena throws std::out_of_range naming the id and the size.
  std::span<std::byte> gpu_page(GpuPageId id);
  std::span<std::byte> host_page(HostPageId id) override;
  std::span<std::byte> gpu_snapshot(GpuSlotId id);
  std::span<std::byte> host_snapshot(HostSlotId id);

  std::size_t page_bytes() const override { return page_bytes_; }
  std::size_t snapshot_bytes() const { return snapshot_bytes_; }
  std::uint32_t gpu_pages() const { return gpu_pages_; }
  std::uint32_t host_pages() const override { return host_pages_; }
  std::uint32_t gpu_slots() const { return gpu_slots_; }
  std::uint32_t host_slots() const { return host_slots_; }

 private:
  std::size_t page_bytes_, snapshot_bytes_;
  std::uint32_t gpu_pages_, host_pages_, gpu_slots_, host_slots_;
  std::vector<std::byte> gpu_kv_, host_kv_, gpu_snap_, host_snap_;
};

struct HostEngineStats {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2d = 0;  ///< device-to-device (slot pieces)
  std::uint64_t failed = 0;
  std::size_t staging_bytes = 0;  ///< bytes of the two staging buffers (bounded by the slice)
};

class HostTransferEngine final : public TransferEngine {
 public:
  enum class Mode { kThreaded, kManual };
  static constexpr std::byte kPoison{0xDB};

  HostTransferEngine(HostArenas& memory, std::size_t slice_pages, Mode mode = Mode::kThreaded);
  ~HostTransferEngine() override;
  HostTransferEngine(const HostTransferEngine&) = delete;
  HostTransferEngine& operator=(const HostTransferEngine&) = delete;

  Result<Ticket> submit(TransferBatch batch) override;
  TransferState poll(TicketId id) override;
  TransferState wait(TicketId id) override;
  void release(TicketId id) override;
  std::size_t slice_pages() const override { return slice_pages_; }
  /// The sizes of the arenas.
  EngineCapacity capacity() const override;
  HostPages* host_memory() override { return &memory_; }

  // --- fault injection -------------------------------------------------------------------
  void fail_ticket(TicketId id);
  /// The n-th submit() from now (0 = the next one) fails when it runs.
  void fail_nth_submission(std::uint64_t n);
  void delay_ticket(TicketId id);
  /// The n-th submit() from now (0 = the next one) is held until resume(its id): a copy that
  /// is certainly still in flight when its submitter returns, in either mode.
  void delay_nth_submission(std::uint64_t n);
  void resume(TicketId id);

  // --- manual mode -----------------------------------------------------------------------
  std::vector<TicketId> pending() const;
  /// Runs a pending ticket now (kManual only). Returns false for an unknown or finished one.
  bool complete(TicketId id);
  /// kManual: a device-to-device batch whose `after` tickets have all finished runs inside
  /// submit() (one that must wait for them stays pending as any other). On by default: tests
  /// that step the GPU-host copies by hand see the device copies land as a GPU's quickly do;
  /// off, every device copy waits for complete() too (the property tests complete every copy
  /// in an arbitrary order).
  void set_device_copies_at_submit(bool on);

  HostEngineStats stats() const;
  HostArenas& memory() { return memory_; }

 private:
  struct Job {
    TransferBatch batch;
    TransferState state = TransferState::kPending;
    bool fail = false;
    bool delayed = false;
    bool running = false;
    bool after_failed = false;  ///< a ticket it runs after failed and was released
  };

  Status validate(const TransferBatch& batch) const;
  Status validate_after_locked(const TransferBatch& batch) const;
  TransferState deps_state_locked(const Job& job) const;
  void run_with_deps(std::unique_lock<std::mutex>& lock, TicketId id);
  void worker_loop();
  // Runs the copy; mu_ must NOT be held (copies run unlocked). Returns success.
  // read_nothing (a ticket it runs after failed): no byte is read, the destinations are only
  // poisoned.
  bool run_copy(const TransferBatch& batch, bool fail, bool read_nothing);
  // The device-to-device part of run_copy (copy_mu_ held).
  bool run_device_copy(const TransferBatch& batch, bool fail, bool read_nothing);
  void copy_sliced(std::span<const std::byte> src, std::span<std::byte> dst,
                   std::vector<std::byte>& staging);
  void run_job(std::unique_lock<std::mutex>& lock, TicketId id);

  HostArenas& memory_;
  const std::size_t slice_pages_;
  const Mode mode_;

  mutable std::mutex mu_;
  std::condition_variable cv_;                        // guarded by mu_: jobs_ changes
  std::unordered_map<TicketId, Job> jobs_;            // guarded by mu_
  std::deque<TicketId> queue_;                        // guarded by mu_: submission order
  std::uint32_t next_id_ = 0;                         // guarded by mu_
  std::uint64_t submissions_ = 0;                     // guarded by mu_
  std::vector<std::uint64_t> fail_submissions_;       // guarded by mu_
  std::vector<std::uint64_t> delay_submissions_;      // guarded by mu_
  HostEngineStats stats_;                             // guarded by mu_
  bool stop_ = false;                                 // guarded by mu_
  bool device_at_submit_ = true;                      // guarded by mu_
  std::vector<std::byte> staging_d2h_, staging_h2d_;  // touched only by the running copy
  std::mutex copy_mu_;                                // one copy at a time (one engine "stream")
  std::thread worker_;
};

}  // namespace radixtier
