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

/// Copies every segment of every item between the device pool and the mapped pinned host
/// pool (`host_base` must be a device-usable address). `to_host`: device -> host.
/// `vector_path`: every address and size is a multiple of 16 bytes.
cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                  std::byte* host_base, std::size_t host_item_bytes,
                                  const LaunchItems& items, bool to_host, bool vector_path,
                                  int blocks, cudaStream_t stream);

}  // namespace radixtier::cuda::detail
