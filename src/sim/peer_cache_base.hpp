// PeerCacheBase: what the simulator's two peer caches (VllmLikeCache, SglangLikeCache) do
// alike as CacheBackends: the table of admitted requests by lock, the pages and snapshot slots
// a request allocated and has not inserted (ownership checks, freeing them), release, poll,
// wait and the stats. Each peer's own rules (match, insert, eviction, its pools) stay in its
// own file; it gives its pages and slots back through put_page / put_slot and all a request
// holds at release through drop.
//
// `Request` is the peer's request: it has `pages` and `states` (std::vector<std::uint32_t>, the
// ids allocated and not inserted) and `cached` (the tokens its admission resumes from).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"

namespace radixtier::sim {

template <class Request>
class PeerCacheBase : public CacheBackend {
 public:
  Result<TransferState> poll(LockId lock) override {
    auto r = find(lock, "poll");
    if (!r) return r.status();
    return TransferState::kDone;  // every copy is made at admission: none runs in the background
  }

  Result<std::size_t> wait(LockId lock) override {
    auto r = find(lock, "wait");
    if (!r) return r.status();
    return (*r)->cached;
  }

  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override {
    auto r = find(lock, "free_pages");
    if (!r) return r.status();
    for (GpuPageId p : pages) {
      if (!owns((*r)->pages, p.value())) {
        return invalid_argument("free_pages: page " + std::to_string(p.value()) +
                                " is not this request's");
      }
    }
    for (GpuPageId p : pages) {
      disown((*r)->pages, p.value());
      put_page(p.value());
    }
    return Status::ok();
  }

  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override {
    auto r = find(lock, "free_snapshot_slot");
    if (!r) return r.status();
    if (!disown((*r)->states, slot.value())) {
      return invalid_argument("free_snapshot_slot: slot " + std::to_string(slot.value()) +
                              " is not this request's");
    }
    put_slot(slot.value());
    return Status::ok();
  }

  Status release(LockId lock) override {
    auto r = find(lock, "release");
    if (!r) return r.status();
    drop(**r);
    requests_.erase(lock.value());
    return Status::ok();
  }

  CacheStats stats() const override { return stats_; }

 protected:
  /// Gives back a page / a snapshot slot a request allocated and did not insert.
  virtual void put_page(std::uint32_t page) = 0;
  virtual void put_slot(std::uint32_t slot) = 0;
  /// Gives back all a request holds when it is released (its path, its allocations).
  virtual void drop(Request& r) = 0;

  /// The request of `lock`; kNotFound, naming the call `what`, when there is none.
  Result<Request*> find(LockId lock, const char* what) {
    auto r = std::as_const(*this).find(lock, what);
    if (!r) return r.status();
    return const_cast<Request*>(*r);
  }
  Result<const Request*> find(LockId lock, const char* what) const {
    auto it = requests_.find(lock.value());
    if (it == requests_.end()) {
      return Status(ErrorCode::kNotFound,
                    std::string(what) + ": unknown lock " + std::to_string(lock.value()));
    }
    return &it->second;
  }

  /// Files an admitted request under a new lock.
  LockId add(Request r) {
    const LockId lock(next_lock_++);
    requests_.emplace(lock.value(), std::move(r));
    return lock;
  }

  /// insert()'s checks: pages [from, end) and the snapshot slot are the request's own.
  static Status check_owned(const Request& r, std::span<const GpuPageId> pages, std::size_t from,
                            std::optional<GpuSlotId> snapshot) {
    for (std::size_t i = from; i < pages.size(); ++i) {
      if (!owns(r.pages, pages[i].value())) {
        return invalid_argument("insert: page " + std::to_string(pages[i].value()) +
                                " is not this request's");
      }
    }
    if (snapshot && !owns(r.states, snapshot->value())) {
      return invalid_argument("insert: snapshot slot " + std::to_string(snapshot->value()) +
                              " is not this request's");
    }
    return Status::ok();
  }

  static bool owns(const std::vector<std::uint32_t>& owned, std::uint32_t u) {
    return std::find(owned.begin(), owned.end(), u) != owned.end();
  }
  /// Removes `u` from `owned`; false when the request does not own it.
  static bool disown(std::vector<std::uint32_t>& owned, std::uint32_t u) {
    auto it = std::find(owned.begin(), owned.end(), u);
    if (it == owned.end()) return false;
    owned.erase(it);
    return true;
  }

  std::unordered_map<std::uint32_t, Request> requests_;
  CacheStats stats_;

 private:
  std::uint32_t next_lock_ = 0;
};

}  // namespace radixtier::sim
