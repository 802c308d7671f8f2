// The CUDA transfer engine: radixtier::TransferEngine on a real GPU.
//
// Pools: the engine copies between a GPU KV pool and a GPU snapshot pool (any layout a
// DeviceLayout describes, e.g. the common [2, layers, pages, page_size, kv_heads, head_dim])
// and a pinned host KV pool and host snapshot pool in page-first layout (one host page or
// snapshot = one contiguous range). The engine owns none of the pools.
//
// Streams and tickets: one non-blocking copy stream per direction. submit() enqueues every
// slice of the batch on its direction's stream and records one CUDA event after the last
// slice: the ticket. poll() is cudaEventQuery, wait() is cudaEventSynchronize.
//
// Slices: pages go in slices of at most slice_pages pages, snapshots in chunks of at most
// slice_pages * page_bytes bytes. Each slice is one cudaMemcpyBatchAsync (kDmaBatch: the
// copy engines, no SM time) or one gather/scatter kernel launch on mapped pinned memory
// (kZeroCopyKernel). Neither needs device staging memory; the host-side descriptors are one
// slice per direction, reused. Staging therefore never grows with the prefix.
//
// Ordering:
//   - compute -> copy: with order_after_compute (default), submit() records an event on the
//     compute stream and the copy stream waits for it, so a demotion reads a page only after
//     the kernels already queued that write it, and a promotion overwrites a page only after
//     the kernels already queued that read its previous content.
//   - copy -> compute: stream_wait(ticket, stream) makes a stream (the compute stream) wait
//     on the GPU for the ticket, so a kernel reading promoted pages may be launched before the
//     host sees the ticket done; a ticket seen kDone by poll()/wait() has finished on the GPU,
//     so the cache reuses a demoted page only after that.
//
// Errors: a CUDA error while enqueueing makes the ticket kFailed (what was already enqueued
// still finishes before the ticket leaves kPending, so its memory stays untouchable until
// then); an error reported by the event (an asynchronous fault) makes it kFailed too. The
// cache then degrades the prefix to recompute. Invalid ids are rejected by submit() with
// kInvalidArgument and nothing is copied.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/cuda/transfer_plan.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::cuda {

enum class CopyMethod {
  kDmaBatch,        ///< cudaMemcpyBatchAsync of the slice's merged pieces (copy engines)
  kZeroCopyKernel,  ///< one gather/scatter kernel per slice on mapped pinned memory (SMs)
};

const char* to_string(CopyMethod method);

struct CudaPools {
  DeviceLayout gpu_kv;                  ///< GPU KV pages
  DeviceLayout gpu_snapshots;           ///< GPU snapshot slots (items may be 0: no snapshots)
  std::byte* host_kv = nullptr;         ///< pinned, host_pages * gpu_kv.item_bytes() bytes
  std::uint32_t host_pages = 0;         ///< CacheConfig::host_pool_pages(): KV and snapshot pieces
  std::byte* host_snapshots = nullptr;  ///< pinned, host_slots * snapshot bytes
  std::uint32_t host_slots = 0;
  /// Host registration chunk size (PinnedHostPool::register_chunk_bytes()); 0 = one range.
  std::size_t host_kv_chunk_bytes = 0;
  std::size_t host_snapshot_chunk_bytes = 0;
};

struct CudaEngineOptions {
  int device = 0;
  std::size_t slice_pages = 128;
  CopyMethod d2h = CopyMethod::kDmaBatch;  ///< demotion (pages; snapshots always use DMA)
  CopyMethod h2d = CopyMethod::kDmaBatch;  ///< promotion
  cudaStream_t compute_stream = nullptr;   ///< nullptr: the legacy default stream
  bool order_after_compute = true;
  int kernel_blocks = 0;  ///< zero-copy kernel grid size; 0: the device's SM count
};

struct CudaEngineStats {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;
  std::uint64_t pieces = 0;  ///< DMA pieces after run merging
  std::uint64_t kernel_launches = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t failed = 0;
  std::string last_error;  ///< the last CUDA error that failed a ticket
};

class CudaTransferEngine final : public TransferEngine {
 public:
  /// Checks the layouts, that the host pools are pinned (and mapped when a zero-copy method
  /// is chosen), creates the streams. Errors name the offending field.
  static Result<std::unique_ptr<CudaTransferEngine>> create(CudaPools pools,
                                                            CudaEngineOptions options);
  ~CudaTransferEngine() override;
  CudaTransferEngine(const CudaTransferEngine&) = delete;
  CudaTransferEngine& operator=(const CudaTransferEngine&) = delete;

  Result<Ticket> submit(TransferBatch batch) override;
  TransferState poll(TicketId id) override;
  TransferState wait(TicketId id) override;
  void release(TicketId id) override;
  std::size_t slice_pages() const override { return options_.slice_pages; }

  /// Makes `stream` wait on the GPU until the ticket's copies finished (no host wait).
  Status stream_wait(TicketId id, cudaStream_t stream);
  /// Test hook: the next submit() enqueues a copy with an invalid pointer, so CUDA reports
  /// a real error and the ticket must come back kFailed.
  void inject_error_on_next_submit();

  CudaEngineStats stats() const;
  const CudaEngineOptions& options() const { return options_; }
  cudaStream_t stream(Direction dir) const { return streams_[index(dir)]; }
  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t snapshot_bytes() const { return snapshot_bytes_; }

 private:
  struct Job {
    cudaEvent_t event = nullptr;  ///< null: nothing left in flight (already synchronized)
    bool failed = false;
    TransferState state = TransferState::kPending;
  };
  struct Lane {  // per-direction scratch, touched under mu_ only: one slice's descriptors
    std::vector<Piece> pieces;
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    cudaEvent_t ready = nullptr;
  };

  CudaTransferEngine(CudaPools pools, CudaEngineOptions options);
  static std::size_t index(Direction dir) { return dir == Direction::kDeviceToHost ? 0 : 1; }
  Status validate(const TransferBatch& batch) const;
  cudaError_t enqueue(const TransferBatch& batch, std::uint64_t& slices);
  cudaError_t enqueue_dma(Direction dir, std::span<const Piece> pieces, std::byte* host_base);
  cudaError_t enqueue_kernel(Direction dir, std::span<const ItemPair> pairs);
  cudaEvent_t acquire_event();
  TransferState settle(Job& job, cudaError_t query);

  CudaPools pools_;
  CudaEngineOptions options_;
  std::size_t page_bytes_ = 0, snapshot_bytes_ = 0;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  void* device_segments_ = nullptr;  ///< the KV segment table for the kernels
  bool vector_path_ = false;         ///< 16-byte loads/stores are legal everywhere
  int kernel_blocks_ = 0;

  mutable std::mutex mu_;
  Lane lanes_[2];                           // guarded by mu_
  std::unordered_map<TicketId, Job> jobs_;  // guarded by mu_
  std::vector<cudaEvent_t> free_events_;    // guarded by mu_
  std::uint32_t next_id_ = 0;               // guarded by mu_
  bool inject_error_ = false;               // guarded by mu_
  CudaEngineStats stats_;                   // guarded by mu_
};

}  // namespace radixtier::cuda
