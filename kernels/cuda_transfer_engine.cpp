// The CUDA transfer engine (see include/radixtier/cuda/cuda_transfer_engine.hpp).
//
// Locks: mu_ guards the tickets, the event pool, the stats and the fatal status, and is held
// only for bookkeeping, never across a call that can block on the driver queue. Each
// direction's Lane::mu guards that direction's compute-ready event and descriptor arrays and
// is held while one slice is enqueued. Order: a lane lock may be taken before mu_, never
// after it.
//
// Every entry point opens a detail::ErrorScope (last-error hygiene) and, where it needs the
// device, a detail::DeviceGuard (the caller's current device is restored).
#include "radixtier/cuda/cuda_transfer_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>
#include <utility>

#include "copy_kernels.hpp"
#include "cuda_runtime.hpp"

namespace radixtier::cuda {
namespace {

using detail::classify;
using detail::ErrorClass;

std::string cuda_error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

std::string versions(detail::CudaRuntime& rt) {
  int driver = 0, runtime = 0;
  (void)rt.driver_get_version(&driver);
  (void)rt.runtime_get_version(&runtime);
  return "driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
}

// The host pool must be pinned (registered or cudaHostAlloc'd) for async DMA, and mapped for
// the zero-copy kernels; its last byte too (a pool shorter than its page count is refused).
Status check_host_pool(detail::CudaRuntime& rt, const char* name, const std::byte* ptr,
                       std::size_t bytes, bool need_mapped) {
  for (const std::byte* p : {ptr, ptr + bytes - 1}) {
    const char* where = p == ptr ? "" : " (its last byte)";
    cudaPointerAttributes attr{};
    const cudaError_t err = rt.pointer_get_attributes(&attr, p);
    if (err != cudaSuccess)
      return invalid_argument(std::string("CudaPools.") + name + where + ": " +
                              cuda_error("cudaPointerGetAttributes", err));
    if (attr.type != cudaMemoryTypeHost)
      return invalid_argument(std::string("CudaPools.") + name + where +
                              " is not pinned host memory (use PinnedHostPool)");
    if (need_mapped && attr.devicePointer != p)
      return invalid_argument(
          std::string("CudaPools.") + name + where +
          " is not mapped at its host address (a zero-copy method needs "
          "cudaHostRegisterMapped and cudaDevAttrCanUseHostPointerForRegisteredMem)");
  }
  return Status::ok();
}

// Takes memory and chunk size from a PinnedHostPool when one is given.
Status resolve_host_pool(const char* name, const PinnedHostPool* pool, std::byte*& data,
                         std::size_t& chunk, std::size_t needed) {
  if (pool == nullptr) return Status::ok();
  const std::string field = std::string("CudaPools.") + name;
  if (pool->data() == nullptr) return invalid_argument(field + "_pool: an empty PinnedHostPool");
  if (data == nullptr) data = pool->data();
  if (data != pool->data())
    return invalid_argument(field + ": differs from " + name + "_pool->data()");
  if (chunk != 0 && chunk != pool->register_chunk_bytes())
    return invalid_argument(field + "_chunk_bytes: " + std::to_string(chunk) + " but " + name +
                            "_pool registers in chunks of " +
                            std::to_string(pool->register_chunk_bytes()) + " bytes");
  chunk = pool->register_chunk_bytes();
  if (needed > pool->bytes())
    return invalid_argument(field + "_pool: " + std::to_string(pool->bytes()) + " bytes, but " +
                            std::to_string(needed) + " needed");
  return Status::ok();
}

Status stream_rule(const char* field, cudaStream_t s) {
  if (s == nullptr)
    return invalid_argument(std::string(field) +
                            ": nullptr is the legacy default stream; pass the model's own "
                            "stream (a torch.cuda.Stream, a cudaStreamCreate'd stream): a model "
                            "on a non-blocking stream does not order against the legacy stream");
  if (s == cudaStreamLegacy || s == cudaStreamPerThread)
    return invalid_argument(std::string(field) +
                            ": cudaStreamLegacy / cudaStreamPerThread mean the calling thread's "
                            "default stream, not the model's; pass the model's own stream");
  return Status::ok();
}

}  // namespace

const char* to_string(CopyMethod method) {
  return method == CopyMethod::kDmaBatch ? "dma-batch" : "zero-copy-kernel";
}

Result<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::create(CudaPools pools,
                                                                       CudaEngineOptions options) {
  return create(std::move(pools), std::move(options), detail::EngineSeams{});
}

Result<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::create(
    CudaPools pools, CudaEngineOptions options, const detail::EngineSeams& seams) {
  detail::CudaRuntime& rt = seams.runtime != nullptr ? *seams.runtime : detail::real_runtime();
  detail::ErrorScope scope(rt);
  if (options.slice_pages == 0)
    return invalid_argument("CudaEngineOptions.slice_pages: must be at least 1 page");
  if (options.kernel_blocks < 0)
    return invalid_argument("CudaEngineOptions.kernel_blocks: must be >= 0");
  if (Status s = stream_rule("CudaEngineOptions.compute_stream", options.compute_stream); !s)
    return s;
  if (Status s = pools.gpu_kv.validate("CudaPools.gpu_kv"); !s) return s;
  if (pools.gpu_snapshots.items > 0) {
    if (Status s = pools.gpu_snapshots.validate("CudaPools.gpu_snapshots"); !s) return s;
  }
  const std::size_t kv_bytes = std::size_t{pools.host_pages} * pools.gpu_kv.item_bytes();
  const std::size_t snap_bytes = std::size_t{pools.host_slots} * pools.gpu_snapshots.item_bytes();
  if (Status s = resolve_host_pool("host_kv", pools.host_kv_pool, pools.host_kv,
                                   pools.host_kv_chunk_bytes, kv_bytes);
      !s)
    return s;
  if (Status s = resolve_host_pool("host_snapshots", pools.host_snapshot_pool, pools.host_snapshots,
                                   pools.host_snapshot_chunk_bytes, snap_bytes);
      !s)
    return s;
  if (pools.host_pages > 0 && pools.host_kv == nullptr)
    return invalid_argument("CudaPools.host_kv: null with host_pages > 0");
  if (pools.host_slots > 0 && pools.host_snapshots == nullptr)
    return invalid_argument("CudaPools.host_snapshots: null with host_slots > 0");
  if (pools.host_slots > 0 && pools.gpu_snapshots.items == 0)
    return invalid_argument("CudaPools.host_slots: > 0 but gpu_snapshots has no slots");
  int count = 0;
  if (cudaError_t err = rt.get_device_count(&count); err != cudaSuccess || count == 0) {
    return Status(ErrorCode::kFailedPrecondition,
                  (err != cudaSuccess ? cuda_error("no CUDA device", err)
                                      : std::string("no CUDA device visible")) +
                      " (" + versions(rt) + ")");
  }
  if (options.device < 0 || options.device >= count)
    return invalid_argument("CudaEngineOptions.device: " + std::to_string(options.device) +
                            " but " + std::to_string(count) + " device(s) visible");
  detail::DeviceGuard guard(rt, options.device);
  if (guard.error() != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaSetDevice", guard.error()));
  int stream_device = -1;
  if (cudaError_t err = rt.stream_get_device(options.compute_stream, &stream_device);
      err == cudaSuccess) {
    if (stream_device != options.device)
      return invalid_argument("CudaEngineOptions.compute_stream: a stream of device " +
                              std::to_string(stream_device) + ", but the engine is on device " +
                              std::to_string(options.device));
  } else if (classify(err) != ErrorClass::kUnsupported) {
    return invalid_argument("CudaEngineOptions.compute_stream: not a valid stream (" +
                            cuda_error("cudaStreamGetDevice", err) + ")");
  }
  const bool zero_copy =
      options.d2h == CopyMethod::kZeroCopyKernel || options.h2d == CopyMethod::kZeroCopyKernel;
  if (pools.host_pages > 0) {
    if (Status s = check_host_pool(rt, "host_kv", pools.host_kv, kv_bytes, zero_copy); !s) return s;
  }
  if (pools.host_slots > 0) {
    if (Status s = check_host_pool(rt, "host_snapshots", pools.host_snapshots, snap_bytes, false);
        !s)
      return s;
  }

  std::unique_ptr<CudaTransferEngine> engine(
      new CudaTransferEngine(std::move(pools), std::move(options), rt));
  CudaTransferEngine& e = *engine;
  e.next_id_ = seams.first_ticket_id;
  // Copy streams at the lowest priority: the compute stream's kernels go first.
  int least = 0, greatest = 0;
  if (cudaError_t err = rt.device_get_stream_priority_range(&least, &greatest); err != cudaSuccess)
    least = 0;
  for (cudaStream_t& s : e.streams_) {
    if (cudaError_t err = rt.stream_create_with_priority(&s, cudaStreamNonBlocking, least);
        err != cudaSuccess) {
      s = nullptr;
      return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaStreamCreate", err));
    }
  }
  for (Lane& lane : e.lanes_) {
    if (cudaError_t err = rt.event_create_with_flags(&lane.ready, cudaEventDisableTiming);
        err != cudaSuccess) {
      lane.ready = nullptr;
      return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaEventCreate", err));
    }
  }
  // The kernels' segment table.
  std::vector<detail::DeviceSegment> table;
  std::size_t host_offset = 0;
  for (const StridedSegment& s : e.pools_.gpu_kv.segments) {
    table.push_back({s.base, s.item_stride, s.bytes, host_offset});
    host_offset += s.bytes;
  }
  const std::size_t table_bytes = table.size() * sizeof(detail::DeviceSegment);
  if (cudaError_t err = rt.malloc_device(&e.device_segments_, table_bytes); err != cudaSuccess) {
    e.device_segments_ = nullptr;
    return out_of_memory(cuda_error("cudaMalloc of the segment table", err));
  }
  if (cudaError_t err =
          rt.memcpy_sync(e.device_segments_, table.data(), table_bytes, cudaMemcpyHostToDevice);
      err != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition, cuda_error("segment table upload", err));
  int sms = 0;
  (void)rt.device_get_attribute(&sms, cudaDevAttrMultiProcessorCount, e.options_.device);
  e.kernel_blocks_ = e.options_.kernel_blocks > 0 ? e.options_.kernel_blocks : std::max(1, sms);
  return engine;
}

CudaTransferEngine::CudaTransferEngine(CudaPools pools, CudaEngineOptions options,
                                       detail::CudaRuntime& rt)
    : rt_(rt),
      pools_(std::move(pools)),
      options_(std::move(options)),
      page_bytes_(pools_.gpu_kv.item_bytes()),
      snapshot_bytes_(pools_.gpu_snapshots.item_bytes()) {}

CudaTransferEngine::~CudaTransferEngine() {
  detail::ErrorScope scope(rt_);
  detail::DeviceGuard guard(rt_, options_.device);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)rt_.stream_synchronize(s);
  }
  for (auto& [id, job] : jobs_) {
    if (job.event != nullptr) (void)rt_.event_destroy(job.event);
  }
  for (cudaEvent_t ev : free_events_) (void)rt_.event_destroy(ev);
  for (Lane& lane : lanes_) {
    if (lane.ready != nullptr) (void)rt_.event_destroy(lane.ready);
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)rt_.stream_destroy(s);
  }
  if (device_segments_ != nullptr) (void)rt_.free_device(device_segments_);
}

