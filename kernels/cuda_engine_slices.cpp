// The CUDA engine's batch planning: a batch's checks, its slices (snapshots' chunks, layer
// groups), each slice's pieces and runs, the choice of DMA or the zero-copy kernel (kAuto, the
// fallbacks when the batch call or the kernel cannot run here) and the slice's enqueueing.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>

#include "copy_kernels.hpp"
#include "cuda_engine_internal.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"

namespace radixtier::cuda {
namespace {

using detail::classify;
using detail::cuda_error;
using detail::ErrorClass;
using detail::versions;

constexpr std::size_t kAutoMinPieces = 4;  // kAuto: fewer pieces always go by DMA

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

}  // namespace

Status CudaTransferEngine::validate(const TransferBatch& b) const {
  std::ostringstream err;
  if (const char* why = batch_shape_error(b)) err << why << "; ";
  if (Status s = detail::stream_rule("TransferBatch.stream", static_cast<cudaStream_t>(b.stream));
      !s)
    err << s.message() << "; ";
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
  for (const auto& p : b.slot_pieces) {
    if (p.slot.value() >= pools_.gpu_snapshots.items) err << p.slot << " out of range; ";
    if (p.page.value() >= pools_.gpu_kv.items) err << p.page << " out of range; ";
    if (p.offset >= snapshot_bytes_ || page_bytes_ == 0 || p.offset % page_bytes_ != 0)
      err << "slot piece offset " << p.offset << " is not a page multiple inside the snapshot; ";
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
  w->slot_pieces = std::move(b.slot_pieces);
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
  if (b.direction == Direction::kDeviceToDevice) {  // slot pieces only (validated)
    for (std::size_t first = 0; first < w->slot_pieces.size(); first += step)
      w->slices.push_back({SliceDesc::Kind::kSlotPieces, 0, first,
                           std::min(step, w->slot_pieces.size() - first), false});
    return w;
  }
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

namespace detail {

std::vector<DeviceSegment> segment_table(const DeviceLayout& layout) {
  std::vector<DeviceSegment> table;
  std::size_t at = 0;
  for (const StridedSegment& seg : layout.segments) {
    table.push_back({seg.base, seg.item_stride, seg.bytes, at});
    at += seg.bytes;
  }
  return table;
}

// The window [offset, offset + n) of a slot's bytes (its segments in order) against the bytes
// [0, n) of a GPU page (its segments in order, as in its host page), cut where either side's
// segment ends; runs that continue the previous one on both sides merge.
void plan_slot_runs(const DeviceLayout& slots, const DeviceLayout& pages, std::size_t page_bytes,
                    std::size_t snapshot_bytes, std::span<const SlotPieceCopy> pieces,
                    std::vector<void*>& dsts, std::vector<const void*>& srcs,
                    std::vector<std::size_t>& sizes) {
  const std::vector<StridedSegment>& slot_segs = slots.segments;
  const std::vector<StridedSegment>& page_segs = pages.segments;
  for (const SlotPieceCopy& sp : pieces) {
    const std::size_t n = piece_bytes(sp, page_bytes, snapshot_bytes);
    std::size_t si = 0, s_at = 0;  // slot segment and its first logical byte
    std::size_t ki = 0, k_at = 0;  // page segment and its first logical byte
    for (std::size_t done = 0; done < n;) {
      const std::size_t in_slot = sp.offset + done;
      while (s_at + slot_segs[si].bytes <= in_slot) s_at += slot_segs[si++].bytes;
      while (k_at + page_segs[ki].bytes <= done) k_at += page_segs[ki++].bytes;
      const std::size_t run = std::min(
          {n - done, s_at + slot_segs[si].bytes - in_slot, k_at + page_segs[ki].bytes - done});
      const std::uintptr_t slot = slot_segs[si].base +
                                  std::size_t{sp.slot.value()} * slot_segs[si].item_stride +
                                  (in_slot - s_at);
      const std::uintptr_t page = page_segs[ki].base +
                                  std::size_t{sp.page.value()} * page_segs[ki].item_stride +
                                  (done - k_at);
      void* dst = reinterpret_cast<void*>(sp.to_slot ? slot : page);
      const void* src = reinterpret_cast<const void*>(sp.to_slot ? page : slot);
      const bool continues = !sizes.empty() &&
                             static_cast<std::byte*>(dsts.back()) + sizes.back() == dst &&
                             static_cast<const std::byte*>(srcs.back()) + sizes.back() == src;
      if (continues) {
        sizes.back() += run;
      } else {
        dsts.push_back(dst);
        srcs.push_back(src);
        sizes.push_back(run);
      }
      done += run;
    }
  }
}

}  // namespace detail

// Device to device by the slot copy kernel: one launch per slice (per 1,024 pieces), the runs
// computed on the device from the two segment tables uploaded by create(); nothing is
// uploaded per slice and nothing waits on the host.
cudaError_t CudaTransferEngine::enqueue_slot_kernel(std::span<const SlotPieceCopy> pieces,
                                                    bool inject, SubmitCounts& counts) {
  static thread_local detail::SlotLaunch launch;  // 13 KiB: not on the stack
  const cudaStream_t stream = streams_[index(Direction::kDeviceToDevice)];
  const auto* page_table = static_cast<const detail::DeviceSegment*>(device_segments_);
  const auto* slot_table = static_cast<const detail::DeviceSegment*>(device_slot_segments_);
  const int page_segments = static_cast<int>(pools_.gpu_kv.segments.size());
  for (std::size_t first = 0; first < pieces.size(); first += detail::kMaxLaunchItems) {
    const std::size_t n = std::min<std::size_t>(detail::kMaxLaunchItems, pieces.size() - first);
    launch.count = static_cast<std::uint32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const SlotPieceCopy& sp = pieces[first + i];
      launch.slot[i] = sp.slot.value();
      launch.page[i] = sp.page.value();
      launch.first_page[i] = static_cast<std::uint32_t>(sp.offset / page_bytes_);
      launch.to_slot[i] = sp.to_slot ? 1 : 0;
    }
    // Test hook: an impossible launch configuration (no blocks).
    const cudaError_t err = rt_.launch_slot_copy(page_table, page_segments, slot_table,
                                                 slot_segment_count_, page_bytes_, snapshot_bytes_,
                                                 launch, inject ? 0 : d2d_blocks_, stream);
    if (err != cudaSuccess) return err;
    ++counts.launches;
    ++counts.d2d_launches;
  }
  return cudaSuccess;
}

// Device to device: the kernel (kAuto, kZeroCopyKernel) while it can run here, else the runs
// by DMA on the D2D stream: one cudaMemcpyBatchAsync per slice, or one
// cudaMemcpyAsync(cudaMemcpyDeviceToDevice) per run where the driver lacks the batch call.
cudaError_t CudaTransferEngine::enqueue_slot_pieces(std::span<const SlotPieceCopy> pieces,
                                                    bool inject, SubmitCounts& counts) {
  if (options_.d2d != CopyMethod::kDmaBatch && !kernel_fallback_.load(std::memory_order_relaxed)) {
    const cudaError_t err = enqueue_slot_kernel(pieces, inject, counts);
    if (!missing_kernel(err)) return err;
    note_kernel_fallback(err, "cudaLaunchKernel (slot copy)");  // nothing launched: DMA
  }
  Lane& lane = lanes_[index(Direction::kDeviceToDevice)];  // its mutex is held
  const cudaStream_t stream = streams_[index(Direction::kDeviceToDevice)];
  lane.dsts.clear();
  lane.srcs.clear();
  lane.sizes.clear();
  detail::plan_slot_runs(pools_.gpu_snapshots, pools_.gpu_kv, page_bytes_, snapshot_bytes_, pieces,
                         lane.dsts, lane.srcs, lane.sizes);
  counts.pieces += lane.sizes.size();
  counts.d2d_dma_runs += lane.sizes.size();
  if (!batch_fallback_.load(std::memory_order_relaxed)) {
    // Test hook: an invalid source access order (cudaErrorInvalidValue).
    const cudaError_t err = rt_.memcpy_batch_async(
        lane.dsts.data(), lane.srcs.data(), lane.sizes.data(), lane.dsts.size(), inject, stream);
    if (classify(err) != ErrorClass::kUnsupported) return err;
    note_fallback(err);  // nothing of this slice was enqueued: redo it run by run
  }
  for (std::size_t i = 0; i < lane.sizes.size(); ++i) {
    // Test hook: an invalid copy direction on the slice's first copy.
    const auto kind = inject && i == 0 ? static_cast<cudaMemcpyKind>(-1) : cudaMemcpyDeviceToDevice;
    const cudaError_t err =
        rt_.memcpy_async(lane.dsts[i], lane.srcs[i], lane.sizes[i], kind, stream);
    if (err != cudaSuccess) return err;
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
    case SliceDesc::Kind::kSlotPieces:
      return enqueue_slot_pieces(
          std::span<const SlotPieceCopy>(w.slot_pieces).subspan(d.first, d.count), inject, counts);
  }
  return cudaErrorInvalidValue;
}

}  // namespace radixtier::cuda
