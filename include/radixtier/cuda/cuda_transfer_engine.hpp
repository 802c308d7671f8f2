// The CUDA transfer engine: radixtier::TransferEngine on a real GPU.
//
// Pools: the engine copies between a GPU KV pool and a GPU snapshot pool (any layout a
// DeviceLayout describes, e.g. the common [2, layers, pages, page_size, kv_heads, head_dim])
// and a pinned host KV pool and host snapshot pool in page-first layout (one host page or
// snapshot = one contiguous range). The engine owns none of the pools; create() checks that
// every segment lies inside device memory of the engine's device (cuMemGetAddressRange,
// VMM mappings included) and that the host pools are pinned.
//
// Streams and tickets: one non-blocking copy stream per direction, at the device's lowest
// priority. submit() plans the batch into slices and returns a ticket at once; the slices are
// enqueued on the direction's stream by that direction's feeder thread, at most
// `slices_in_flight` (default 2) ahead of the copy engines, so a large demotion never fills
// the driver queue and the two directions never wait for each other on the host (the
// promotion lane is its own thread). An event recorded after the last slice is the ticket;
// poll() is cudaEventQuery (kPending while slices remain to be enqueued), wait() enqueues
// what remains on the calling thread and then blocks in cudaEventSynchronize on a
// blocking-sync event (no spinning core). stream_wait() and stream_wait_layer() also enqueue
// what remains first, so a GPU-side wait never waits on an event that is not recorded yet.
// slices_in_flight = 0 enqueues every slice inside submit(), on the caller's thread.
//
// Device to device (Direction::kDeviceToDevice, TransferBatch::slot_pieces): a piece of a live
// snapshot slot to or from a GPU KV page (a page's bytes are its segments in order, as in its
// host page: a snapshot materialized into GPU pages has the same bytes as one demoted into
// host pages), slice_pages pieces per slice, each slice ONE slot-copy kernel launch that walks
// the runs where the slot's and the page's segments meet on the device (segment tables
// uploaded by create(); nothing uploaded or waited for per slice). d2d = kDmaBatch, or no
// kernel image: the runs by cudaMemcpyBatchAsync (one cudaMemcpyAsync per run without it). Its
// stream (and its feeder thread) is a third one, created by the first device-to-device submit(), so
// an engine that never copies on the device has the two streams only. A device-to-device copy
// always waits for the queued compute first (it reads or writes a slot or page the model's
// kernels use), whatever demote_after_compute and promote_after_compute say.
//
// Slices: pages go in slices of at most slice_pages pages, snapshots in chunks of at most
// slice_pages * page_bytes bytes. Each slice is one cudaMemcpyBatchAsync (kDmaBatch: the
// copy engines, no SM time) or one gather/scatter kernel launch per 1,024 pages on mapped
// pinned memory (kZeroCopyKernel, kernel_blocks CTAs, default 16: enough for PCIe, and the
// model keeps its SMs). kAuto (default) chooses per slice: the kernel when the slice's
// pieces average fewer than kernel_below_piece_bytes (small pieces are several times faster
// through the kernel than through the copy engines), DMA otherwise and always for snapshots.
//
// Promotions layer by layer: when the KV layout knows the layer of each segment
// (DeviceLayout::segment_layers, set by kv_layer_first and kv_per_layer), a promotion is
// enqueued layer group by layer group (promote_layer_groups; default one group per layer),
// with an event after each group. stream_wait_layer(ticket, layer, stream) makes the model's
// stream wait only for the groups up to that layer (and every snapshot of the batch), so
// the attention of layer 0 can start while the later layers still copy, as SGLang's HiCache
// does (LayerDoneCounter).
//
// Runtime fallbacks, each once and for good, reported in stats() and once through
// CudaEngineOptions::log: cudaMemcpyBatchAsync not available (cudaErrorNotSupported,
// cudaErrorCallRequiresNewerDriver, a runtime older than 12.8) -> one cudaMemcpyAsync per
// piece; no kernel image for the device (probed in create(), or refused at a launch) -> DMA.
//
// Streams of the caller: TransferBatch::stream names the stream a batch is ordered after
// (nullptr: compute_stream); TransferBatch::after the tickets it runs after (its copy stream
// waits on their events; a failed one fails it). The rule: pass the stream that last used
// what the batch touches; a wrong stream is a race the engine cannot see (docs/cuda.md).
// compute_stream is the model's stream on the engine's device: an
// explicit stream (a torch.cuda.Stream, a cudaStreamCreate'd stream) or nullptr /
// cudaStreamLegacy, the legacy default stream, which is PyTorch's default stream
// (torch.cuda.current_stream().cuda_stream == 0). cudaStreamPerThread is refused: it means a
// different stream on every thread.
//
// Ordering:
//   - compute -> copy: with demote_after_compute (default), submit() of a demotion records
//     an event on the compute stream and the copy stream waits for it, so a demotion reads a
//     page only after the kernels already queued that write it. promote_after_compute
//     (default true) does the same for promotions, so a promotion overwrites a GPU page only
//     after the kernels already queued that may still read its previous content. Set it to
//     false to let a promotion overlap the compute already queued: then the caller promises
//     that a GPU page it gives back to the cache is no longer read by any queued kernel.
//   - copy -> compute: stream_wait(ticket, stream) / stream_wait_layer(...) make a stream
//     wait on the GPU at the point the data is needed, so a kernel reading promoted pages may
//     be launched before the host sees the ticket done; a ticket seen kDone by poll()/wait()
//     has finished on the GPU.
//
// CUDA graphs and threads: every entry point runs in relaxed capture mode
// (cudaThreadExchangeStreamCaptureMode), so a poll(), wait() or ticket destructor on a cache
// thread while the server captures a graph on any stream, in any mode, neither fails nor
// invalidates that capture; the feeder threads run relaxed too. None of the engine's calls
// touches a captured stream: submit() refuses (kFailedPrecondition, nothing enqueued) while
// the compute stream is being captured (or, for the legacy stream, while a blocking stream
// is), since the copy would join the capture.
//
// Contexts: the engine retains its device's primary context, makes it current for every
// call that needs it and restores the caller's current context afterwards, "none" included
// (driver API cuCtxGetCurrent / cuCtxSetCurrent); it never calls cudaSetDevice, so it never
// creates a context on a device the caller did not use (a thread that never chose a device
// would otherwise get a 0.5 GiB context on GPU 0).
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
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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
  kAuto,            ///< per slice: the kernel for small pieces, DMA otherwise (default)
  kDmaBatch,        ///< cudaMemcpyBatchAsync of the slice's merged pieces (copy engines)
  kZeroCopyKernel,  ///< one gather/scatter kernel per slice on mapped pinned memory (SMs)
};