Status CudaTransferEngine::validate(const TransferBatch& b) const {
  std::ostringstream err;
  for (const auto& p : b.pages) {
    if (p.gpu.value() >= pools_.gpu_kv.items) err << p.gpu << " out of range; ";
    if (p.host.value() >= pools_.host_pages) err << p.host << " out of range; ";
  }
  for (const auto& s : b.snapshots) {
    if (s.gpu.value() >= pools_.gpu_snapshots.items) err << s.gpu << " out of range; ";
    if (s.host.value() >= pools_.host_slots) err << s.host << " out of range; ";
  }
  for (const auto& p : b.pieces) {
    if (p.gpu.value() >= pools_.gpu_snapshots.items) err << p.gpu << " out of range; ";
    if (p.host.value() >= pools_.host_pages) err << p.host << " out of range; ";
    if (p.offset >= snapshot_bytes_ || page_bytes_ == 0 || p.offset % page_bytes_ != 0)
      err << "snapshot piece offset " << p.offset
          << " is not a page multiple inside the snapshot; ";
  }
  if (err.tellp() > 0) return invalid_argument("transfer batch rejected: " + err.str());
  return Status::ok();
}

void CudaTransferEngine::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "radixtier: %s\n", line.c_str());
  }
}

void CudaTransferEngine::note_fallback(cudaError_t err) {
  if (batch_fallback_.exchange(true)) return;
  const std::string reason = cuda_error("cudaMemcpyBatchAsync", err) + " (" + versions(rt_) +
                             "): every DMA slice now uses one cudaMemcpyAsync per piece";
  {
    std::lock_guard lock(mu_);
    stats_.dma_batch_fallback = true;
    stats_.fallback_reason = reason;
  }
  log("CUDA engine: " + reason);
}

