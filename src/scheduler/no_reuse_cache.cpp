// The no-reuse baseline cache.
#include "radixtier/scheduler/no_reuse_cache.hpp"

#include <string>

namespace radixtier::sched {

NoReuseCache::NoReuseCache(std::uint32_t page_size, std::uint32_t gpu_pages,
                           std::uint32_t gpu_slots)
    : page_size_(page_size),
      gpu_pages_(gpu_pages),
      gpu_slots_(gpu_slots),
      page_owner_(gpu_pages),
      slot_owner_(gpu_slots) {
  for (std::uint32_t i = gpu_pages; i > 0; --i) free_pages_.push_back(GpuPageId(i - 1));
  for (std::uint32_t i = gpu_slots; i > 0; --i) free_slots_.push_back(GpuSlotId(i - 1));
}

Status NoReuseCache::known(LockId lock) const {
  if (!locks_.contains(lock.value())) {
    return not_found("no-reuse cache: lock " + std::to_string(lock.value()) + " is unknown");
  }
  return Status::ok();
}

Result<Admission> NoReuseCache::admit(std::span<const Token> prompt) {
  if (prompt.empty()) return invalid_argument("admit: the prompt is empty");
  const LockId id(next_lock_++);
  locks_.insert(id.value());
  ++stats_.admissions;
  stats_.requested_tokens += prompt.size() - 1;
  Admission a;  // nothing is ever cached: kv_tokens stays 0
  a.lock = id;
  return a;
}

Result<TransferState> NoReuseCache::poll(LockId lock) {
  if (Status s = known(lock); !s) return s;
  return TransferState::kDone;
}

Result<std::size_t> NoReuseCache::wait(LockId lock) {
  if (Status s = known(lock); !s) return s;
  return std::size_t{0};  // nothing is ever reused
}

Result<std::vector<GpuPageId>> NoReuseCache::path_pages(LockId lock) const {
  if (Status s = known(lock); !s) return s;
  return std::vector<GpuPageId>{};
}

Result<GpuSlotId> NoReuseCache::path_snapshot(LockId lock) const {
  if (Status s = known(lock); !s) return s;
  return not_found("path_snapshot: the admission matched nothing");
}

Result<std::vector<GpuPageId>> NoReuseCache::alloc_pages(LockId lock, std::size_t n) {
  if (Status s = known(lock); !s) return s;
  if (n > gpu_pages_) {
    return invalid_argument("alloc_pages: " + std::to_string(n) +
                            " pages asked, the GPU pool has " + std::to_string(gpu_pages_));
  }
  if (n > free_pages_.size()) {
    return out_of_memory("alloc_pages: " + std::to_string(n) + " pages asked, " +
                         std::to_string(free_pages_.size()) + " free");
  }
  std::vector<GpuPageId> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const GpuPageId p = free_pages_.back();
    free_pages_.pop_back();
    page_owner_.add(lock, p);
    out.push_back(p);
  }
  return out;
}

Result<GpuSlotId> NoReuseCache::alloc_snapshot_slot(LockId lock) {
  if (Status s = known(lock); !s) return s;
  if (free_slots_.empty()) return out_of_memory("alloc_snapshot_slot: no free slot");
  GpuSlotId s = free_slots_.back();
  free_slots_.pop_back();
  slot_owner_.add(lock, s);
  return s;
}

Status NoReuseCache::free_pages(LockId lock, std::span<const GpuPageId> pages) {
  if (Status s = known(lock); !s) return s;
  std::vector<bool> seen(gpu_pages_, false);
  for (GpuPageId p : pages) {
    if (!p.valid() || p.value() >= gpu_pages_ || seen[p.value()]) {
      return invalid_argument("free_pages: page " + std::to_string(p.value()) +
                              " is out of range or listed twice");
    }
    if (Status s = page_owner_.check_owner(lock, p, "free_pages"); !s) return s;
    seen[p.value()] = true;
  }
  for (GpuPageId p : pages) {
    page_owner_.remove(p);
    free_pages_.push_back(p);
  }
  return Status::ok();
}

Status NoReuseCache::free_snapshot_slot(LockId lock, GpuSlotId slot) {
  if (Status s = known(lock); !s) return s;
  if (!slot.valid() || slot.value() >= gpu_slots_)
    return invalid_argument("free_snapshot_slot: slot out of range");
  if (Status s = slot_owner_.check_owner(lock, slot, "free_snapshot_slot"); !s) return s;
  slot_owner_.remove(slot);
  free_slots_.push_back(slot);
  return Status::ok();
}

Result<InsertResult> NoReuseCache::insert(LockId lock, std::span<const Token> tokens,
                                          std::span<const GpuPageId> pages,
                                          std::optional<GpuSlotId> snapshot) {
  if (Status s = known(lock); !s) return s;
  if (tokens.size() % page_size_ != 0 || pages.size() != tokens.size() / page_size_) {
    return invalid_argument("insert: tokens and pages must be whole pages of the same count");
  }
  if (snapshot) {
    if (!snapshot->valid() || snapshot->value() >= gpu_slots_)
      return invalid_argument("insert: snapshot slot out of range");
    if (Status s = slot_owner_.check_owner(lock, *snapshot, "insert"); !s) return s;
  }
  InsertResult out;
  for (GpuPageId p : pages) {
    if (!p.valid() || p.value() >= gpu_pages_)
      return invalid_argument("insert: page " + std::to_string(p.value()) + " out of range");
    if (Status s = page_owner_.check_owner(lock, p, "insert"); !s) return s;
    out.not_taken.push_back(p);
  }
  return out;
}

Status NoReuseCache::release(LockId lock) {
  if (Status s = known(lock); !s) return s;
  locks_.erase(lock.value());
  for (GpuPageId p : page_owner_.take_all(lock)) free_pages_.push_back(p);
  for (GpuSlotId s : slot_owner_.take_all(lock)) free_slots_.push_back(s);
  return Status::ok();
}

std::string NoReuseCache::check_invariants() const {
  if (std::string e = page_owner_.check("no-reuse cache pages"); !e.empty()) return e;
  if (std::string e = slot_owner_.check("no-reuse cache slots"); !e.empty()) return e;
  if (page_owner_.owned_count() + free_pages_.size() != gpu_pages_)
    return "no-reuse cache: page counts differ";
  if (slot_owner_.owned_count() + free_slots_.size() != gpu_slots_)
    return "no-reuse cache: slot counts differ";
  return {};
}

}  // namespace radixtier::sched
