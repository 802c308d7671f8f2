// The pinned host pool: host memory the GPU's copy engines (and zero-copy kernels) reach.
//
// Allocated as large serving engines do it: one anonymous mmap, pre-touched by several
// threads (so the kernel backs every page before pinning, with transparent huge pages where
// the system allows), then registered with cudaHostRegister (portable, mapped) in chunks of
// at most 64 GiB, because a single registration of hundreds of GiB is slow or refused.
// Chunk sizes are multiples of `item_bytes`, so no page or snapshot straddles two
// registrations. Pinning failure is reported with the size, the CUDA error and what to check
// (RLIMIT_MEMLOCK, container limits, free RAM); the partial registration is undone.
#pragma once

#include <cstddef>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::cuda {

class PinnedHostPool {
 public:
  static constexpr std::size_t kMaxRegisterChunk = std::size_t{64} << 30;  // 64 GiB

  struct Options {
    std::size_t max_register_chunk = kMaxRegisterChunk;
    unsigned touch_threads = 0;  ///< 0: min(hardware threads, 16)
    bool huge_pages = true;      ///< madvise(MADV_HUGEPAGE) before touching
    bool mapped = true;          ///< cudaHostRegisterMapped (needed by the zero-copy kernels)
  };

  /// Maps, touches and pins `bytes` (> 0) bytes; `item_bytes` (> 0) is the page or snapshot
  /// size that register chunks are aligned to.
  static Result<PinnedHostPool> create(std::size_t bytes, std::size_t item_bytes, Options options);
  static Result<PinnedHostPool> create(std::size_t bytes, std::size_t item_bytes) {
    return create(bytes, item_bytes, Options{});
  }

  PinnedHostPool() = default;
  PinnedHostPool(PinnedHostPool&& other) noexcept { *this = std::move(other); }
  PinnedHostPool& operator=(PinnedHostPool&& other) noexcept;
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;
  ~PinnedHostPool() { reset(); }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  /// Bytes of every registration except possibly the last (a multiple of item_bytes).
  std::size_t register_chunk_bytes() const { return chunk_; }
  std::size_t registrations() const { return registered_.size(); }
  /// Unpins and unmaps (also done by the destructor).
  void reset();

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t chunk_ = 0;
  std::vector<std::byte*> registered_;
};

}  // namespace radixtier::cuda
