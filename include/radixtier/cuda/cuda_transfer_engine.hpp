// The CUDA transfer engine: radixtier::TransferEngine on a real GPU.
//
// Pools: the engine copies between a GPU KV pool and a GPU snapshot pool (any layout a
// DeviceLayout describes, e.g. the common [2, layers, pages, page_size, kv_heads, head_dim])
// and a pinned host KV pool and host snapshot pool in page-first layout (one host page or
// snapshot = one contiguous range). The engine owns none of the pools.
//
// Streams and tickets: one non-blocking copy stream per direction, at the device's lowest
// priority. submit() enqueues every slice of the batch on its direction's stream and records
// one CUDA event after the last slice: the ticket. poll() is cudaEventQuery, wait() is
// cudaEventSynchronize.
//
// Slices: pages go in slices of at most slice_pages pages, snapshots in chunks of at most
// slice_pages * page_bytes bytes. Each slice is one cudaMemcpyBatchAsync (kDmaBatch: the
// copy engines, no SM time) or one gather/scatter kernel launch per 1,024 pages on mapped
// pinned memory (kZeroCopyKernel). Neither needs device staging memory. A slice is planned
// without any lock and enqueued under its direction's lock only, so a slow enqueue (a full
// driver queue) never stalls poll(), stream_wait() or the other direction.
//
// Runtime fallback: when cudaMemcpyBatchAsync is not available (cudaErrorNotSupported,
// cudaErrorCallRequiresNewerDriver, or a runtime older than 12.8), the engine switches once
// and for good to one cudaMemcpyAsync per piece, retries the slice that way, and reports it
// in stats().dma_batch_fallback / fallback_reason and once through CudaEngineOptions::log.
//
// Streams of the caller: compute_stream is required and must be an explicit stream of the
// engine's device (a torch.cuda.Stream, a cudaStreamCreate'd stream). nullptr (the legacy
// default stream) and cudaStreamPerThread are refused by create(): ordering against them
// depends on which thread calls, and a model on a non-blocking stream does not order against
// the legacy stream at all.
//
// Ordering:
//   - compute -> copy: with demote_after_compute (default), submit() of a demotion records
//     an event on the compute stream and the copy stream waits for it, so a demotion reads a
//     page only after the kernels already queued that write it. promote_after_compute
//     (default true) does the same for promotions, so a promotion overwrites a GPU page only
//     after the kernels already queued that may still read its previous content. Set it to
//     false to let a promotion overlap the compute already queued: then the caller promises
//     that a GPU page it gives back to the cache is no longer read by any queued kernel.
//   - copy -> compute: stream_wait(ticket, stream) makes a stream (the compute stream) wait
//     on the GPU for the ticket, at the point the data is needed, so a kernel reading
//     promoted pages may be launched before the host sees the ticket done; a ticket seen kDone
//     by poll()/wait() has finished on the GPU.
//
// CUDA graphs: submit() refuses (kFailedPrecondition, nothing enqueued) while the compute
// stream is being captured: the copy would join the capture and invalidate the server's
// graph. poll() does not query while it is captured (it answers kPending), since an event
// query is illegal during a global-mode capture.
//
// Errors:
//   - invalid ids: submit() returns kInvalidArgument and nothing is copied;
//   - a CUDA error while enqueueing makes the ticket kFailed (what was already enqueued still
//     finishes before the ticket leaves kPending, so its memory stays untouchable until then);
//     an error reported by the event (an asynchronous fault) makes it kFailed too. The cache
//     then degrades the prefix to recompute;
//   - a sticky error (illegal address, launch failure, ECC, Xid...: the context is lost, and
//     it may come from any kernel of the context, the model's included) is fatal: every
//     ticket reports kFailed, submit() and stream_wait() return kDeviceLost, and health()
//     returns kDeviceLost with the CUDA error. The server must check health() (e.g. when
//     tickets fail) and restart the process: recomputing on a lost context is pointless.
//   - last error: the engine leaves no error of its own as the thread's CUDA last error (a
//     pending poll's cudaErrorNotReady included) and never clears an error that was already
//     pending when a call began.
//   - device: every call that needs the engine's device makes it current and restores the
//     caller's current device before returning.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/cuda/pinned_host_pool.hpp"
#include "radixtier/cuda/transfer_plan.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::cuda {

namespace detail {
class CudaRuntime;
struct EngineSeams;
}  // namespace detail

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
  /// The pools' PinnedHostPool, when they come from one: the engine then takes the memory
  /// (when host_kv / host_snapshots are null) and the registration chunk size from it, and
  /// checks the pool is large enough. Recommended: a pool registers its memory in several
  /// ranges, and one DMA must not cross from one into the next.
  const PinnedHostPool* host_kv_pool = nullptr;
  const PinnedHostPool* host_snapshot_pool = nullptr;
  /// Registration chunk size for memory that does not come from a PinnedHostPool (one
  /// cudaHostRegister range every chunk bytes from the pool's start); 0 = one range.
  std::size_t host_kv_chunk_bytes = 0;
  std::size_t host_snapshot_chunk_bytes = 0;
};

