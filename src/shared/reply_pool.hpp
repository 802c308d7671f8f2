// ReplyPool: reply vectors for SharedStore::get_into() that fetches borrow and hand back, so
// a steady stream of fetches receives its values into memory the process already touched
// (no fresh 4 MiB allocations, no page faults) whatever the process's malloc tuning.
//
// take() hands out the vector given back last (its pages the most likely still warm), or an
// empty one; give() keeps a vector while the pool holds fewer than `max_vectors` and their
// value capacity stays within `max_bytes`; else the vector is freed (so the pool never holds
// more than max_bytes of value buffers: a rare huge fetch is not kept). A Lease gives its
// vector back when it ends.
//
// Thread-safe (one mutex): fetches take and give from their worker threads. What a vector
// held when given back is stale: a borrower must read only what its own get_into() wrote.
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "radixtier/shared/shared_store.hpp"

namespace radixtier::shared::detail {

class ReplyPool {
 public:
  ReplyPool(std::size_t max_vectors, std::size_t max_bytes)
      : max_vectors_(max_vectors), max_bytes_(max_bytes) {}
  ReplyPool(const ReplyPool&) = delete;
  ReplyPool& operator=(const ReplyPool&) = delete;

  std::vector<GetReply> take();
  void give(std::vector<GetReply> replies);

  /// Value bytes (string capacities) held by the pool now.
  std::size_t held_bytes() const;
  std::size_t held_vectors() const;

  /// A vector borrowed for one scope.
  class Lease {
   public:
    explicit Lease(ReplyPool& pool) : pool_(&pool), replies_(pool.take()) {}
    ~Lease() { pool_->give(std::move(replies_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    std::vector<GetReply>& operator*() { return replies_; }
    std::vector<GetReply>* operator->() { return &replies_; }

   private:
    ReplyPool* pool_;
    std::vector<GetReply> replies_;
  };

 private:
  static std::size_t capacity_of(const std::vector<GetReply>& replies);

  const std::size_t max_vectors_;
  const std::size_t max_bytes_;
  mutable std::mutex mu_;
  std::vector<std::vector<GetReply>> kept_;  // guarded by mu_; the last one is taken first
  std::vector<std::size_t> kept_bytes_;      // guarded by mu_; capacity_of(kept_[i])
  std::size_t held_bytes_ = 0;               // guarded by mu_
};

}  // namespace radixtier::shared::detail
