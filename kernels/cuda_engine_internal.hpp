// Internal to kernels/: what the CUDA transfer engine's source files share (not installed).
// The engine is split by concept: cuda_transfer_engine.cpp (submit and the tickets, the
// locking rules), cuda_engine_create.cpp (create(), the destructor), cuda_engine_checks.cpp
// (the checks of the pools and streams, the CUDA error text), cuda_engine_slices.cpp (batch
// planning: slices, runs, DMA or kernel) and cuda_engine_feeder.cpp (the feeder threads and a
// batch's completion).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "copy_kernels.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/status.hpp"

namespace radixtier::cuda::detail {

class CudaRuntime;

// Ticket events: no timing, and a host wait sleeps instead of spinning a core.
inline constexpr unsigned kEventFlags = cudaEventDisableTiming | cudaEventBlockingSync;

// --- cuda_engine_checks.cpp ---
/// "what: cudaErrorName: description".
std::string cuda_error(const char* what, cudaError_t err);
/// "driver D, runtime R" (cudaDriverGetVersion, cudaRuntimeGetVersion).
std::string versions(CudaRuntime& rt);
// The host pool must be pinned (registered or cudaHostAlloc'd) for async DMA, and mapped for
// the zero-copy kernels; its last byte too (a pool shorter than its page count is refused).
// `mapped` tells whether both ends are mapped at their host address.
Status check_host_pool(CudaRuntime& rt, const char* name, const std::byte* ptr, std::size_t bytes,
                       bool need_mapped, bool& mapped);
// Every segment of a device pool must lie in device memory of the engine's device: its first
// byte is device (or managed) memory of `device`, and the allocations that cuMemGetAddressRange
// reports, walked from it, reach its last byte without a gap (one cudaMalloc, or the VMM
// mappings of one reserved range, as PyTorch's expandable segments make).
Status check_device_layout(CudaRuntime& rt, const char* name, const DeviceLayout& layout,
                           int device);
// Takes memory and chunk size from a PinnedHostPool when one is given.
Status resolve_host_pool(const char* name, const PinnedHostPool* pool, std::byte*& data,
                         std::size_t& chunk, std::size_t needed);
/// cudaStreamPerThread is refused (a different stream on every thread).
Status stream_rule(const char* field, cudaStream_t s);

// --- cuda_engine_slices.cpp ---
/// The kernels' table of a layout's segments in logical order: host_offset is the segment's
/// first byte inside an item's bytes (its segments one after the other, as in a host page).
std::vector<DeviceSegment> segment_table(const DeviceLayout& layout);
/// Device to device by DMA: the runs of slot pieces, where the slot's segments and the page's
/// segments meet (a run that continues the previous one on both sides merges into it).
/// Appends to dsts / srcs / sizes.
void plan_slot_runs(const DeviceLayout& slots, const DeviceLayout& pages, std::size_t page_bytes,
                    std::size_t snapshot_bytes, std::span<const SlotPieceCopy> pieces,
                    std::vector<void*>& dsts, std::vector<const void*>& srcs,
                    std::vector<std::size_t>& sizes);

}  // namespace radixtier::cuda::detail