struct CudaEngineOptions {
  int device = 0;
  std::size_t slice_pages = 128;
  CopyMethod d2h = CopyMethod::kDmaBatch;  ///< demotion (pages; snapshots always use DMA)
  CopyMethod h2d = CopyMethod::kDmaBatch;  ///< promotion
  /// The model's stream: required, an explicit stream of `device` (see the header comment).
  cudaStream_t compute_stream = nullptr;
  bool demote_after_compute = true;   ///< a demotion waits for the queued compute (needed)
  bool promote_after_compute = true;  ///< a promotion waits for the queued compute
  int kernel_blocks = 0;              ///< zero-copy kernel grid size; 0: the device's SM count
  /// One line per notable event (the DMA fallback, the first fatal error); unset: stderr.
  std::function<void(const std::string&)> log;
};

struct CudaEngineStats {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;
  std::uint64_t pieces = 0;  ///< DMA pieces after run merging
  std::uint64_t kernel_launches = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t failed = 0;
  std::uint64_t refused_captures = 0;  ///< submits refused: the compute stream was captured
  std::uint64_t deferred_polls = 0;    ///< polls answered kPending during a capture
  bool dma_batch_fallback = false;     ///< per-piece cudaMemcpyAsync instead of the batch call
  std::string fallback_reason;         ///< why (the CUDA error, driver and runtime versions)
  bool fatal = false;                  ///< a sticky error was seen: see health()
  std::string last_error;              ///< the last CUDA error that failed a ticket
};

class CudaTransferEngine final : public TransferEngine {
 public:
  /// Checks the options, the layouts, the compute stream, that the host pools are pinned
  /// (and mapped when a zero-copy method is chosen), creates the streams. Errors name the
  /// offending field.
  static Result<std::unique_ptr<CudaTransferEngine>> create(CudaPools pools,
                                                            CudaEngineOptions options);
  /// The same on substituted runtime calls (kernels/cuda_runtime.hpp; for tests).
  static Result<std::unique_ptr<CudaTransferEngine>> create(CudaPools pools,
                                                            CudaEngineOptions options,
                                                            const detail::EngineSeams& seams);
  ~CudaTransferEngine() override;
  CudaTransferEngine(const CudaTransferEngine&) = delete;
  CudaTransferEngine& operator=(const CudaTransferEngine&) = delete;

  Result<Ticket> submit(TransferBatch batch) override;
  TransferState poll(TicketId id) override;
  TransferState wait(TicketId id) override;
  void release(TicketId id) override;
  std::size_t slice_pages() const override { return options_.slice_pages; }
  /// The four pools and the bytes of one page (all layers) and one snapshot.
  EngineCapacity capacity() const override {
    return {pools_.gpu_kv.items, pools_.host_pages, pools_.gpu_snapshots.items,
            pools_.host_slots,   page_bytes_,       snapshot_bytes_};
  }

  /// Makes `stream` (explicit, not a pseudo-handle) wait on the GPU until the ticket's copies
  /// finished (no host wait). kTransferFailed for a failed ticket, kDeviceLost when fatal.
  Status stream_wait(TicketId id, cudaStream_t stream);
  /// ok, or kDeviceLost (with the CUDA error) once a sticky error was seen.
  Status health() const;
  /// Test hook: slice `at_slice` (0: the first) of the next non-empty submit() issues a call
  /// CUDA rejects (an invalid source access order, an invalid copy direction, an impossible
  /// launch), so the ticket must come back kFailed after the slices before it ran.
  void inject_error_on_next_submit(std::size_t at_slice = 0);

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
    int waiters = 0;        ///< threads inside wait(): the event is not recycled under them
    bool released = false;  ///< release() came while waiters > 0: the last waiter erases
  };
  struct Lane {  // per direction: the compute-ready event and one slice's descriptors
    std::mutex mu;
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    cudaEvent_t ready = nullptr;
  };
  struct SubmitCounts {
    std::uint64_t slices = 0, pieces = 0, launches = 0;
  };

  CudaTransferEngine(CudaPools pools, CudaEngineOptions options, detail::CudaRuntime& rt);
  static std::size_t index(Direction dir) { return dir == Direction::kDeviceToHost ? 0 : 1; }
  Status validate(const TransferBatch& batch) const;
  cudaError_t enqueue(const TransferBatch& batch, std::int64_t inject, SubmitCounts& counts);
  cudaError_t enqueue_dma(Direction dir, std::span<const Piece> pieces, std::byte* host_base,
                          bool inject, SubmitCounts& counts);
  cudaError_t enqueue_kernel(Direction dir, std::span<const ItemPair> pairs, bool inject,
                             SubmitCounts& counts);
  void note_fallback(cudaError_t err);
  void log(const std::string& line) const;
  // The rest run under mu_.
  cudaEvent_t acquire_event();
  TransferState settle(Job& job, cudaError_t query, const char* where);
  void recycle(Job& job);
  Status mark_fatal(cudaError_t err, const char* where);

  detail::CudaRuntime& rt_;
  CudaPools pools_;
  CudaEngineOptions options_;
  std::size_t page_bytes_ = 0, snapshot_bytes_ = 0;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  void* device_segments_ = nullptr;  ///< the KV segment table for the kernels
  int kernel_blocks_ = 0;
  std::atomic<bool> batch_fallback_{false};
  std::atomic<std::int64_t> inject_slice_{-1};

  Lane lanes_[2];
  mutable std::mutex mu_;
  std::unordered_map<TicketId, Job> jobs_;  // guarded by mu_
  std::vector<cudaEvent_t> free_events_;    // guarded by mu_
  std::uint32_t next_id_ = 0;               // guarded by mu_
  CudaEngineStats stats_;                   // guarded by mu_
  Status fatal_;                            // guarded by mu_
};

}  // namespace radixtier::cuda