const char* to_string(CopyMethod method);

/// The oldest NVIDIA driver a CUDA runtime version (cudaRuntimeGetVersion) runs on: "580" for
/// 13.x, "525" for 12.x (minor-version compatibility), "450" for 11.x. This library links the
/// runtime statically: built with CUDA 13, it needs driver 580 even inside a PyTorch built for
/// CUDA 12 (which runs on 525); build it with the CUDA major version of the PyTorch it joins.
std::string driver_floor(int runtime_version);

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
  CopyMethod d2h = CopyMethod::kAuto;  ///< demotion (pages; snapshots always use DMA)
  CopyMethod h2d = CopyMethod::kAuto;  ///< promotion
  /// Device to device (slot pieces): kAuto and kZeroCopyKernel launch the slot copy kernel
  /// once per slice (DMA when it cannot run here); kDmaBatch copies the slice's runs with one
  /// cudaMemcpyBatchAsync (one cudaMemcpyAsync per run where the driver lacks it).
  CopyMethod d2d = CopyMethod::kAuto;
  /// kAuto: a slice of pages goes to the kernel when it has at least 4 pieces and they
  /// average fewer bytes than this (and the host pool is mapped); otherwise by DMA.
  std::size_t kernel_below_piece_bytes = std::size_t{32} << 10;
  /// The model's stream on `device`: an explicit stream, or nullptr / cudaStreamLegacy for
  /// the legacy default stream (PyTorch's default stream). See the header comment.
  cudaStream_t compute_stream = nullptr;
  bool demote_after_compute = true;   ///< a demotion waits for the queued compute (needed)
  bool promote_after_compute = true;  ///< a promotion waits for the queued compute
  /// Layer groups of a promotion when gpu_kv.segment_layers is set: 0 = one per layer,
  /// 1 = page order with one event per batch, n = n groups of consecutive layers.
  std::uint32_t promote_layer_groups = 0;
  int kernel_blocks = 0;      ///< zero-copy kernel grid size; 0: min(16, the device's SMs)
  int d2d_kernel_blocks = 0;  ///< slot copy kernel grid size; 0: 4 per SM (HBM to HBM)
  /// Slices each direction's feeder thread keeps enqueued ahead of the GPU; 0: no feeder
  /// threads, submit() enqueues every slice on the caller's thread.
  std::size_t slices_in_flight = 2;
  /// One line per notable event (a fallback, the first fatal error); unset: stderr.
  std::function<void(const std::string&)> log;
};

