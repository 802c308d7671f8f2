// The no-reuse baseline cache.
#include "radixtier/scheduler/no_reuse_cache.hpp"

#include <string>

namespace radixtier::sched {

NoReuseCache::NoReuseCache(std::uint32_t page_size, std::uint32_t gpu_pages,
                           std::uint32_t gpu_slots)
    : page_size_(page_size), page_held_(gpu_pages, false), slot_held_(gpu_slots, false) {
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

Result<std::vector<GpuPageId>> NoReuseCache::alloc_pages(std::size_t n) {
  if (n > page_held_.size()) {
    return invalid_argument("alloc_pages: " + std::to_string(n) +
                            " pages asked, the GPU pool has " + std::to_string(page_held_.size()));
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
    page_held_[p.value()] = true;
    out.push_back(p);
  }
  return out;
}

Result<GpuSlotId> NoReuseCache::alloc_snapshot_slot() {
  if (free_slots_.empty()) return out_of_memory("alloc_snapshot_slot: no free slot");
  GpuSlotId s = free_slots_.back();
  free_slots_.pop_back();
  slot_held_[s.value()] = true;
  return s;
}

Status NoReuseCache::free_pages(std::span<const GpuPageId> pages) {
  std::vector<bool> seen(page_held_.size(), false);
  for (GpuPageId p : pages) {
    if (!p.valid() || p.value() >= page_held_.size() || !page_held_[p.value()] || seen[p.value()]) {
      return invalid_argument("free_pages: page " + std::to_string(p.value()) +
                              " is out of range, not held or listed twice");
    }
    seen[p.value()] = true;
  }
  for (GpuPageId p : pages) {
    page_held_[p.value()] = false;
    free_pages_.push_back(p);
  }
  return Status::ok();
}

Status NoReuseCache::free_snapshot_slot(GpuSlotId slot) {
  if (!slot.valid() || slot.value() >= slot_held_.size() || !slot_held_[slot.value()]) {
    return invalid_argument("free_snapshot_slot: slot out of range or not held");
  }
  slot_held_[slot.value()] = false;
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
  if (snapshot && (!snapshot->valid() || snapshot->value() >= slot_held_.size() ||
                   !slot_held_[snapshot->value()])) {
    return invalid_argument("insert: snapshot slot not held by a request");
  }
  InsertResult out;
  for (GpuPageId p : pages) {
    if (!p.valid() || p.value() >= page_held_.size() || !page_held_[p.value()]) {
      return invalid_argument("insert: page " + std::to_string(p.value()) + " is not held");
    }
    out.not_taken.push_back(p);
  }
  return out;
}

Status NoReuseCache::release(LockId lock) {
  if (Status s = known(lock); !s) return s;
  locks_.erase(lock.value());
  return Status::ok();
}

std::string NoReuseCache::check_invariants() const {
  std::size_t held = 0;
  for (bool h : page_held_) held += h;
  if (held + free_pages_.size() != page_held_.size()) return "no-reuse cache: page counts differ";
  held = 0;
  for (bool h : slot_held_) held += h;
  if (held + free_slots_.size() != slot_held_.size()) return "no-reuse cache: slot counts differ";
  return {};
}

}  // namespace radixtier::sched
