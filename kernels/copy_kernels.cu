// The zero-copy gather/scatter kernel: one launch moves one slice between the GPU KV pool
// (any strided layout) and the page-first pinned host pool, reading or writing host memory
// directly over PCIe through its mapped address.
#include "copy_kernels.hpp"

namespace radixtier::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // loads in flight per thread before the stores

// Copies `bytes` bytes with the whole block; T is uint4 (16 B) or unsigned char.
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

template <class T>
__global__ void __launch_bounds__(kThreads)
    gather_scatter_kernel(const DeviceSegment* __restrict__ segments, int num_segments,
                          unsigned char* host_base, unsigned long long host_item_bytes,
                          const LaunchItems items, bool to_host) {
  const unsigned long long units = static_cast<unsigned long long>(items.count) * num_segments;
  for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
    const unsigned int item = static_cast<unsigned int>(u / num_segments);
    const DeviceSegment seg = segments[u % num_segments];
    unsigned char* dev =
        reinterpret_cast<unsigned char*>(seg.base + items.device[item] * seg.stride);
    unsigned char* host = host_base + items.host[item] * host_item_bytes + seg.host_offset;
    const unsigned long long n = seg.bytes / sizeof(T);
    if (to_host) {
      block_copy(reinterpret_cast<T*>(host), reinterpret_cast<const T*>(dev), n);
    } else {
      block_copy(reinterpret_cast<T*>(dev), reinterpret_cast<const T*>(host), n);
    }
  }
}

}  // namespace

cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                  std::byte* host_base, std::size_t host_item_bytes,
                                  const LaunchItems& items, bool to_host, bool vector_path,
                                  int blocks, cudaStream_t stream) {
  if (items.count == 0) return cudaSuccess;
  const unsigned long long units = static_cast<unsigned long long>(items.count) * num_segments;
  const unsigned int grid =
      static_cast<unsigned int>(units < static_cast<unsigned long long>(blocks) ? units : blocks);
  auto* host = reinterpret_cast<unsigned char*>(host_base);
  (void)cudaGetLastError();  // clear a stale non-sticky error so the check below is ours
  if (vector_path) {
    gather_scatter_kernel<uint4><<<grid, kThreads, 0, stream>>>(segments, num_segments, host,
                                                                host_item_bytes, items, to_host);
  } else {
    gather_scatter_kernel<unsigned char><<<grid, kThreads, 0, stream>>>(
        segments, num_segments, host, host_item_bytes, items, to_host);
  }
  return cudaGetLastError();
}

}  // namespace radixtier::cuda::detail
