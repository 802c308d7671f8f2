// The CUDA engine's lifetime: create() (the options, the pools, the device and its primary
// context, the compute stream, the kernel probe, the layer groups, the copy streams and event
// rings, the kernels' segment table, the feeder threads), the destructor, the host-page view,
// and to_string(CopyMethod).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "copy_kernels.hpp"
#include "cuda_engine_internal.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"

namespace radixtier::cuda {
namespace {

using detail::check_device_layout;
using detail::check_host_pool;
using detail::classify;
using detail::cuda_error;
using detail::ErrorClass;
using detail::kEventFlags;
using detail::resolve_host_pool;
using detail::stream_rule;
using detail::versions;

constexpr int kDefaultKernelBlocks = 16;  // CTAs that saturate PCIe (issue 23)

}  // namespace

const char* to_string(CopyMethod method) {
  switch (method) {
    case CopyMethod::kAuto:
      return "auto";
    case CopyMethod::kDmaBatch:
      return "dma-batch";
    case CopyMethod::kZeroCopyKernel:
      return "zero-copy-kernel";
  }
  return "unknown";
}

Result<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::create(CudaPools pools,
                                                                       CudaEngineOptions options) {
  return create(std::move(pools), std::move(options), detail::EngineSeams{});
}

Result<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::create(
    CudaPools pools, CudaEngineOptions options, const detail::EngineSeams& seams) {
  detail::CudaRuntime& rt = seams.runtime != nullptr ? *seams.runtime : detail::real_runtime();
  detail::ErrorScope errors(rt);
  detail::CaptureModeGuard relaxed(rt);
  if (options.slice_pages == 0)
    return invalid_argument("CudaEngineOptions.slice_pages: must be at least 1 page");
  if (options.kernel_blocks < 0)
    return invalid_argument("CudaEngineOptions.kernel_blocks: must be >= 0");
  if (options.d2d_kernel_blocks < 0)
    return invalid_argument("CudaEngineOptions.d2d_kernel_blocks: must be >= 0");
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
    std::string why = err != cudaSuccess ? cuda_error("no CUDA device", err)
                                         : std::string("no CUDA device visible");
    if (err == cudaErrorInsufficientDriver) {
      int runtime = 0;
      (void)rt.runtime_get_version(&runtime);
      why += "; this library's static CUDA runtime " + std::to_string(runtime / 1000) + "." +
             std::to_string(runtime % 1000 / 10) +
             " needs an NVIDIA driver >= " + driver_floor(runtime) +
             " (build radixtier with the CUDA major version of the PyTorch it runs with)";
    }
    return Status(ErrorCode::kFailedPrecondition, why + " (" + versions(rt) + ")");
  }
  if (options.device < 0 || options.device >= count)
    return invalid_argument("CudaEngineOptions.device: " + std::to_string(options.device) +
                            " but " + std::to_string(count) + " device(s) visible");
  CUcontext ctx = nullptr;
  if (cudaError_t err = rt.primary_ctx_retain(&ctx, options.device); err != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition,
                  cuda_error("cuDevicePrimaryCtxRetain", err) + " (" + versions(rt) + ")");

