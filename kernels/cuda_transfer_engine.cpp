// The CUDA transfer engine (see include/radixtier/cuda/cuda_transfer_engine.hpp).
#include "radixtier/cuda/cuda_transfer_engine.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "copy_kernels.hpp"

namespace radixtier::cuda {
namespace {

std::string cuda_error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

// The host pool must be pinned (registered or cudaHostAlloc'd) for async DMA, and mapped for
// the zero-copy kernels.
Status check_host_pool(const char* name, const void* ptr, bool need_mapped) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return invalid_argument(std::string("CudaPools.") + name + ": " +
                            cuda_error("cudaPointerGetAttributes", err));
  }
  if (attr.type != cudaMemoryTypeHost)
    return invalid_argument(std::string("CudaPools.") + name +
                            " is not pinned host memory (use PinnedHostPool)");
  if (need_mapped && attr.devicePointer != ptr)
    return invalid_argument(
        std::string("CudaPools.") + name +
        " is not mapped at its host address (a zero-copy method needs "
        "cudaHostRegisterMapped and cudaDevAttrCanUseHostPointerForRegisteredMem)");
  return Status::ok();
}

}  // namespace

const char* to_string(CopyMethod method) {
  return method == CopyMethod::kDmaBatch ? "dma-batch" : "zero-copy-kernel";
}

Result<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::create(CudaPools pools,
                                                                       CudaEngineOptions options) {
  if (options.slice_pages == 0)
    return invalid_argument("CudaEngineOptions.slice_pages: must be at least 1 page");
  if (Status s = pools.gpu_kv.validate("CudaPools.gpu_kv"); !s) return s;
  if (pools.gpu_snapshots.items > 0) {
    if (Status s = pools.gpu_snapshots.validate("CudaPools.gpu_snapshots"); !s) return s;
  }
  if (pools.host_pages > 0 && pools.host_kv == nullptr)
    return invalid_argument("CudaPools.host_kv: null with host_pages > 0");
  if (pools.host_slots > 0 && pools.host_snapshots == nullptr)
    return invalid_argument("CudaPools.host_snapshots: null with host_slots > 0");
  if (pools.host_slots > 0 && pools.gpu_snapshots.items == 0)
    return invalid_argument("CudaPools.host_slots: > 0 but gpu_snapshots has no slots");
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return invalid_argument(err != cudaSuccess ? cuda_error("no CUDA device", err)
                                               : std::string("no CUDA device visible"));
  }
  if (options.device < 0 || options.device >= count)
    return invalid_argument("CudaEngineOptions.device: " + std::to_string(options.device) +
                            " but " + std::to_string(count) + " device(s) visible");
  if (cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess)
    return invalid_argument(cuda_error("cudaSetDevice", err));
  const bool zero_copy =
      options.d2h == CopyMethod::kZeroCopyKernel || options.h2d == CopyMethod::kZeroCopyKernel;
  if (pools.host_pages > 0) {
    if (Status s = check_host_pool("host_kv", pools.host_kv, zero_copy); !s) return s;
  }
  if (pools.host_slots > 0) {
    if (Status s = check_host_pool("host_snapshots", pools.host_snapshots, false); !s) return s;
  }

  std::unique_ptr<CudaTransferEngine> engine(new CudaTransferEngine(std::move(pools), options));
  CudaTransferEngine& e = *engine;
  for (cudaStream_t& s : e.streams_) {
    if (cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); err != cudaSuccess)
      return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaStreamCreate", err));
  }
  for (Lane& lane : e.lanes_) {
    if (cudaError_t err = cudaEventCreateWithFlags(&lane.ready, cudaEventDisableTiming);
        err != cudaSuccess)
      return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaEventCreate", err));
  }
  // The kernels' segment table.
  std::vector<detail::DeviceSegment> table;
  std::size_t host_offset = 0;
  for (const StridedSegment& s : e.pools_.gpu_kv.segments) {
    table.push_back({s.base, s.item_stride, s.bytes, host_offset});
    host_offset += s.bytes;
  }
  const std::size_t table_bytes = table.size() * sizeof(detail::DeviceSegment);
  if (cudaError_t err = cudaMalloc(&e.device_segments_, table_bytes); err != cudaSuccess)
    return out_of_memory(cuda_error("cudaMalloc of the segment table", err));
  if (cudaError_t err =
          cudaMemcpy(e.device_segments_, table.data(), table_bytes, cudaMemcpyHostToDevice);
      err != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition, cuda_error("segment table upload", err));
  e.vector_path_ = e.pools_.gpu_kv.aligned_to(16) &&
                   reinterpret_cast<std::uintptr_t>(e.pools_.host_kv) % 16 == 0;
  int sms = 0;
  (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device);
  e.kernel_blocks_ = options.kernel_blocks > 0 ? options.kernel_blocks : std::max(1, sms);
  return engine;
}

