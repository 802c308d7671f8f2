// The zero-copy gather/scatter kernel: one launch moves up to 1,024 items between the GPU KV
// pool (any strided layout) and the page-first pinned host pool, reading or writing host
// memory directly over PCIe through its mapped address.
#include "copy_kernels.hpp"

namespace radixtier::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // loads in flight per thread before the stores

// Copies n elements of T with the whole block.
template <class T>
__device__ void block_copy(T* __restrict__ dst, const T* __restrict__ src, unsigned long long n) {
  const unsigned long long step = static_cast<unsigned long long>(blockDim.x) * kUnroll;
  unsigned long long i = threadIdx.x;
  for (; i + (kUnroll - 1) * blockDim.x < n; i += step) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * blockDim.x] = v[u];
  }
  for (; i < n; i += blockDim.x) dst[i] = src[i];
}

// One (item, segment) range: 16-byte vectors where dst and src are aligned alike, bytes for
// the unaligned head and tail (and for the whole range when they are not).
__device__ void copy_range(unsigned char* dst, const unsigned char* src, unsigned long long n) {
  const CopySplit s = split_for_vectors(reinterpret_cast<unsigned long long>(dst),
                                        reinterpret_cast<unsigned long long>(src), n);
  block_copy(dst, src, s.head);
  block_copy(reinterpret_cast<uint4*>(dst + s.head), reinterpret_cast<const uint4*>(src + s.head),
             s.body / 16);
  block_copy(dst + s.head + s.body, src + s.head + s.body, s.tail);
}

__global__ void __launch_bounds__(kThreads)
    gather_scatter_kernel(const DeviceSegment* __restrict__ segments, int num_segments,
                          unsigned char* host_base, unsigned long long host_item_bytes,
                          const LaunchItems items, bool to_host) {
  const unsigned long long units = static_cast<unsigned long long>(items.count) * num_segments;
  for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
    const unsigned int item = static_cast<unsigned int>(u / num_segments);
    const DeviceSegment seg = segments[u % num_segments];
    // 64-bit offsets throughout: pools over 4 GiB on either side.
    unsigned char* dev = reinterpret_cast<unsigned char*>(
        seg.base + static_cast<unsigned long long>(items.device[item]) * seg.stride);
    unsigned char* host = host_base +
                          static_cast<unsigned long long>(items.host[item]) * host_item_bytes +
                          seg.host_offset;
    if (to_host) {
      copy_range(host, dev, seg.bytes);
    } else {
      copy_range(dev, host, seg.bytes);
    }
  }
}

// Device to device: unit u = (piece u / num_page_segments, page segment u % num_page_segments);
// the block walks the unit's runs (for_each_slot_run: the same code the CPU tests execute)
// and copies each with all its threads. HBM to HBM, so the grid is large (launch_slot_copy).
__global__ void __launch_bounds__(kThreads)
    slot_copy_kernel(const DeviceSegment* __restrict__ page_segments, int num_page_segments,
                     const DeviceSegment* __restrict__ slot_segments, int num_slot_segments,
                     unsigned long long page_bytes, unsigned long long snapshot_bytes,
                     const SlotLaunch launch) {
  const unsigned long long units =
      static_cast<unsigned long long>(launch.count) * num_page_segments;
  for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
    const unsigned int i = static_cast<unsigned int>(u / num_page_segments);
    const DeviceSegment pseg = page_segments[u % num_page_segments];
    const unsigned long long offset = launch.first_page[i] * page_bytes;
    const unsigned long long n =
        snapshot_bytes - offset < page_bytes ? snapshot_bytes - offset : page_bytes;
    for_each_slot_run(pseg, slot_segments, num_slot_segments, n, offset, launch.slot[i],
                      launch.page[i], launch.to_slot[i] != 0,
                      [](unsigned char* dst, const unsigned char* src, unsigned long long bytes) {
                        copy_range(dst, src, bytes);
                      });
  }
}

}  // namespace

cudaError_t launch_slot_copy(const DeviceSegment* page_segments, int num_page_segments,
                             const DeviceSegment* slot_segments, int num_slot_segments,
                             std::size_t page_bytes, std::size_t snapshot_bytes,
                             const SlotLaunch& launch, int blocks, cudaStream_t stream) {
  if (launch.count == 0) return cudaSuccess;
  const unsigned long long units =
      static_cast<unsigned long long>(launch.count) * static_cast<unsigned>(num_page_segments);
  const unsigned int grid =
      static_cast<unsigned int>(units < static_cast<unsigned long long>(blocks) ? units : blocks);
  unsigned long long pb = page_bytes, sb = snapshot_bytes;
  void* args[] = {&page_segments,
                  &num_page_segments,
                  &slot_segments,
                  &num_slot_segments,
                  &pb,
                  &sb,
                  const_cast<SlotLaunch*>(&launch)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&slot_copy_kernel), dim3(grid),
                          dim3(kThreads), args, 0, stream);
}

cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                  std::byte* host_base, std::size_t host_item_bytes,
                                  const LaunchItems& items, bool to_host, int blocks,
                                  cudaStream_t stream) {
  if (items.count == 0) return cudaSuccess;
  const unsigned long long units = static_cast<unsigned long long>(items.count) * num_segments;
  const unsigned int grid =
      static_cast<unsigned int>(units < static_cast<unsigned long long>(blocks) ? units : blocks);
  auto* host = reinterpret_cast<unsigned char*>(host_base);
  unsigned long long item_bytes = host_item_bytes;
  void* args[] = {&segments, &num_segments, &host, &item_bytes, const_cast<LaunchItems*>(&items),
                  &to_host};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gather_scatter_kernel), dim3(grid),
                          dim3(kThreads), args, 0, stream);
}

cudaError_t probe_gather_scatter() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&gather_scatter_kernel));
}

}  // namespace radixtier::cuda::detail

namespace radixtier::cuda::detail {

cudaError_t probe_slot_copy() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&slot_copy_kernel));
}

}  // namespace radixtier::cuda::detail