cudaError_t CudaTransferEngine::enqueue_dma(Direction dir, std::span<const Piece> pieces,
                                            std::byte* host_base, bool inject,
                                            SubmitCounts& counts) {
  Lane& lane = lanes_[index(dir)];
  const bool to_host = dir == Direction::kDeviceToHost;
  cudaStream_t stream = streams_[index(dir)];
  std::lock_guard lock(lane.mu);
  lane.dsts.clear();
  lane.srcs.clear();
  lane.sizes.clear();
  for (const Piece& p : pieces) {
    void* dev = reinterpret_cast<void*>(p.device);
    void* host = host_base + p.host_offset;
    lane.dsts.push_back(to_host ? host : dev);
    lane.srcs.push_back(to_host ? dev : host);
    lane.sizes.push_back(p.bytes);
  }
  counts.pieces += pieces.size();
  if (!batch_fallback_.load(std::memory_order_relaxed)) {
    // Test hook: a real, synchronous CUDA error (cudaErrorInvalidValue for an invalid source
    // access order).
    const cudaError_t err = rt_.memcpy_batch_async(
        lane.dsts.data(), lane.srcs.data(), lane.sizes.data(), lane.dsts.size(), inject, stream);
    if (classify(err) != ErrorClass::kUnsupported) return err;
    note_fallback(err);  // nothing of this slice was enqueued: redo it piece by piece
  }
  for (std::size_t i = 0; i < lane.dsts.size(); ++i) {
    // Test hook: an invalid copy direction on the slice's first piece.
    const auto kind = inject && i == 0 ? static_cast<cudaMemcpyKind>(-1) : cudaMemcpyDefault;
    const cudaError_t err =
        rt_.memcpy_async(lane.dsts[i], lane.srcs[i], lane.sizes[i], kind, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t CudaTransferEngine::enqueue_kernel(Direction dir, std::span<const ItemPair> pairs,
                                               bool inject, SubmitCounts& counts) {
  static thread_local detail::LaunchItems items;  // 8 KiB: not on the stack
  const bool to_host = dir == Direction::kDeviceToHost;
  for (std::size_t first = 0; first < pairs.size(); first += detail::kMaxLaunchItems) {
    const std::size_t n = std::min<std::size_t>(detail::kMaxLaunchItems, pairs.size() - first);
    items.count = static_cast<std::uint32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      items.device[i] = pairs[first + i].device;
      items.host[i] = pairs[first + i].host;
    }
    std::lock_guard lock(lanes_[index(dir)].mu);
    // Test hook: an impossible launch configuration (no segments, no blocks).
    const cudaError_t err = rt_.launch_gather_scatter(
        inject ? nullptr : static_cast<const detail::DeviceSegment*>(device_segments_),
        inject ? 0 : static_cast<int>(pools_.gpu_kv.segments.size()), pools_.host_kv, page_bytes_,
        items, to_host, inject ? 0 : kernel_blocks_, streams_[index(dir)]);
    if (err != cudaSuccess) return err;
    ++counts.launches;
  }
  return cudaSuccess;
}

cudaError_t CudaTransferEngine::enqueue(const TransferBatch& batch, std::int64_t inject,
                                        SubmitCounts& counts) {
  const Direction dir = batch.direction;
  Lane& lane = lanes_[index(dir)];
  const CopyMethod method = dir == Direction::kDeviceToHost ? options_.d2h : options_.h2d;
  const bool after_compute = dir == Direction::kDeviceToHost ? options_.demote_after_compute
                                                             : options_.promote_after_compute;
  if (after_compute) {
    std::lock_guard lock(lane.mu);
    if (cudaError_t err = rt_.event_record(lane.ready, options_.compute_stream); err != cudaSuccess)
      return err;
    if (cudaError_t err = rt_.stream_wait_event(streams_[index(dir)], lane.ready, 0);
        err != cudaSuccess)
      return err;
  }
  auto inject_here = [&] { return inject == static_cast<std::int64_t>(counts.slices); };
  // Pages: slices of at most slice_pages pages, each planned unlocked, enqueued on its own.
  std::vector<ItemPair> pairs;
  pairs.reserve(batch.pages.size());
  for (const PageCopy& p : batch.pages) pairs.push_back({p.gpu.value(), p.host.value()});
  const std::span<const ItemPair> all(pairs);
  std::vector<Piece> pieces;
  for (std::size_t first = 0; first < all.size(); first += options_.slice_pages) {
    const auto slice = all.subspan(first, std::min(options_.slice_pages, all.size() - first));
    cudaError_t err;
    if (method == CopyMethod::kZeroCopyKernel) {
      err = enqueue_kernel(dir, slice, inject_here(), counts);
    } else {
      pieces.clear();
      append_item_pieces(pools_.gpu_kv, slice, pools_.host_kv_chunk_bytes, pieces);
      err = enqueue_dma(dir, pieces, pools_.host_kv, inject_here(), counts);
    }
    if (err != cudaSuccess) return err;
    ++counts.slices;
  }
  // Snapshot pieces (a snapshot spread over pages of the host pool): the window
  // [offset, offset + n) of the slot's bytes, cut along the slot's device segments, to one
  // host page; by DMA, slice_pages pieces per slice.
  for (std::size_t first = 0; first < batch.pieces.size(); first += options_.slice_pages) {
    const std::size_t last = std::min(batch.pieces.size(), first + options_.slice_pages);
    pieces.clear();
    for (std::size_t i = first; i < last; ++i) {
      const SnapshotPieceCopy& sp = batch.pieces[i];
      const std::size_t end = sp.offset + piece_bytes(sp, page_bytes_, snapshot_bytes_);
      std::size_t at = 0;  // logical byte offset of the segment inside the snapshot
      for (const StridedSegment& seg : pools_.gpu_snapshots.segments) {
        const std::size_t lo = std::max(at, sp.offset), hi = std::min(at + seg.bytes, end);
        if (lo < hi) {
          pieces.push_back({seg.base + std::size_t{sp.gpu.value()} * seg.item_stride + (lo - at),
                            std::size_t{sp.host.value()} * page_bytes_ + (lo - sp.offset),
                            hi - lo});
        }
        at += seg.bytes;
      }
    }
    if (cudaError_t err = enqueue_dma(dir, pieces, pools_.host_kv, inject_here(), counts);
        err != cudaSuccess)
      return err;
    ++counts.slices;
  }
  // Snapshots: chunks of at most slice_pages * page_bytes bytes, always by DMA (they are
  // large contiguous ranges, where the copy engines are at their best).
  if (batch.snapshots.empty()) return cudaSuccess;
  pairs.clear();
  for (const SnapshotCopy& s : batch.snapshots) pairs.push_back({s.gpu.value(), s.host.value()});
  cudaError_t result = cudaSuccess;
  for_each_byte_slice(pools_.gpu_snapshots, pairs, pools_.host_snapshot_chunk_bytes,
                      options_.slice_pages * page_bytes_, [&](std::span<const Piece> slice) {
                        result =
                            enqueue_dma(dir, slice, pools_.host_snapshots, inject_here(), counts);
                        if (result == cudaSuccess) ++counts.slices;
                        return result == cudaSuccess;
                      });
  return result;
}

cudaEvent_t CudaTransferEngine::acquire_event() {
  if (!free_events_.empty()) {
    cudaEvent_t ev = free_events_.back();
    free_events_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  if (rt_.event_create_with_flags(&ev, cudaEventDisableTiming) != cudaSuccess) return nullptr;
  return ev;
}

Status CudaTransferEngine::mark_fatal(cudaError_t err, const char* where) {
  if (fatal_.is_ok()) {
    fatal_ = Status(ErrorCode::kDeviceLost,
                    "CUDA context lost: " + cuda_error(where, err) +
                        ". A sticky error: it may come from any kernel of this context, the "
                        "model's included; no copy can run again. Restart the process.");
    stats_.fatal = true;
    stats_.last_error = fatal_.message();
    log("CUDA engine: " + fatal_.message());
  }
  return fatal_;
}

Result<Ticket> CudaTransferEngine::submit(TransferBatch batch) {
  if (Status s = validate(batch); !s) return s;
  detail::ErrorScope scope(rt_);
  if (Status s = health(); !s) return s;
  const std::int64_t inject = batch.empty() ? -1 : inject_slice_.exchange(-1);
  if (batch.empty()) {  // nothing to copy: done at once, no CUDA call
    std::lock_guard lock(mu_);
    const TicketId id(detail::take_ticket_id(next_id_, jobs_));
    Job job;
    job.state = TransferState::kDone;
    jobs_.emplace(id, job);
    ++stats_.batches;
    return Ticket(this, id);
  }
  detail::DeviceGuard guard(rt_, options_.device);
  if (guard.error() != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(guard.error()) == ErrorClass::kFatal)
      return mark_fatal(guard.error(), "cudaSetDevice");
    return Status(ErrorCode::kTransferFailed, cuda_error("submit: cudaSetDevice", guard.error()));
  }
  // A capture of the compute stream would pull the copy stream into the graph (and the copy
  // would then fail and invalidate the server's capture): refuse before enqueueing anything.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t err = rt_.stream_is_capturing(options_.compute_stream, &capture);
      err != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamIsCapturing");
    return Status(ErrorCode::kFailedPrecondition,
                  cuda_error("submit: cudaStreamIsCapturing(compute_stream)", err));
  }
  if (capture != cudaStreamCaptureStatusNone) {
    std::lock_guard lock(mu_);
    ++stats_.refused_captures;
    return Status(ErrorCode::kFailedPrecondition,
                  std::string("submit: CudaEngineOptions.compute_stream is ") +
                      (capture == cudaStreamCaptureStatusActive ? "being captured"
                                                                : "in an invalidated capture") +
                      " into a CUDA graph; a copy submitted now would join the capture and "
                      "invalidate it. Nothing was enqueued: submit before or after the capture");
  }
  cudaEvent_t event = nullptr;
  {
    std::lock_guard lock(mu_);
    event = acquire_event();
  }
  if (event == nullptr)
    return Status(ErrorCode::kTransferFailed, "submit: cudaEventCreate failed; nothing enqueued");

  // Plan and enqueue slice by slice, without mu_.
  SubmitCounts counts;
  const cudaError_t err = enqueue(batch, inject, counts);
  cudaStream_t stream = streams_[index(batch.direction)];
  // The ticket's event follows everything enqueued, even after a failure, so the batch's
  // memory stays off-limits until the GPU is done with it.
  cudaError_t record;
  {
    std::lock_guard lock(lanes_[index(batch.direction)].mu);
    record = rt_.event_record(event, stream);
  }
  if (record != cudaSuccess) (void)rt_.stream_synchronize(stream);  // nothing to wait on later

  std::lock_guard lock(mu_);
  ++stats_.batches;
  stats_.slices += counts.slices;
  stats_.pieces += counts.pieces;
  stats_.kernel_launches += counts.launches;
  for (cudaError_t e : {err, record}) {
    if (classify(e) == ErrorClass::kFatal) {
      free_events_.push_back(event);
      ++stats_.failed;
      return mark_fatal(e, e == err ? "enqueue" : "cudaEventRecord");
    }
  }
  std::uint64_t bytes = batch.pages.size() * page_bytes_ + batch.snapshots.size() * snapshot_bytes_;
  for (const auto& p : batch.pieces) bytes += piece_bytes(p, page_bytes_, snapshot_bytes_);
  (batch.direction == Direction::kDeviceToHost ? stats_.bytes_d2h : stats_.bytes_h2d) += bytes;
  Job job;
  if (err != cudaSuccess) {
    job.failed = true;
    stats_.last_error = cuda_error("enqueue", err);
  }
  if (record == cudaSuccess) {
    job.event = event;
  } else {
    free_events_.push_back(event);
    job.failed = true;
    stats_.last_error = cuda_error("cudaEventRecord", record);
    settle(job, cudaSuccess, "submit");  // drained above: final now
  }
  const TicketId id(detail::take_ticket_id(next_id_, jobs_));
  jobs_.emplace(id, job);
  return Ticket(this, id);
}

void CudaTransferEngine::recycle(Job& job) {
  if (job.state != TransferState::kPending && job.waiters == 0 && job.event != nullptr) {
    free_events_.push_back(job.event);
    job.event = nullptr;
  }
}

// Turns an event result into the job's final state; returns it (kPending while not ready).
TransferState CudaTransferEngine::settle(Job& job, cudaError_t query, const char* where) {
  if (job.state != TransferState::kPending) return job.state;
  switch (classify(query)) {
    case ErrorClass::kNotReady:
    case ErrorClass::kCapture:  // a capture forbade the query: the copy is still in flight
      return TransferState::kPending;
    case ErrorClass::kOk:
      break;
    case ErrorClass::kFatal:
      job.failed = true;
      (void)mark_fatal(query, where);
      break;
    case ErrorClass::kUnsupported:
    case ErrorClass::kFailed:
      job.failed = true;
      stats_.last_error = cuda_error(where, query);
      break;
  }
  job.state = job.failed ? TransferState::kFailed : TransferState::kDone;
  if (job.failed) ++stats_.failed;
  recycle(job);
  return job.state;
}

TransferState CudaTransferEngine::poll(TicketId id) {
  detail::ErrorScope scope(rt_);
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  Job& job = it->second;
  if (job.state != TransferState::kPending) return job.state;
  // A lost context runs no copy any more: nothing of the batch can still be touched.
  if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "poll");
  // An event query during a (global-mode) capture would invalidate the capture: answer
  // kPending until it ends.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = rt_.stream_is_capturing(options_.compute_stream, &capture);
  if (classify(err) == ErrorClass::kFatal) return settle(job, err, "cudaStreamIsCapturing");
  if (err == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
    ++stats_.deferred_polls;
    return TransferState::kPending;
  }
  return settle(job, rt_.event_query(job.event), "cudaEventQuery");
}

