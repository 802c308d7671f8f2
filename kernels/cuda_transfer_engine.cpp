// The CUDA transfer engine (see include/radixtier/cuda/cuda_transfer_engine.hpp).
//
// Locks: mu_ guards the tickets, the event pool, the stats and the fatal status, and is held
// only for bookkeeping, never across a call that can block on the driver queue. Each
// direction's Lane::mu guards its queue, every Work of that direction, the slice descriptor
// arrays and the feeder's event ring, and is held while slices are enqueued on the
// direction's stream (by the feeder, or by a caller of wait() / stream_wait() enqueueing the
// rest of its ticket). Order: a lane lock may be taken before mu_, never after it.
//
// Every entry point opens a detail::EntryScope: last-error hygiene, relaxed capture mode and
// the engine's primary context (the caller's current context, or none, is restored). The
// feeder threads set the same mode and context once, for their whole life.
#include "radixtier/cuda/cuda_transfer_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "copy_kernels.hpp"
#include "cuda_runtime.hpp"

namespace radixtier::cuda {
namespace {

using detail::classify;
using detail::ErrorClass;

constexpr std::size_t kAutoMinPieces = 4;  // kAuto: fewer pieces always go by DMA
constexpr int kDefaultKernelBlocks = 16;   // CTAs that saturate PCIe (issue 23)
// Ticket events: no timing, and a host wait sleeps instead of spinning a core.
constexpr unsigned kEventFlags = cudaEventDisableTiming | cudaEventBlockingSync;

std::string cuda_error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

std::string versions(detail::CudaRuntime& rt) {
  int driver = 0, runtime = 0;
  (void)rt.driver_get_version(&driver);
  (void)rt.runtime_get_version(&runtime);
  return "driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
}

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// The errors of a binary without an image (or usable PTX) for the device.
bool missing_kernel(cudaError_t err) {
  switch (err) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
      return true;
    default:
      return false;
  }
}

// The host pool must be pinned (registered or cudaHostAlloc'd) for async DMA, and mapped for
// the zero-copy kernels; its last byte too (a pool shorter than its page count is refused).
// `mapped` tells whether both ends are mapped at their host address.
Status check_host_pool(detail::CudaRuntime& rt, const char* name, const std::byte* ptr,
                       std::size_t bytes, bool need_mapped, bool& mapped) {
  mapped = true;
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
    mapped = mapped && attr.devicePointer == p;
    if (need_mapped && attr.devicePointer != p)
      return invalid_argument(
          std::string("CudaPools.") + name + where +
          " is not mapped at its host address (a zero-copy method needs "
          "cudaHostRegisterMapped and cudaDevAttrCanUseHostPointerForRegisteredMem)");
  }
  return Status::ok();
}

