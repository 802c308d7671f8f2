// The pinned host pool: host memory the GPU's copy engines (and zero-copy kernels) reach.
//
// Allocated as large serving engines do it, with the checks a server needs:
//   1. the request is checked against MemAvailable and the cgroup's memory limit (v1 or v2,
//      the tightest of the cgroup and its ancestors, page cache counted as reclaimable): a
//      pool that does not fit is refused with the numbers, before anything is mapped, instead
//      of being pre-touched into the OOM killer's hands;
//   2. one anonymous mmap, madvise(MADV_DONTFORK) (a fork() of the server, e.g. a Python
//      subprocess, must not share pinned pages copy-on-write) and MADV_HUGEPAGE;
//   3. bound to the GPU's NUMA node (cudaDevAttrHostNumaId, else the PCI device's numa_node
//      in sysfs): MPOL_PREFERRED by default, MPOL_BIND with numa_strict;
//   4. pre-touched by several threads (the kernel backs every page before pinning);
//   5. registered with cudaHostRegister (portable, mapped) in chunks of at most 64 GiB,
//      because a single registration of hundreds of GiB is slow or refused; registered (and
//      unregistered) in `device`'s primary context, made current for the call and the
//      caller's context (or none) restored: no context is created on another GPU.
// Chunk sizes are multiples of `item_bytes` whenever lcm(item_bytes, OS page) fits in the
// chunk; otherwise an item may straddle two registrations, and the copy planner splits
// pieces there (give the pool to CudaPools::host_kv_pool so the engine knows the chunk).
// Pinning failure is reported with the size, the CUDA error and what to check
// (RLIMIT_MEMLOCK, container limits, free RAM); the partial registration is undone.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::cuda {

namespace detail {
class CudaRuntime;
}

class PinnedHostPool {
 public:
  static constexpr std::size_t kMaxRegisterChunk = std::size_t{64} << 30;  // 64 GiB
  static constexpr int kNumaOfDevice = -2;                                 // Options::numa_node
  static constexpr int kNoNuma = -1;

  struct Options {
    std::size_t max_register_chunk = kMaxRegisterChunk;
    unsigned touch_threads = 0;     ///< 0: min(hardware threads, 16)
    bool huge_pages = true;         ///< madvise(MADV_HUGEPAGE) before touching
    bool mapped = true;             ///< cudaHostRegisterMapped (needed by the zero-copy kernels)
    int device = 0;                 ///< the GPU that copies to and from the pool
    int numa_node = kNumaOfDevice;  ///< kNumaOfDevice: the device's node; kNoNuma: no binding
    bool numa_strict = false;       ///< MPOL_BIND (fail when the node is full), not MPOL_PREFERRED
    bool check_memory = true;  ///< refuse pools larger than MemAvailable or the cgroup headroom
  };

  /// Maps, touches and pins `bytes` (> 0) bytes; `item_bytes` (> 0) is the page or snapshot
  /// size that register chunks are aligned to.
  static Result<PinnedHostPool> create(std::size_t bytes, std::size_t item_bytes, Options options);
  static Result<PinnedHostPool> create(std::size_t bytes, std::size_t item_bytes) {
    return create(bytes, item_bytes, Options{});
  }
  /// The same on substituted runtime calls (kernels/cuda_runtime.hpp; for tests).
  static Result<PinnedHostPool> create(std::size_t bytes, std::size_t item_bytes, Options options,
                                       detail::CudaRuntime& runtime);

  PinnedHostPool() = default;
  PinnedHostPool(PinnedHostPool&& other) noexcept { *this = std::move(other); }
  PinnedHostPool& operator=(PinnedHostPool&& other) noexcept;
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;
  ~PinnedHostPool() { reset(); }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  /// Bytes of every registration except possibly the last: registration k starts at
  /// data() + k * register_chunk_bytes().
  std::size_t register_chunk_bytes() const { return chunk_; }
  std::size_t registrations() const { return registered_.size(); }
  /// The NUMA node the pool was bound to, or kNoNuma (none asked, none known, or refused).
  int numa_node() const { return numa_node_; }
  /// Unpins and unmaps (also done by the destructor).
  void reset();

 private:
  detail::CudaRuntime* rt_ = nullptr;
  CUcontext ctx_ = nullptr;  ///< device_'s primary context, retained while the pool lives
  int device_ = 0;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t chunk_ = 0;
  int numa_node_ = kNoNuma;
  std::vector<std::byte*> registered_;
};

}  // namespace radixtier::cuda