TransferState CudaTransferEngine::wait(TicketId id) {
  detail::ErrorScope scope(rt_);
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    Job& job = it->second;
    if (job.state != TransferState::kPending) return job.state;
    if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "wait");
    ev = job.event;
    ++job.waiters;  // the event stays this job's until the last waiter is out
  }
  cudaError_t err = rt_.event_synchronize(ev);
  while (classify(err) == ErrorClass::kCapture) {  // a global capture forbids it for now
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    err = rt_.event_synchronize(ev);
  }
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  Job& job = it->second;  // waiters > 0: release() did not erase it
  --job.waiters;
  const TransferState state = settle(job, err, "cudaEventSynchronize");
  recycle(job);
  if (job.released && job.waiters == 0 && state != TransferState::kPending) jobs_.erase(it);
  return state;
}

void CudaTransferEngine::release(TicketId id) {
  if (poll(id) == TransferState::kPending) wait(id);  // never forget an in-flight copy
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state == TransferState::kPending) return;
  if (it->second.waiters > 0) {
    it->second.released = true;  // the last waiter erases it
  } else {
    jobs_.erase(it);
  }
}

Status CudaTransferEngine::stream_wait(TicketId id, cudaStream_t stream) {
  if (Status s = stream_rule("stream_wait: stream", stream); !s) return s;
  detail::ErrorScope scope(rt_);
  std::lock_guard lock(mu_);
  if (!fatal_.is_ok()) return fatal_;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found("stream_wait: unknown ticket");
  const Job& job = it->second;
  if (job.state == TransferState::kFailed)
    return Status(ErrorCode::kTransferFailed, "stream_wait: the ticket failed");
  if (job.state == TransferState::kDone || job.event == nullptr) return Status::ok();
  if (cudaError_t err = rt_.stream_wait_event(stream, job.event, 0); err != cudaSuccess) {
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamWaitEvent");
    return Status(ErrorCode::kTransferFailed, cuda_error("cudaStreamWaitEvent", err));
  }
  return Status::ok();
}

Status CudaTransferEngine::health() const {
  std::lock_guard lock(mu_);
  return fatal_;
}

void CudaTransferEngine::inject_error_on_next_submit(std::size_t at_slice) {
  inject_slice_.store(static_cast<std::int64_t>(at_slice));
}

CudaEngineStats CudaTransferEngine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace radixtier::cuda