  // From here on the engine owns the retained context (its destructor releases it).
  std::unique_ptr<CudaTransferEngine> engine(
      new CudaTransferEngine(std::move(pools), std::move(options), rt));
  CudaTransferEngine& e = *engine;
  e.ctx_ = ctx;
  e.ctx_retained_ = true;
  e.compute_ = detail::resolve_stream(e.options_.compute_stream);
  e.next_id_ = e.first_id_ = seams.first_ticket_id;
  const int device = e.options_.device;
  detail::ContextGuard guard(rt, ctx);
  if (guard.error() != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition, cuda_error("cuCtxSetCurrent", guard.error()));
  if (e.compute_ != cudaStreamLegacy) {
    unsigned flags = 0;
    if (cudaError_t err = rt.stream_get_flags(e.compute_, &flags); err != cudaSuccess)
      return invalid_argument("CudaEngineOptions.compute_stream: not a valid stream (" +
                              cuda_error("cudaStreamGetFlags", err) + ")");
    int stream_device = -1;
    if (cudaError_t err = rt.stream_get_device(e.compute_, &stream_device); err == cudaSuccess) {
      if (stream_device != device)
        return invalid_argument("CudaEngineOptions.compute_stream: a stream of device " +
                                std::to_string(stream_device) + ", but the engine is on device " +
                                std::to_string(device));
    } else if (classify(err) != ErrorClass::kUnsupported) {
      return invalid_argument("CudaEngineOptions.compute_stream: not a valid stream (" +
                              cuda_error("cudaStreamGetDevice", err) + ")");
    }
  }
  if (Status s = check_device_layout(rt, "gpu_kv", e.pools_.gpu_kv, device); !s) return s;
  if (e.pools_.gpu_snapshots.items > 0) {
    if (Status s = check_device_layout(rt, "gpu_snapshots", e.pools_.gpu_snapshots, device); !s)
      return s;
  }
  const bool zero_copy = e.options_.d2h == CopyMethod::kZeroCopyKernel ||
                         e.options_.h2d == CopyMethod::kZeroCopyKernel;
  const bool slot_kernel =
      e.pools_.gpu_snapshots.items > 0 && e.options_.d2d != CopyMethod::kDmaBatch;
  const bool may_use_kernel = zero_copy || slot_kernel || e.options_.d2h == CopyMethod::kAuto ||
                              e.options_.h2d == CopyMethod::kAuto;
  if (e.pools_.host_pages > 0) {
    if (Status s =
            check_host_pool(rt, "host_kv", e.pools_.host_kv, kv_bytes, zero_copy, e.host_mapped_);
        !s)
      return s;
  }
  if (e.pools_.host_slots > 0) {
    bool mapped = false;
    if (Status s = check_host_pool(rt, "host_snapshots", e.pools_.host_snapshots, snap_bytes, false,
                                   mapped);
        !s)
      return s;
  }
  // Is there a kernel image for this device? Without one, DMA for good.
  if (may_use_kernel) {
    if (cudaError_t err = rt.probe_kernel(); err != cudaSuccess) {
      if (classify(err) == ErrorClass::kFatal)
        return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaFuncGetAttributes", err));
      e.note_kernel_fallback(err, "probe (cudaFuncGetAttributes)");
    }
  }

  // Layer groups of promotions.
  const DeviceLayout& kv = e.pools_.gpu_kv;
  e.layers_ = kv.layers();
  if (e.layers_ > 0) {
    const std::uint32_t want = e.options_.promote_layer_groups;
    e.groups_ = want == 0 ? e.layers_ : std::min(want, e.layers_);
  }
  e.segment_group_.resize(kv.segments.size(), 0);
  e.group_segments_.assign(e.groups_, {});
  for (std::uint32_t s = 0; s < kv.segments.size(); ++s) {
    if (e.layers_ > 0)
      e.segment_group_[s] =
          static_cast<std::uint32_t>(std::uint64_t{kv.segment_layers[s]} * e.groups_ / e.layers_);
    e.group_segments_[e.segment_group_[s]].push_back(s);
  }
  e.stats_.layer_groups = e.groups_;