CudaTransferEngine::CudaTransferEngine(CudaPools pools, CudaEngineOptions options)
    : pools_(std::move(pools)),
      options_(options),
      page_bytes_(pools_.gpu_kv.item_bytes()),
      snapshot_bytes_(pools_.gpu_snapshots.item_bytes()) {}

CudaTransferEngine::~CudaTransferEngine() {
  (void)cudaSetDevice(options_.device);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)cudaStreamSynchronize(s);
  }
  for (auto& [id, job] : jobs_) {
    if (job.event != nullptr) (void)cudaEventDestroy(job.event);
  }
  for (cudaEvent_t ev : free_events_) (void)cudaEventDestroy(ev);
  for (Lane& lane : lanes_) {
    if (lane.ready != nullptr) (void)cudaEventDestroy(lane.ready);
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  if (device_segments_ != nullptr) (void)cudaFree(device_segments_);
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

cudaError_t CudaTransferEngine::enqueue_dma(Direction dir, std::span<const Piece> pieces,
                                            std::byte* host_base) {
  Lane& lane = lanes_[index(dir)];
  const bool to_host = dir == Direction::kDeviceToHost;
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
  // Test hook: a real, synchronous CUDA error (documented cudaErrorInvalidValue for an
  // invalid source access order; an invalid direction for the per-piece fallback).
  const bool inject = std::exchange(inject_error_, false);
  stats_.pieces += pieces.size();
  cudaStream_t stream = streams_[index(dir)];
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = inject ? cudaMemcpySrcAccessOrderInvalid : cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  std::size_t attr_index = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(lane.dsts.data(), lane.srcs.data(), lane.sizes.data(),
                              lane.dsts.size(), &attr, &attr_index, 1, stream);
#else
  std::size_t fail_index = 0;
  return cudaMemcpyBatchAsync(lane.dsts.data(), const_cast<void**>(lane.srcs.data()),
                              lane.sizes.data(), lane.dsts.size(), &attr, &attr_index, 1,
                              &fail_index, stream);
#endif
#else
  for (std::size_t i = 0; i < lane.dsts.size(); ++i) {
    const cudaError_t err =
        cudaMemcpyAsync(lane.dsts[i], lane.srcs[i], lane.sizes[i],
                        inject ? static_cast<cudaMemcpyKind>(-1) : cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
#endif
}

cudaError_t CudaTransferEngine::enqueue_kernel(Direction dir, std::span<const ItemPair> pairs) {
  static thread_local detail::LaunchItems items;  // 8 KiB: not on the stack
  const bool to_host = dir == Direction::kDeviceToHost;
  for (std::size_t first = 0; first < pairs.size(); first += detail::kMaxLaunchItems) {
    const std::size_t n = std::min<std::size_t>(detail::kMaxLaunchItems, pairs.size() - first);
    items.count = static_cast<std::uint32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      items.device[i] = pairs[first + i].device;
      items.host[i] = pairs[first + i].host;
    }
    std::byte* host = pools_.host_kv;
    if (inject_error_) {  // a real CUDA error: an impossible launch configuration
      inject_error_ = false;
      return detail::launch_gather_scatter(nullptr, 0, host, page_bytes_, items, to_host,
                                           vector_path_, 0, streams_[index(dir)]);
    }
    const cudaError_t err = detail::launch_gather_scatter(
        static_cast<const detail::DeviceSegment*>(device_segments_),
        static_cast<int>(pools_.gpu_kv.segments.size()), host, page_bytes_, items, to_host,
        vector_path_, kernel_blocks_, streams_[index(dir)]);
    ++stats_.kernel_launches;
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t CudaTransferEngine::enqueue(const TransferBatch& batch, std::uint64_t& slices) {
  const Direction dir = batch.direction;
  Lane& lane = lanes_[index(dir)];
  const CopyMethod method = dir == Direction::kDeviceToHost ? options_.d2h : options_.h2d;
  if (options_.order_after_compute) {
    if (cudaError_t err = cudaEventRecord(lane.ready, options_.compute_stream); err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaStreamWaitEvent(streams_[index(dir)], lane.ready, 0);
        err != cudaSuccess)
      return err;
  }
  // Pages: slices of at most slice_pages pages.
  std::vector<ItemPair> pairs;
  pairs.reserve(batch.pages.size());
  for (const PageCopy& p : batch.pages) pairs.push_back({p.gpu.value(), p.host.value()});
  const std::span<const ItemPair> all(pairs);
  for (std::size_t first = 0; first < all.size(); first += options_.slice_pages) {
    const auto slice = all.subspan(first, std::min(options_.slice_pages, all.size() - first));
    cudaError_t err;
    if (method == CopyMethod::kZeroCopyKernel) {
      err = enqueue_kernel(dir, slice);
    } else {
      lane.pieces.clear();
      append_item_pieces(pools_.gpu_kv, slice, pools_.host_kv_chunk_bytes, lane.pieces);
      err = enqueue_dma(dir, lane.pieces, pools_.host_kv);
    }
    if (err != cudaSuccess) return err;
    ++slices;
  }
  // Snapshot pieces (a snapshot spread over host KV pages): the window [offset, offset + n)
  // of the slot's bytes, cut along the slot's device segments, to one host page; by DMA,
  // slice_pages pieces per slice.
  for (std::size_t first = 0; first < batch.pieces.size(); first += options_.slice_pages) {
    const std::size_t last = std::min(batch.pieces.size(), first + options_.slice_pages);
    lane.pieces.clear();
    for (std::size_t i = first; i < last; ++i) {
      const SnapshotPieceCopy& sp = batch.pieces[i];
      const std::size_t end = sp.offset + piece_bytes(sp, page_bytes_, snapshot_bytes_);
      std::size_t at = 0;  // logical byte offset of the segment inside the snapshot
      for (const StridedSegment& seg : pools_.gpu_snapshots.segments) {
        const std::size_t lo = std::max(at, sp.offset), hi = std::min(at + seg.bytes, end);
        if (lo < hi) {
          lane.pieces.push_back(
              {seg.base + std::size_t{sp.gpu.value()} * seg.item_stride + (lo - at),
               std::size_t{sp.host.value()} * page_bytes_ + (lo - sp.offset), hi - lo});
        }
        at += seg.bytes;
      }
    }
    if (cudaError_t err = enqueue_dma(dir, lane.pieces, pools_.host_kv); err != cudaSuccess)
      return err;
    ++slices;
  }
  // Snapshots: chunks of at most slice_pages * page_bytes bytes, always by DMA (they are
  // large contiguous ranges, where the copy engines are at their best).
  if (batch.snapshots.empty()) return cudaSuccess;
  pairs.clear();
  for (const SnapshotCopy& s : batch.snapshots) pairs.push_back({s.gpu.value(), s.host.value()});
  cudaError_t result = cudaSuccess;
  for_each_byte_slice(pools_.gpu_snapshots, pairs, pools_.host_snapshot_chunk_bytes,
                      options_.slice_pages * page_bytes_, [&](std::span<const Piece> pieces) {
                        result = enqueue_dma(dir, pieces, pools_.host_snapshots);
                        if (result == cudaSuccess) ++slices;
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
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return ev;
}

Result<Ticket> CudaTransferEngine::submit(TransferBatch batch) {
  if (Status s = validate(batch); !s) return s;
  std::lock_guard lock(mu_);
  (void)cudaSetDevice(options_.device);
  const TicketId id(next_id_++);
  Job job;
  std::uint64_t slices = 0;
  const cudaError_t err = batch.empty() ? cudaSuccess : enqueue(batch, slices);
  cudaStream_t stream = streams_[index(batch.direction)];
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    job.failed = true;
    stats_.last_error = cuda_error("enqueue", err);
  }
  // The ticket's event follows everything enqueued, even after a failure, so the batch's
  // memory stays off-limits until the GPU is done with it.
  job.event = acquire_event();
  if (job.event == nullptr || cudaEventRecord(job.event, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    if (job.event != nullptr) free_events_.push_back(job.event);
    job.event = nullptr;
    job.failed = true;
    (void)cudaStreamSynchronize(stream);  // nothing to wait on later: drain now
    (void)cudaGetLastError();
  }
  ++stats_.batches;
  stats_.slices += slices;
  std::uint64_t bytes = batch.pages.size() * page_bytes_ + batch.snapshots.size() * snapshot_bytes_;
  for (const auto& p : batch.pieces) bytes += piece_bytes(p, page_bytes_, snapshot_bytes_);
  (batch.direction == Direction::kDeviceToHost ? stats_.bytes_d2h : stats_.bytes_h2d) += bytes;
  if (job.event == nullptr) settle(job, cudaSuccess);
  jobs_.emplace(id, job);
  return Ticket(this, id);
}

// Turns an event result into the job's final state; returns it (kPending while not ready).
TransferState CudaTransferEngine::settle(Job& job, cudaError_t query) {
  if (job.state != TransferState::kPending) return job.state;
  if (query == cudaErrorNotReady) return TransferState::kPending;
  if (query != cudaSuccess) {
    (void)cudaGetLastError();
    job.failed = true;
    stats_.last_error = cuda_error("transfer", query);
  }
  if (job.event != nullptr) {
    free_events_.push_back(job.event);
    job.event = nullptr;
  }
  job.state = job.failed ? TransferState::kFailed : TransferState::kDone;
  if (job.failed) ++stats_.failed;
  return job.state;
}

TransferState CudaTransferEngine::poll(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  Job& job = it->second;
  if (job.state != TransferState::kPending) return job.state;
  return settle(job, cudaEventQuery(job.event));
}

TransferState CudaTransferEngine::wait(TicketId id) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    if (it->second.state != TransferState::kPending) return it->second.state;
    ev = it->second.event;
  }
  // The event stays owned by the pending job until settle() runs under the lock, and only a
  // release of a finished job frees it, so synchronizing unlocked is safe.
  const cudaError_t err = cudaEventSynchronize(ev);
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  return settle(it->second, err);
}

void CudaTransferEngine::release(TicketId id) {
  if (poll(id) == TransferState::kPending) wait(id);  // never forget an in-flight copy
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it != jobs_.end() && it->second.state != TransferState::kPending) jobs_.erase(it);
}

Status CudaTransferEngine::stream_wait(TicketId id, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found("stream_wait: unknown ticket");
  if (it->second.event == nullptr) return Status::ok();  // finished: nothing to wait for
  if (cudaError_t err = cudaStreamWaitEvent(stream, it->second.event, 0); err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(ErrorCode::kTransferFailed, cuda_error("cudaStreamWaitEvent", err));
  }
  return Status::ok();
}

void CudaTransferEngine::inject_error_on_next_submit() {
  std::lock_guard lock(mu_);
  inject_error_ = true;
}

CudaEngineStats CudaTransferEngine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace radixtier::cuda
