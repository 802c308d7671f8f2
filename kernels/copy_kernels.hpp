// Internal: the kernels of the CUDA transfer engine: the zero-copy gather/scatter kernel (GPU
// pool <-> mapped pinned host pool) and the device-to-device slot copy kernel (live snapshot
// slots <-> GPU KV pages, one launch per slice of slot pieces).
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

/// Slot pieces of one device-to-device launch, passed by value as the kernel parameter
/// (13 KiB): piece i copies the bytes [first_page[i] * page_bytes, + n) of slot slot[i] (its
/// segments in order) to or from the bytes [0, n) of GPU page page[i] (its segments in order),
/// n = min(page_bytes, snapshot_bytes - first_page[i] * page_bytes).
struct SlotLaunch {
  std::uint32_t count;
  std::uint32_t slot[kMaxLaunchItems];
  std::uint32_t page[kMaxLaunchItems];
  std::uint32_t first_page[kMaxLaunchItems];  ///< the piece's offset / page_bytes
  std::uint8_t to_slot[kMaxLaunchItems];      ///< 1: page -> slot, 0: slot -> page
};

/// The runs of one unit of the slot copy kernel, unit = (piece, page segment): the page
/// segment `pseg` covers the logical page bytes [pseg.host_offset, + pseg.bytes), cut to the
/// piece's `n` bytes; they meet the slot's logical bytes from `offset` on, which the slot
/// segments `slot_segs` (sorted by logical offset, host_offset = the segment's first logical
/// byte, no gaps) cut further. Calls fn(dst, src, bytes) for every run, in order. The kernel
/// calls it with a block-wide copy, the fake runtime of the CPU tests with memcpy: both run
/// exactly this code. The units of a piece cover its n bytes once each (the page segments
/// partition the page).
template <class Fn>
__host__ __device__ inline void for_each_slot_run(const DeviceSegment& pseg,
                                                  const DeviceSegment* slot_segs, int num_slot_segs,
                                                  unsigned long long n, unsigned long long offset,
                                                  unsigned int slot, unsigned int page,
                                                  bool to_slot, Fn&& fn) {
  const unsigned long long lo = pseg.host_offset;
  unsigned long long hi = lo + pseg.bytes;
  if (hi > n) hi = n;
  if (lo >= hi || num_slot_segs <= 0) return;
  // The last slot segment that starts at or before the first byte (binary search).
  const unsigned long long first = offset + lo;
  int a = 0, b = num_slot_segs - 1;
  while (a < b) {
    const int m = (a + b + 1) / 2;
    if (slot_segs[m].host_offset <= first) {
      a = m;
    } else {
      b = m - 1;
    }
  }
  unsigned long long at = lo;  // logical page byte
  for (; at < hi && a < num_slot_segs; ++a) {
    const DeviceSegment& s = slot_segs[a];
    const unsigned long long in_slot = offset + at;
    if (s.host_offset + s.bytes <= in_slot) continue;  // an empty or passed segment
    unsigned long long run = s.host_offset + s.bytes - in_slot;
    if (run > hi - at) run = hi - at;
    auto* sp = reinterpret_cast<unsigned char*>(
        s.base + static_cast<unsigned long long>(slot) * s.stride + (in_slot - s.host_offset));
    auto* pp = reinterpret_cast<unsigned char*>(
        pseg.base + static_cast<unsigned long long>(page) * pseg.stride + (at - lo));
    if (to_slot) {
      fn(sp, pp, run);
    } else {
      fn(pp, sp, run);
    }
    at += run;
  }
}

/// The slot copy kernel: one launch for every piece of `launch`, `blocks` CTAs, one unit
/// (piece, page segment) per CTA at a time, 16-byte vectors where both ends are aligned alike.
/// `page_segments` / `slot_segments`: device tables (host_offset = the logical offset inside
/// a page / a slot; the slot table sorted by it). Returns the launch's own error.
cudaError_t launch_slot_copy(const DeviceSegment* page_segments, int num_page_segments,
                             const DeviceSegment* slot_segments, int num_slot_segments,
                             std::size_t page_bytes, std::size_t snapshot_bytes,
                             const SlotLaunch& launch, int blocks, cudaStream_t stream);

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
/// The same for the slot copy kernel (both live in one image: a binary has both or neither).
cudaError_t probe_slot_copy();

}  // namespace radixtier::cuda::detail