// Every segment of a device pool must lie in device memory of the engine's device: its first
// byte is device (or managed) memory of `device`, and the allocations that cuMemGetAddressRange
// reports, walked from it, reach its last byte without a gap (one cudaMalloc, or the VMM
// mappings of one reserved range, as PyTorch's expandable segments make).
Status check_device_layout(detail::CudaRuntime& rt, const char* name, const DeviceLayout& layout,
                           int device) {
  for (std::size_t i = 0; i < layout.segments.size(); ++i) {
    const StridedSegment& s = layout.segments[i];
    const std::string what = std::string("CudaPools.") + name + " segment " + std::to_string(i);
    const std::uintptr_t first = s.base;
    const std::uintptr_t last =
        s.base + std::size_t{layout.items - 1} * s.item_stride + s.bytes - 1;
    cudaPointerAttributes attr{};
    if (cudaError_t err = rt.pointer_get_attributes(&attr, reinterpret_cast<const void*>(first));
        err != cudaSuccess)
      return invalid_argument(what + ": " + cuda_error("cudaPointerGetAttributes", err));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      return invalid_argument(what + ": base " + hex(first) + " is not device memory");
    if (attr.device != device)
      return invalid_argument(what + ": memory of device " + std::to_string(attr.device) +
                              ", but the engine is on device " + std::to_string(device));
    std::uintptr_t at = first;
    for (std::size_t step = 0;; ++step) {
      std::uintptr_t base = 0;
      std::size_t bytes = 0;
      const cudaError_t err = rt.mem_get_address_range(at, &base, &bytes);
      if (classify(err) == ErrorClass::kUnsupported) break;  // no driver call to ask: unchecked
      if (err != cudaSuccess || base > at || at - base >= bytes)
        return invalid_argument(what + " [" + hex(first) + ", " + hex(last + 1) + ") of " +
                                std::to_string(layout.items) + " items: byte " + hex(at) +
                                " is in no device allocation" +
                                (err != cudaSuccess
                                     ? " (" + cuda_error("cuMemGetAddressRange", err) + ")"
                                     : std::string()) +
                                "; check the pool's base, stride, size and item count");
      if (last - base < bytes) break;
      at = base + bytes;
      if (step > (std::size_t{1} << 20))
        return invalid_argument(what + ": more than 2^20 allocations under one segment");
      // The next mapping must be this device's memory too.
      cudaPointerAttributes next{};
      if (rt.pointer_get_attributes(&next, reinterpret_cast<const void*>(at)) == cudaSuccess &&
          (next.type == cudaMemoryTypeDevice || next.type == cudaMemoryTypeManaged) &&
          next.device != device)
        return invalid_argument(what + ": byte " + hex(at) + " is memory of device " +
                                std::to_string(next.device) + ", but the engine is on device " +
                                std::to_string(device));
    }
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
  if (s == cudaStreamPerThread)
    return invalid_argument(std::string(field) +
                            ": cudaStreamPerThread is the calling thread's per-thread default "
                            "stream, a different stream on every thread; pass the model's own "
                            "stream, or nullptr for the legacy default stream (PyTorch's "
                            "default stream)");
  return Status::ok();
}

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
  e.next_id_ = seams.first_ticket_id;
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
  const bool may_use_kernel =
      zero_copy || e.options_.d2h == CopyMethod::kAuto || e.options_.h2d == CopyMethod::kAuto;
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
  int sms = 0;
  (void)rt.device_get_attribute(&sms, cudaDevAttrMultiProcessorCount, device);
  e.kernel_blocks_ = e.options_.kernel_blocks > 0
                         ? e.options_.kernel_blocks
                         : std::min(kDefaultKernelBlocks, std::max(1, sms));
  if (e.options_.slices_in_flight > 0) {
    try {
      e.lanes_[0].feeder =
          std::thread(&CudaTransferEngine::feeder_loop, &e, Direction::kDeviceToHost);
      e.lanes_[1].feeder =
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

void CudaTransferEngine::note_kernel_fallback(cudaError_t err, const char* where) {
  if (kernel_fallback_.exchange(true)) return;
  const std::string reason = std::string("the copy kernel cannot run on device ") +
                             std::to_string(options_.device) + ": " + cuda_error(where, err) +
                             " (" + versions(rt_) +
                             "; build for this GPU's architecture, CMAKE_CUDA_ARCHITECTURES): "
                             "every slice now goes by DMA";
  {
    std::lock_guard lock(mu_);
    stats_.kernel_fallback = true;
    stats_.kernel_fallback_reason = reason;
  }
  log("CUDA engine: " + reason);
}

std::size_t CudaTransferEngine::group_of_layer(std::uint32_t layer) const {
  return layers_ == 0 ? 0 : static_cast<std::size_t>(std::uint64_t{layer} * groups_ / layers_);
}

std::shared_ptr<CudaTransferEngine::Work> CudaTransferEngine::plan(TransferBatch& b,
                                                                   TicketId id) const {
  auto w = std::make_shared<Work>();
  w->id = id;
  w->dir = b.direction;
  w->pairs.reserve(b.pages.size());
  for (const PageCopy& p : b.pages) w->pairs.push_back({p.gpu.value(), p.host.value()});
  w->pieces = std::move(b.pieces);
  if (!b.snapshots.empty()) {
    std::vector<ItemPair> snaps;
    for (const SnapshotCopy& s : b.snapshots) snaps.push_back({s.gpu.value(), s.host.value()});
    for_each_byte_slice(pools_.gpu_snapshots, snaps, pools_.host_snapshot_chunk_bytes,
                        options_.slice_pages * page_bytes_, [&](std::span<const Piece> chunk) {
                          w->snapshot_chunks.emplace_back(chunk.begin(), chunk.end());
                          return true;
                        });
  }
  const std::size_t step = options_.slice_pages;
  const bool promote = b.direction == Direction::kHostToDevice;
  const bool layered = promote && groups_ > 1;
  auto add_pages = [&] {
    if (w->pairs.empty()) return;
    for (std::uint32_t g = 0; g < (layered ? groups_ : 1u); ++g) {
      for (std::size_t first = 0; first < w->pairs.size(); first += step) {
        const std::size_t n = std::min(step, w->pairs.size() - first);
        w->slices.push_back({SliceDesc::Kind::kPages, layered ? g : kAllGroups, first, n,
                             layered && first + n == w->pairs.size()});
      }
    }
  };
  auto add_pieces = [&] {
    for (std::size_t first = 0; first < w->pieces.size(); first += step)
      w->slices.push_back(
          {SliceDesc::Kind::kPieces, 0, first, std::min(step, w->pieces.size() - first), false});
  };
  auto add_snapshots = [&] {
    for (std::size_t k = 0; k < w->snapshot_chunks.size(); ++k)
      w->slices.push_back({SliceDesc::Kind::kSnapshots, 0, k, 1, false});
  };
  if (promote) {  // snapshots first: every layer's wait covers them
    add_pieces();
    add_snapshots();
    add_pages();
  } else {
    add_pages();
    add_pieces();
    add_snapshots();
  }
  return w;
}

void CudaTransferEngine::plan_pieces(std::span<const ItemPair> pairs, std::uint32_t group,
                                     std::vector<Piece>& out) const {
  if (group == kAllGroups) {
    append_item_pieces(pools_.gpu_kv, pairs, pools_.host_kv_chunk_bytes, out);
  } else {
    append_item_pieces(pools_.gpu_kv, pairs, pools_.host_kv_chunk_bytes, group_segments_[group],
                       out);
  }
}

cudaError_t CudaTransferEngine::enqueue_dma(Direction dir, std::span<const Piece> pieces,
                                            std::byte* host_base, bool inject,
                                            SubmitCounts& counts) {
  Lane& lane = lanes_[index(dir)];  // its mutex is held
  const bool to_host = dir == Direction::kDeviceToHost;
  cudaStream_t stream = streams_[index(dir)];
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
                                               std::uint32_t group, bool inject,
                                               SubmitCounts& counts) {
  static thread_local detail::LaunchItems items;  // 8 KiB: not on the stack
  const bool to_host = dir == Direction::kDeviceToHost;
  const auto* table = static_cast<const detail::DeviceSegment*>(device_segments_);
  int segments = static_cast<int>(pools_.gpu_kv.segments.size());
  if (group != kAllGroups) {
    table += group_first_[group];
    segments = static_cast<int>(group_count_[group]);
  }
  for (std::size_t first = 0; first < pairs.size(); first += detail::kMaxLaunchItems) {
    const std::size_t n = std::min<std::size_t>(detail::kMaxLaunchItems, pairs.size() - first);
    items.count = static_cast<std::uint32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      items.device[i] = pairs[first + i].device;
      items.host[i] = pairs[first + i].host;
    }
    // Test hook: an impossible launch configuration (no segments, no blocks).
    const cudaError_t err = rt_.launch_gather_scatter(
        inject ? nullptr : table, inject ? 0 : segments, pools_.host_kv, page_bytes_, items,
        to_host, inject ? 0 : kernel_blocks_, streams_[index(dir)]);
    if (err != cudaSuccess) return err;
    ++counts.launches;
  }
  return cudaSuccess;
}

cudaError_t CudaTransferEngine::enqueue_slice(Work& w, const SliceDesc& d, bool inject) {
  Lane& lane = lanes_[index(w.dir)];  // its mutex is held
  SubmitCounts& counts = w.counts;
  switch (d.kind) {
    case SliceDesc::Kind::kPages: {
      const auto pairs = std::span<const ItemPair>(w.pairs).subspan(d.first, d.count);
      const CopyMethod method = w.dir == Direction::kDeviceToHost ? options_.d2h : options_.h2d;
      const bool kernel_ok = host_mapped_ && !kernel_fallback_.load(std::memory_order_relaxed);
      bool planned = false, use_kernel = method == CopyMethod::kZeroCopyKernel && kernel_ok;
      if (method == CopyMethod::kAuto) {
        if (kernel_ok) {
          lane.pieces.clear();
          plan_pieces(pairs, d.group, lane.pieces);
          planned = true;
          std::size_t bytes = 0;
          for (const Piece& p : lane.pieces) bytes += p.bytes;
          use_kernel = lane.pieces.size() >= kAutoMinPieces &&
                       bytes < options_.kernel_below_piece_bytes * lane.pieces.size();
        }
        ++(use_kernel ? counts.auto_kernel : counts.auto_dma);
      }
      if (use_kernel) {
        const cudaError_t err = enqueue_kernel(w.dir, pairs, d.group, inject, counts);
        if (!missing_kernel(err)) return err;
        note_kernel_fallback(err, "cudaLaunchKernel");  // nothing was launched: redo by DMA
      }
      if (!planned) {
        lane.pieces.clear();
        plan_pieces(pairs, d.group, lane.pieces);
      }
      return enqueue_dma(w.dir, lane.pieces, pools_.host_kv, inject, counts);
    }
    case SliceDesc::Kind::kPieces: {
      // Snapshot pieces (a snapshot spread over pages of the host pool): the window
      // [offset, offset + n) of the slot's bytes, cut along the slot's device segments, to one
      // host page.
      lane.pieces.clear();
      for (std::size_t i = d.first; i < d.first + d.count; ++i) {
        const SnapshotPieceCopy& sp = w.pieces[i];
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
      return enqueue_dma(w.dir, lane.pieces, pools_.host_kv, inject, counts);
    }
    case SliceDesc::Kind::kSnapshots:
      // Large contiguous ranges, where the copy engines are at their best: always DMA.
      return enqueue_dma(w.dir, w.snapshot_chunks[d.first], pools_.host_snapshots, inject, counts);
  }
  return cudaErrorInvalidValue;
}

void CudaTransferEngine::feed_slice(Lane& lane, Work& w) {
  if (w.finished) return;
  cudaStream_t stream = streams_[index(w.dir)];
  if (!w.started) {
    w.started = true;
    if (w.ready != nullptr && w.err == cudaSuccess)
      w.err = rt_.stream_wait_event(stream, w.ready, 0);
  }
  if (w.err == cudaSuccess && w.next < w.slices.size()) {
    const SliceDesc& d = w.slices[w.next];
    const bool inject = w.inject == static_cast<std::int64_t>(w.next);
    if (cudaError_t err = enqueue_slice(w, d, inject); err != cudaSuccess) {
      w.err = err;
    } else {
      ++w.counts.slices;
      if (d.ends_group && w.groups_recorded < w.group_events.size()) {
        w.err = rt_.event_record(w.group_events[w.groups_recorded++], stream);
        ++w.counts.layer_events;
      }
    }
    ++w.next;
  }
  if (w.err != cudaSuccess || w.next >= w.slices.size()) finish(lane, w);
}

void CudaTransferEngine::finish(Lane& /*lane*/, Work& w) {
  if (w.finished) return;
  w.finished = true;
  w.next = w.slices.size();
  cudaStream_t stream = streams_[index(w.dir)];
  // Every event of the ticket follows what was enqueued, even after a failure: a GPU-side
  // wait never meets an event that was never recorded, and the batch's memory stays
  // off-limits until the GPU is done with it.
  cudaError_t record = cudaSuccess;
  while (w.groups_recorded < w.group_events.size() && record == cudaSuccess)
    record = rt_.event_record(w.group_events[w.groups_recorded++], stream);
  if (record == cudaSuccess) record = rt_.event_record(w.done, stream);
  if (record != cudaSuccess) (void)rt_.stream_synchronize(stream);  // nothing to wait on later

  std::lock_guard lock(mu_);
  stats_.slices += w.counts.slices;
  stats_.pieces += w.counts.pieces;
  stats_.kernel_launches += w.counts.launches;
  stats_.auto_kernel_slices += w.counts.auto_kernel;
  stats_.auto_dma_slices += w.counts.auto_dma;
  stats_.layer_events += w.counts.layer_events;
  auto it = jobs_.find(w.id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.work.reset();
  for (cudaError_t e : {w.err, record}) {
    if (classify(e) == ErrorClass::kFatal) {
      job.failed = true;
      (void)mark_fatal(e, e == w.err ? "enqueue" : "cudaEventRecord");
    }
  }
  if (w.err != cudaSuccess) {
    job.failed = true;
    if (classify(w.err) != ErrorClass::kFatal) stats_.last_error = cuda_error("enqueue", w.err);
  }
  if (record != cudaSuccess) {
    free_events_.push_back(job.event);
    job.event = nullptr;
    job.failed = true;
    if (classify(record) != ErrorClass::kFatal)
      stats_.last_error = cuda_error("cudaEventRecord", record);
    settle(job, cudaSuccess, "submit");  // drained above: final now
  }
}

void CudaTransferEngine::feed_all(const std::shared_ptr<Work>& w) {
  Lane& lane = lanes_[index(w->dir)];
  std::lock_guard lock(lane.mu);
  while (!w->finished) feed_slice(lane, *w);
}

void CudaTransferEngine::feeder_loop(Direction dir) {
  Lane& lane = lanes_[index(dir)];
  // This thread's own settings for its whole life: relaxed capture mode, the engine's context.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)rt_.thread_exchange_stream_capture_mode(&mode);
  (void)rt_.ctx_set_current(ctx_);
  const std::size_t cap = lane.ring.size();
  std::unique_lock lock(lane.mu);
  while (true) {
    lane.cv.wait(lock, [&] { return lane.stop || !lane.queue.empty(); });
    if (lane.queue.empty()) break;  // stopped, nothing left
    const std::shared_ptr<Work> w = lane.queue.front();
    if (w->finished) {  // a waiter enqueued the rest
      lane.queue.pop_front();
      continue;
    }
    if (!lane.stop && lane.in_flight >= cap) {
      // The oldest slice in flight must finish first. A failure shows in the tickets' events.
      cudaEvent_t oldest = lane.ring[(lane.ring_next + cap - lane.in_flight) % cap];
      lock.unlock();
      (void)rt_.event_synchronize(oldest);
      lock.lock();
      --lane.in_flight;
      continue;
    }
    const std::size_t before = w->counts.slices;
    feed_slice(lane, *w);
    if (w->counts.slices != before &&
        rt_.event_record(lane.ring[lane.ring_next], streams_[index(dir)]) == cudaSuccess) {
      lane.ring_next = (lane.ring_next + 1) % cap;
      ++lane.in_flight;
    }
    if (w->finished) lane.queue.pop_front();
  }
  lock.unlock();
  (void)rt_.get_last_error();  // nothing this thread left behind is anyone's
  (void)rt_.ctx_set_current(nullptr);
}

cudaEvent_t CudaTransferEngine::acquire_event() {
  if (!free_events_.empty()) {
    cudaEvent_t ev = free_events_.back();
    free_events_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  if (rt_.event_create_with_flags(&ev, kEventFlags) != cudaSuccess) return nullptr;
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
  detail::EntryScope scope(rt_, ctx_);
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
  if (scope.error() != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(scope.error()) == ErrorClass::kFatal)
      return mark_fatal(scope.error(), "cuCtxSetCurrent");
    return Status(ErrorCode::kTransferFailed, cuda_error("submit: cuCtxSetCurrent", scope.error()));
  }
  // A capture of the compute stream would pull the copy stream into the graph (and the copy
  // would then fail and invalidate the server's capture): refuse before enqueueing anything.
  // For the legacy stream, CUDA answers cudaErrorStreamCaptureImplicit while a blocking
  // stream is captured: any use of the legacy stream would join that capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t err = rt_.stream_is_capturing(compute_, &capture); err != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamIsCapturing");
    if (classify(err) == ErrorClass::kCapture) {
      ++stats_.refused_captures;
      return Status(ErrorCode::kFailedPrecondition,
                    cuda_error("submit: cudaStreamIsCapturing(compute_stream)", err) +
                        ": the legacy default stream cannot be used while a blocking stream is "
                        "captured into a CUDA graph. Nothing was enqueued: submit before or "
                        "after the capture");
    }
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
  const Direction dir = batch.direction;
  const bool after_compute = dir == Direction::kDeviceToHost ? options_.demote_after_compute
                                                             : options_.promote_after_compute;
  std::uint64_t bytes = batch.pages.size() * page_bytes_ + batch.snapshots.size() * snapshot_bytes_;
  for (const auto& p : batch.pieces) bytes += piece_bytes(p, page_bytes_, snapshot_bytes_);
  // Plan without a lock (descriptors; snapshot chunks), then take an id and the events.
  std::shared_ptr<Work> w = plan(batch, TicketId());
  w->inject = inject;
  const std::size_t group_events =
      dir == Direction::kHostToDevice && groups_ > 1 && !w->pairs.empty() ? groups_ - 1 : 0;
  {
    std::lock_guard lock(mu_);
    Job job;
    job.dir = dir;
    bool ok = (job.event = acquire_event()) != nullptr;
    if (ok && after_compute) ok = (job.ready = acquire_event()) != nullptr;
    for (std::size_t g = 0; ok && g < group_events; ++g) {
      job.group_events.push_back(acquire_event());
      ok = job.group_events.back() != nullptr;
    }
    if (!ok) {
      for (cudaEvent_t ev : job.group_events)
        if (ev != nullptr) free_events_.push_back(ev);
      for (cudaEvent_t ev : {job.event, job.ready})
        if (ev != nullptr) free_events_.push_back(ev);
      return Status(ErrorCode::kTransferFailed, "submit: cudaEventCreate failed; nothing enqueued");
    }
    w->id = TicketId(detail::take_ticket_id(next_id_, jobs_));
    w->done = job.event;
    w->ready = job.ready;
    w->group_events = job.group_events;
    job.work = w;
    jobs_.emplace(w->id, std::move(job));
    ++stats_.batches;
    (dir == Direction::kDeviceToHost ? stats_.bytes_d2h : stats_.bytes_h2d) += bytes;
  }
  // compute -> copy: the event the copy stream waits on before the first slice.
  if (w->ready != nullptr) {
    if (cudaError_t err = rt_.event_record(w->ready, compute_); err != cudaSuccess) w->err = err;
  }
  const TicketId id = w->id;
  if (options_.slices_in_flight == 0 || w->err != cudaSuccess) {
    feed_all(w);  // on this thread, now (or: nothing to enqueue but the events)
    std::lock_guard lock(mu_);
    if (classify(w->err) == ErrorClass::kFatal) {  // nothing runs any more: no ticket
      auto it = jobs_.find(id);
      if (it != jobs_.end()) {
        it->second.state = TransferState::kFailed;
        ++stats_.failed;
        recycle(it->second);
        jobs_.erase(it);
      }
      return fatal_;
    }
  } else {
    Lane& lane = lanes_[index(dir)];
    std::lock_guard lock(lane.mu);
    lane.queue.push_back(w);
    lane.cv.notify_one();
  }
  return Ticket(this, id);
}

void CudaTransferEngine::recycle(Job& job) {
  if (job.state == TransferState::kPending || job.waiters > 0) return;
  for (cudaEvent_t* ev : {&job.event, &job.ready}) {
    if (*ev != nullptr) free_events_.push_back(*ev);
    *ev = nullptr;
  }
  for (cudaEvent_t ev : job.group_events) free_events_.push_back(ev);
  job.group_events.clear();
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
  detail::EntryScope scope(rt_, ctx_);
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  Job& job = it->second;
  if (job.state != TransferState::kPending) return job.state;
  // A lost context runs no copy any more: nothing of the batch can still be touched.
  if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "poll");
  if (job.work != nullptr) return TransferState::kPending;  // slices left to enqueue
  if (job.event == nullptr) return settle(job, cudaSuccess, "poll");
  return settle(job, rt_.event_query(job.event), "cudaEventQuery");
}

TransferState CudaTransferEngine::wait(TicketId id) {
  detail::EntryScope scope(rt_, ctx_);
  std::shared_ptr<Work> rest;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    if (it->second.state != TransferState::kPending) return it->second.state;
    rest = it->second.work;
  }
  if (rest != nullptr) {  // enqueue what the feeder has not yet, here and now
    feed_all(rest);
    std::lock_guard lock(mu_);
    ++stats_.urgent_feeds;
  }
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    Job& job = it->second;
    if (job.state != TransferState::kPending) return job.state;
    if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "wait");
    if (job.event == nullptr) return settle(job, cudaSuccess, "wait");
    ev = job.event;
    ++job.waiters;  // the event stays this job's until the last waiter is out
  }
  cudaError_t err = rt_.event_synchronize(ev);
  while (classify(err) == ErrorClass::kCapture) {  // relaxed mode should never see one
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

Status CudaTransferEngine::wait_on(TicketId id, std::int64_t layer, cudaStream_t stream) {
  const char* what = layer < 0 ? "stream_wait" : "stream_wait_layer";
  if (Status s = stream_rule((std::string(what) + ": stream").c_str(), stream); !s) return s;
  if (layer >= 0 && layers_ > 0 && layer >= static_cast<std::int64_t>(layers_))
    return invalid_argument(std::string(what) + ": layer " + std::to_string(layer) +
                            ", but the KV layout has " + std::to_string(layers_) + " layers");
  const cudaStream_t target = detail::resolve_stream(stream);
  detail::EntryScope scope(rt_, ctx_);
  std::shared_ptr<Work> rest;
  {
    std::lock_guard lock(mu_);
    if (!fatal_.is_ok()) return fatal_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return not_found(std::string(what) + ": unknown ticket");
    rest = it->second.work;
  }
  if (rest != nullptr) {  // the events must be recorded before a stream can wait on them
    feed_all(rest);
    std::lock_guard lock(mu_);
    ++stats_.urgent_feeds;
  }
  std::lock_guard lock(mu_);
  if (!fatal_.is_ok()) return fatal_;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found(std::string(what) + ": unknown ticket");
  const Job& job = it->second;
  if (job.state == TransferState::kFailed || job.failed)
    return Status(ErrorCode::kTransferFailed, std::string(what) + ": the ticket failed");
  if (job.state == TransferState::kDone || job.event == nullptr) return Status::ok();
  cudaEvent_t ev = job.event;
  if (layer >= 0 && !job.group_events.empty()) {
    const std::size_t g = group_of_layer(static_cast<std::uint32_t>(layer));
    if (g < job.group_events.size()) ev = job.group_events[g];
  }
  if (cudaError_t err = rt_.stream_wait_event(target, ev, 0); err != cudaSuccess) {
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamWaitEvent");
    return Status(ErrorCode::kTransferFailed, cuda_error("cudaStreamWaitEvent", err));
  }
  return Status::ok();
}

Status CudaTransferEngine::stream_wait(TicketId id, cudaStream_t stream) {
  return wait_on(id, -1, stream);
}

Status CudaTransferEngine::stream_wait_layer(TicketId id, std::uint32_t layer,
                                             cudaStream_t stream) {
  return wait_on(id, layer, stream);
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