struct CudaEngineStats {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;
  std::uint64_t pieces = 0;  ///< DMA pieces after run merging
  std::uint64_t kernel_launches = 0;
  std::uint64_t auto_kernel_slices = 0;  ///< kAuto slices that went to the kernel
  std::uint64_t auto_dma_slices = 0;     ///< kAuto slices that went by DMA
  std::uint64_t layer_events = 0;        ///< per-group events recorded for promotions
  std::uint64_t urgent_feeds = 0;        ///< tickets whose rest was enqueued by wait/stream_wait
  std::uint64_t bytes_d2h = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2d = 0;  ///< device-to-device (slot pieces)
  std::uint64_t failed = 0;
  std::uint64_t refused_captures = 0;      ///< submits refused: the compute stream was captured
  std::uint64_t refused_stream_waits = 0;  ///< stream waits refused: the stream was captured
  std::uint64_t d2d_launches = 0;          ///< slot copy kernel launches (device to device)
  std::uint64_t d2d_dma_runs = 0;          ///< device-to-device runs copied by DMA instead
  std::uint64_t after_waits = 0;           ///< device waits on the tickets of TransferBatch::after
  std::uint32_t layer_groups = 1;          ///< groups a promotion of pages is ordered in
  bool dma_batch_fallback = false;         ///< per-piece cudaMemcpyAsync instead of the batch call
  std::string fallback_reason;             ///< why (the CUDA error, driver and runtime versions)
  bool kernel_fallback = false;            ///< the kernel cannot run here: DMA for every slice
  std::string kernel_fallback_reason;      ///< why (the CUDA error of the probe or the launch)
  bool fatal = false;                      ///< a sticky error was seen: see health()
  std::string last_error;                  ///< the last CUDA error that failed a ticket
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

  /// TransferEngine::stream_wait: `stream` nullptr is CudaEngineOptions::compute_stream (the
  /// interface's meaning; the overloads below take nullptr as the legacy stream); `layer` set:
  /// stream_wait_layer(). Refused (kFailedPrecondition, nothing enqueued) while `stream` is
  /// being captured: a wait on the copy's event, recorded outside the capture, would
  /// invalidate the graph. Wait in eager forwards only (a captured decode needs no promotion).
  Status stream_wait(TicketId id, StreamHandle stream, std::optional<std::uint32_t> layer) override;
  /// True: stream_wait() waits on the device, never on the host.
  bool waits_on_device() const override { return true; }
  /// Makes `stream` (explicit, or nullptr / cudaStreamLegacy: the legacy stream) wait on the
  /// GPU until the ticket's copies finished (no host wait for the copies; what remains to be
  /// enqueued is enqueued first). kTransferFailed for a failed ticket, kDeviceLost when fatal.
  Status stream_wait(TicketId id, cudaStream_t stream);
  /// The same for the pages of the layers up to `layer`'s group (and every snapshot of the
  /// batch) of a layered promotion; for any other ticket, the same as stream_wait().
  /// kInvalidArgument for a layer the KV layout does not have.
  Status stream_wait_layer(TicketId id, std::uint32_t layer, cudaStream_t stream);
  /// ok, or kDeviceLost (with the CUDA error) once a sticky error was seen.
  Status health() const;
  /// Test hook: slice `at_slice` (0: the first) of the next non-empty submit() issues a call
  /// CUDA rejects (an invalid source access order, an invalid copy direction, an impossible
  /// launch), so the ticket must come back kFailed after the slices before it ran.
  void inject_error_on_next_submit(std::size_t at_slice = 0);

  CudaEngineStats stats() const;
  const CudaEngineOptions& options() const { return options_; }
  /// The copy stream of a direction (kDeviceToDevice: nullptr until the first
  /// device-to-device submit() created it).
  cudaStream_t stream(Direction dir) const;
  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t snapshot_bytes() const { return snapshot_bytes_; }
  /// Layers of the KV layout (0 when gpu_kv.segment_layers is not set).
  std::uint32_t layers() const { return layers_; }
  /// The pinned host KV pool as host pages: what a disk tier reads and writes
  /// (DiskStoreEngine takes it, as it takes a HostTransferEngine's arenas).
  HostPages* host_memory() override { return &host_view_; }