  // Copy streams at the lowest priority: the compute stream's kernels go first. The
  // device-to-device lane opens on first use (open_d2d_lane).
  int least = 0, greatest = 0;
  if (cudaError_t err = rt.device_get_stream_priority_range(&least, &greatest); err != cudaSuccess)
    least = 0;
  for (std::size_t i : {index(Direction::kDeviceToHost), index(Direction::kHostToDevice)}) {
    cudaStream_t& s = e.streams_[i];
    if (cudaError_t err = rt.stream_create_with_priority(&s, cudaStreamNonBlocking, least);
        err != cudaSuccess) {
      s = nullptr;
      return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaStreamCreate", err));
    }
  }
  for (std::size_t i : {index(Direction::kDeviceToHost), index(Direction::kHostToDevice)}) {
    Lane& lane = e.lanes_[i];
    lane.ring.assign(e.options_.slices_in_flight, nullptr);
    for (cudaEvent_t& ev : lane.ring) {
      if (cudaError_t err = rt.event_create_with_flags(&ev, kEventFlags); err != cudaSuccess) {
        ev = nullptr;
        return Status(ErrorCode::kFailedPrecondition, cuda_error("cudaEventCreate", err));
      }
    }
  }
  // The kernels' segment table, group by group (each entry carries its host offset).
  std::vector<std::size_t> host_offset(kv.segments.size());
  for (std::size_t s = 0, at = 0; s < kv.segments.size(); ++s) {
    host_offset[s] = at;
    at += kv.segments[s].bytes;
  }
  std::vector<detail::DeviceSegment> table;
  for (const std::vector<std::uint32_t>& group : e.group_segments_) {
    e.group_first_.push_back(static_cast<std::uint32_t>(table.size()));
    e.group_count_.push_back(static_cast<std::uint32_t>(group.size()));
    for (std::uint32_t s : group) {
      const StridedSegment& seg = kv.segments[s];
      table.push_back({seg.base, seg.item_stride, seg.bytes, host_offset[s]});
    }
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
  // The slot copy kernel's table of the snapshot slots' segments (device to device), uploaded
  // here once so that no device-to-device submit() uploads or waits for anything.
  if (e.pools_.gpu_snapshots.items > 0) {
    const std::vector<detail::DeviceSegment> slots = detail::segment_table(e.pools_.gpu_snapshots);
    const std::size_t bytes = slots.size() * sizeof(detail::DeviceSegment);
    if (cudaError_t err = rt.malloc_device(&e.device_slot_segments_, bytes); err != cudaSuccess) {
      e.device_slot_segments_ = nullptr;
      return out_of_memory(cuda_error("cudaMalloc of the slot segment table", err));
    }
    if (cudaError_t err =
            rt.memcpy_sync(e.device_slot_segments_, slots.data(), bytes, cudaMemcpyHostToDevice);
        err != cudaSuccess)
      return Status(ErrorCode::kFailedPrecondition, cuda_error("slot table upload", err));
    e.slot_segment_count_ = static_cast<int>(slots.size());
  }
  int sms = 0;
  (void)rt.device_get_attribute(&sms, cudaDevAttrMultiProcessorCount, device);
  e.d2d_blocks_ =
      e.options_.d2d_kernel_blocks > 0 ? e.options_.d2d_kernel_blocks : 4 * std::max(1, sms);
  e.kernel_blocks_ = e.options_.kernel_blocks > 0
                         ? e.options_.kernel_blocks
                         : std::min(kDefaultKernelBlocks, std::max(1, sms));
  if (e.options_.slices_in_flight > 0) {
    try {
      e.lanes_[index(Direction::kDeviceToHost)].feeder =
          std::thread(&CudaTransferEngine::feeder_loop, &e, Direction::kDeviceToHost);
      e.lanes_[index(Direction::kHostToDevice)].feeder =
          std::thread(&CudaTransferEngine::feeder_loop, &e, Direction::kHostToDevice);
    } catch (const std::system_error& ex) {
      return Status(ErrorCode::kFailedPrecondition,
                    std::string("CUDA engine: cannot start its feeder threads: ") + ex.what());
    }
  }
  return engine;
}

CudaTransferEngine::CudaTransferEngine(CudaPools pools, CudaEngineOptions options,
                                       detail::CudaRuntime& rt)
    : rt_(rt),
      pools_(std::move(pools)),
      options_(std::move(options)),
      page_bytes_(pools_.gpu_kv.item_bytes()),
      snapshot_bytes_(pools_.gpu_snapshots.item_bytes()) {}

// The third lane, on the first device-to-device submit() (on its thread, the engine's context
// current): its stream at the lowest priority, its event ring, its feeder. On an error nothing
// is left half made and the next device-to-device submit() tries again.
Status CudaTransferEngine::open_d2d_lane() {
  std::lock_guard lock(d2d_mu_);
  if (d2d_open_) return Status::ok();
  const std::size_t i = index(Direction::kDeviceToDevice);
  Lane& lane = lanes_[i];
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> ring(options_.slices_in_flight, nullptr);
  auto undo = [&](const char* what, cudaError_t err) {
    for (cudaEvent_t ev : ring) {
      if (ev != nullptr) (void)rt_.event_destroy(ev);
    }
    if (stream != nullptr) (void)rt_.stream_destroy(stream);
    streams_[i] = nullptr;
    std::lock_guard guard(mu_);
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, what);
    return Status(ErrorCode::kTransferFailed,
                  cuda_error(what, err) + " (the device-to-device stream); nothing enqueued");
  };
  int least = 0, greatest = 0;
  if (rt_.device_get_stream_priority_range(&least, &greatest) != cudaSuccess) least = 0;
  if (cudaError_t err = rt_.stream_create_with_priority(&stream, cudaStreamNonBlocking, least);
      err != cudaSuccess) {
    stream = nullptr;
    return undo("cudaStreamCreate", err);
  }
  for (cudaEvent_t& ev : ring) {
    if (cudaError_t err = rt_.event_create_with_flags(&ev, kEventFlags); err != cudaSuccess) {
      ev = nullptr;
      return undo("cudaEventCreate", err);
    }
  }
  {
    std::lock_guard lane_lock(lane.mu);
    lane.ring = ring;
  }
  streams_[i] = stream;  // before the feeder starts: it reads it
  if (options_.slices_in_flight > 0) {
    try {
      lane.feeder = std::thread(&CudaTransferEngine::feeder_loop, this, Direction::kDeviceToDevice);
    } catch (const std::system_error& ex) {
      {
        std::lock_guard lane_lock(lane.mu);
        lane.ring.clear();
      }
      for (cudaEvent_t ev : ring) (void)rt_.event_destroy(ev);
      (void)rt_.stream_destroy(stream);
      streams_[i] = nullptr;
      return Status(ErrorCode::kTransferFailed,
                    std::string("CUDA engine: cannot start the device-to-device feeder thread: ") +
                        ex.what());
    }
  }
  d2d_open_ = true;
  return Status::ok();
}

