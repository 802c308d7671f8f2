// Internal: the zero-copy gather/scatter kernel of the CUDA transfer engine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace radixtier::cuda::detail {

/// One KV segment as the kernel sees it (device table, uploaded once per engine).
struct DeviceSegment {
  unsigned long long base;         ///< device address of item 0's segment
  unsigned long long stride;       ///< bytes between items
  unsigned long long bytes;        ///< bytes per item
  unsigned long long host_offset;  ///< offset of the segment inside a host item
};

/// Items of one launch, passed by value as the kernel parameter (8 KiB, within the 32 KiB
/// parameter limit of CUDA 12.1+ on Volta and newer).
inline constexpr int kMaxLaunchItems = 1024;
struct LaunchItems {
  std::uint32_t count;
  std::uint32_t device[kMaxLaunchItems];
  std::uint32_t host[kMaxLaunchItems];
};

/// How the kernel copies one (item, segment) range of `bytes` bytes from `src` to `dst`:
/// `head` bytes one by one up to the next 16-byte boundary, `body` bytes as 16-byte vectors,
/// `tail` bytes one by one. When dst and src are not aligned alike (their addresses differ
/// modulo 16), no vector access is legal: all bytes go one by one. The choice is made per
/// range, so one misaligned segment does not slow down the others.
struct CopySplit {
  unsigned long long head, body, tail;
};
__host__ __device__ inline CopySplit split_for_vectors(unsigned long long dst,
                                                       unsigned long long src,
                                                       unsigned long long bytes) {
  if (((dst ^ src) & 15ull) != 0) return {bytes, 0, 0};
  unsigned long long head = (16 - (dst & 15ull)) & 15ull;
  if (head > bytes) head = bytes;
  const unsigned long long body = (bytes - head) / 16 * 16;
  return {head, body, bytes - head - body};
}

/// Copies every segment of every item between the device pool and the mapped pinned host
/// pool (`host_base` must be a device-usable address). `to_host`: device -> host. Returns
/// the launch's own error (cudaLaunchKernel), without reading or clearing the thread's last
/// error.
cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                  std::byte* host_base, std::size_t host_item_bytes,
                                  const LaunchItems& items, bool to_host, int blocks,
                                  cudaStream_t stream);

/// cudaFuncGetAttributes of the kernel: cudaSuccess when this binary holds an image the
/// current device can run (it also loads the kernel under lazy module loading);
/// cudaErrorNoKernelImageForDevice, cudaErrorInvalidDeviceFunction, cudaErrorInvalidPtx or
/// cudaErrorUnsupportedPtxVersion when it does not.
cudaError_t probe_gather_scatter();

}  // namespace radixtier::cuda::detail