 private:
  struct SubmitCounts {
    std::uint64_t slices = 0, pieces = 0, launches = 0, auto_kernel = 0, auto_dma = 0,
                  layer_events = 0, d2d_launches = 0, d2d_dma_runs = 0, after_waits = 0;
  };
  // One slice of a batch, planned at submit (descriptors only: pieces are planned when the
  // slice is enqueued).
  struct SliceDesc {
    enum class Kind : std::uint8_t { kPages, kPieces, kSnapshots, kSlotPieces } kind = Kind::kPages;
    std::uint32_t group = 0;  ///< kPages: the layer group
    std::size_t first = 0;    ///< kPages / kPieces / kSlotPieces: the first pair / piece;
                              ///< kSnapshots: the chunk
    std::size_t count = 0;
    bool ends_group = false;  ///< kPages: the group's event is recorded after this slice
  };
  // A submitted batch whose slices are being enqueued (guarded by its lane's mutex).
  struct Work {
    TicketId id;
    Direction dir = Direction::kDeviceToHost;
    std::vector<ItemPair> pairs;
    std::vector<SnapshotPieceCopy> pieces;
    std::vector<SlotPieceCopy> slot_pieces;  ///< kDeviceToDevice
    std::vector<std::vector<Piece>> snapshot_chunks;
    std::vector<SliceDesc> slices;
    std::size_t next = 0;             ///< the next slice to enqueue
    std::size_t groups_recorded = 0;  ///< group_events recorded so far
    bool started = false;             ///< the copy stream waits for `ready` already
    bool finished = false;            ///< every slice and event enqueued (or given up)
    cudaEvent_t ready = nullptr;      ///< recorded on the batch's stream by submit(); null: none
    /// TransferBatch::after: the done events of the tickets still pending at submit() (held:
    /// not recycled until the copy stream waits on them, before the first slice).
    std::vector<cudaEvent_t> after_events;
    std::vector<TicketId> after_held;
    std::vector<cudaEvent_t> group_events;  ///< groups 0..G-2 (the last group's is `done`)
    cudaEvent_t done = nullptr;
    std::int64_t inject = -1;
    cudaError_t err = cudaSuccess;  ///< the first enqueue error: the rest is skipped
    SubmitCounts counts;
  };
  struct Job {
    cudaEvent_t event = nullptr;  ///< null: nothing left in flight (already synchronized)
    std::vector<cudaEvent_t> group_events;
    cudaEvent_t ready = nullptr;
    std::shared_ptr<Work> work;  ///< set until every slice is enqueued
    Direction dir = Direction::kDeviceToHost;
    bool failed = false;
    TransferState state = TransferState::kPending;
    int waiters = 0;        ///< threads inside wait(): the event is not recycled under them
    bool released = false;  ///< release() came while waiters > 0: the last waiter erases
    /// Set when this ticket ends failed; shared with the tickets that run after it.
    std::shared_ptr<bool> failed_flag;
    /// TransferBatch::after tickets pending at submit(): their ids and failure flags. This
    /// ticket ends failed when one of them did.
    std::vector<std::pair<TicketId, std::shared_ptr<bool>>> after;
  };
  struct Lane {     // per direction: the feeder, its queue, one slice's descriptors
    std::mutex mu;  ///< held while a slice is enqueued on the direction's stream
    std::condition_variable cv;
    std::deque<std::shared_ptr<Work>> queue;
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    std::vector<Piece> pieces;      ///< the slice being planned
    std::vector<cudaEvent_t> ring;  ///< one event per slice in flight (the feeder's)
    std::size_t ring_next = 0, in_flight = 0;
    bool stop = false;
    std::thread feeder;
  };
  // The pinned host KV pool as HostPages (the disk tier's view).
  class HostView final : public HostPages {
   public:
    explicit HostView(const CudaTransferEngine& e) : e_(e) {}
    std::size_t page_bytes() const override { return e_.page_bytes_; }
    std::uint32_t host_pages() const override { return e_.pools_.host_pages; }
    std::span<std::byte> host_page(HostPageId id) override;

   private:
    const CudaTransferEngine& e_;
  };

  static constexpr std::uint32_t kAllGroups = 0xFFFFFFFFu;  ///< SliceDesc::group: every segment