CudaTransferEngine::~CudaTransferEngine() {
  for (Lane& lane : lanes_) {  // the feeders enqueue what is left, then stop
    std::lock_guard lock(lane.mu);
    lane.stop = true;
    lane.cv.notify_all();
  }
  for (Lane& lane : lanes_) {
    if (lane.feeder.joinable()) lane.feeder.join();
  }
  {
    detail::EntryScope scope(rt_, ctx_);
    for (cudaStream_t s : streams_) {
      if (s != nullptr) (void)rt_.stream_synchronize(s);
    }
    auto destroy = [&](cudaEvent_t ev) {
      if (ev != nullptr) (void)rt_.event_destroy(ev);
    };
    for (auto& [id, job] : jobs_) {
      destroy(job.event);
      destroy(job.ready);
      for (cudaEvent_t ev : job.group_events) destroy(ev);
    }
    for (cudaEvent_t ev : free_events_) destroy(ev);
    for (Lane& lane : lanes_) {
      for (cudaEvent_t ev : lane.ring) destroy(ev);
    }
    for (cudaStream_t s : streams_) {
      if (s != nullptr) (void)rt_.stream_destroy(s);
    }
    if (device_segments_ != nullptr) (void)rt_.free_device(device_segments_);
    if (device_slot_segments_ != nullptr) (void)rt_.free_device(device_slot_segments_);
  }
  if (ctx_retained_) {
    detail::ErrorScope errors(rt_);
    (void)rt_.primary_ctx_release(options_.device);
  }
}

std::span<std::byte> CudaTransferEngine::HostView::host_page(HostPageId id) {
  if (!id.valid() || id.value() >= e_.pools_.host_pages) {
    throw std::out_of_range("CudaTransferEngine::host_memory: host page " +
                            std::to_string(id.value()) + " is out of range (the pool has " +
                            std::to_string(e_.pools_.host_pages) + " pages)");
  }
  return {e_.pools_.host_kv + std::size_t{id.value()} * e_.page_bytes_, e_.page_bytes_};
}

}  // namespace radixtier::cuda
