// NoReuseCache: a CacheBackend that never reuses anything: the "no-reuse" baseline of the
// demo and of the exactness tests. Every admission matches nothing, insert() adopts nothing
// (every page stays the caller's, every snapshot slot too), so each request computes its
// prompt from scratch in pages it allocated itself. It keeps the same id accounting as the
// real cache (every page and slot is free or held by a request), so the scheduler's
// bookkeeping is checked against it too.
#pragma once

#include <unordered_set>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/cache/request_ownership.hpp"

namespace radixtier::sched {

class NoReuseCache final : public CacheBackend {
 public:
  NoReuseCache(std::uint32_t page_size, std::uint32_t gpu_pages, std::uint32_t gpu_slots);

  std::uint32_t page_size() const override { return page_size_; }
  Result<Admission> admit(std::span<const Token> prompt) override;
  /// Any namespace and priority: nothing is reused, so nothing can be shared.
  Result<Admission> admit(std::span<const Token> prompt, const RequestOptions& options) override {
    if (Status s = options.validate(); !s) return s;
    return admit(prompt);
  }
  Result<TransferState> poll(LockId lock) override;
  Result<std::size_t> wait(LockId lock) override;
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override;
  Result<GpuSlotId> path_snapshot(LockId lock) const override;
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override;
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override;
  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override;
  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override;
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  Status release(LockId lock) override;
  CacheStats stats() const override { return stats_; }
  std::string check_invariants() const override;

 private:
  Status known(LockId lock) const;

  std::uint32_t page_size_;
  std::uint32_t gpu_pages_, gpu_slots_;
  RequestOwnership<GpuPageId> page_owner_;  ///< every held page and slot has its request
  RequestOwnership<GpuSlotId> slot_owner_;
  std::vector<GpuPageId> free_pages_;
  std::vector<GpuSlotId> free_slots_;
  std::unordered_set<std::uint32_t> locks_;
  std::uint32_t next_lock_ = 0;
  CacheStats stats_;
};

}  // namespace radixtier::sched