  CudaTransferEngine(CudaPools pools, CudaEngineOptions options, detail::CudaRuntime& rt);
  static constexpr std::size_t kLanes = 3;  ///< D2H, H2D, D2D (the last one opened on demand)
  static std::size_t index(Direction dir) {
    return dir == Direction::kDeviceToHost ? 0 : dir == Direction::kHostToDevice ? 1 : 2;
  }
  Status validate(const TransferBatch& batch) const;
  /// Creates the device-to-device stream, its event ring and feeder on first use.
  Status open_d2d_lane();
  std::shared_ptr<Work> plan(TransferBatch& batch, TicketId id) const;
  // Enqueue (under the work's lane mutex).
  void feed_slice(Lane& lane, Work& w);
  void feed_all(const std::shared_ptr<Work>& w);
  void finish(Lane& lane, Work& w);
  cudaError_t enqueue_slice(Work& w, const SliceDesc& d, bool inject);
  cudaError_t enqueue_dma(Direction dir, std::span<const Piece> pieces, std::byte* host_base,
                          bool inject, SubmitCounts& counts);
  cudaError_t enqueue_kernel(Direction dir, std::span<const ItemPair> pairs, std::uint32_t group,
                             bool inject, SubmitCounts& counts);
  cudaError_t enqueue_slot_pieces(std::span<const SlotPieceCopy> pieces, bool inject,
                                  SubmitCounts& counts);
  cudaError_t enqueue_slot_kernel(std::span<const SlotPieceCopy> pieces, bool inject,
                                  SubmitCounts& counts);
  void feeder_loop(Direction dir);
  std::size_t group_of_layer(std::uint32_t layer) const;
  void plan_pieces(std::span<const ItemPair> pairs, std::uint32_t group,
                   std::vector<Piece>& out) const;
  void note_fallback(cudaError_t err);
  void note_kernel_fallback(cudaError_t err, const char* where);
  void log(const std::string& line) const;
  Status wait_on(TicketId id, std::int64_t layer, cudaStream_t stream);
  /// Whether this engine ever handed out `id` (TransferBatch::after: a released ticket is
  /// skipped, an id never issued is kInvalidArgument). Under mu_.
  bool issued(TicketId id) const;
  /// The next ticket id (under mu_).
  TicketId take_id();
  /// A ticket that ends at once with `state`, nothing enqueued (under mu_).
  Ticket settled_ticket(TransferState state);
  /// Ends a hold of TransferBatch::after on a ticket's events (under mu_).
  void unhold(TicketId id);
  // The rest run under mu_.
  cudaEvent_t acquire_event();
  TransferState settle(Job& job, cudaError_t query, const char* where);
  void recycle(Job& job);
  Status mark_fatal(cudaError_t err, const char* where);

  detail::CudaRuntime& rt_;
  CudaPools pools_;
  CudaEngineOptions options_;
  std::size_t page_bytes_ = 0, snapshot_bytes_ = 0;
  CUcontext ctx_ = nullptr;  ///< the device's primary context (retained)
  bool ctx_retained_ = false;
  cudaStream_t compute_ = nullptr;  ///< options_.compute_stream, nullptr as cudaStreamLegacy
  cudaStream_t streams_[kLanes] = {nullptr, nullptr, nullptr};  ///< D2D: see open_d2d_lane
  void* device_segments_ = nullptr;       ///< the KV segment table for the kernels, group-major
  void* device_slot_segments_ = nullptr;  ///< the snapshot slot segment table, logical order
  int slot_segment_count_ = 0;
  int d2d_blocks_ = 0;
  std::vector<std::uint32_t> group_first_, group_count_;    ///< per group: its table range
  std::vector<std::vector<std::uint32_t>> group_segments_;  ///< per group: its segments
  std::vector<std::uint32_t> segment_group_;                ///< per segment: its group
  std::uint32_t layers_ = 0, groups_ = 1;
  int kernel_blocks_ = 0;
  bool host_mapped_ = false;  ///< the host KV pool is mapped at its host address
  std::atomic<bool> batch_fallback_{false};
  std::atomic<bool> kernel_fallback_{false};
  std::atomic<std::int64_t> inject_slice_{-1};
  HostView host_view_{*this};

  Lane lanes_[kLanes];
  mutable std::mutex d2d_mu_;  ///< guards the opening of the D2D lane (streams_[2], its feeder)
  bool d2d_open_ = false;      // guarded by d2d_mu_
  mutable std::mutex mu_;
  std::unordered_map<TicketId, Job> jobs_;  // guarded by mu_
  std::vector<cudaEvent_t> free_events_;    // guarded by mu_
  std::uint32_t next_id_ = 0;               // guarded by mu_
  std::uint32_t first_id_ = 0;              ///< the first id handed out
  std::uint64_t ids_spent_ = 0;             // guarded by mu_: ids taken (or skipped) so far
  CudaEngineStats stats_;                   // guarded by mu_
  Status fatal_;                            // guarded by mu_
};

}  // namespace radixtier::cuda
