// The hybrid-free LRU block cache (see block_lru_ideal.hpp).
#include "sim/block_lru_ideal.hpp"

#include <algorithm>

namespace radixtier::sim {

BlockLruIdeal::BlockLruIdeal(std::uint64_t capacity_blocks, std::uint32_t page_size,
                             std::uint32_t block_tokens)
    : capacity_(capacity_blocks),
      page_size_(std::max<std::uint32_t>(1, page_size)),
      block_tokens_(std::max<std::uint32_t>(1, block_tokens)) {}

std::uint64_t BlockLruIdeal::access(const TraceRequest& r) {
  input_tokens_ += r.input_length;
  std::uint64_t hit = 0;
  for (std::size_t b = 0; b < r.hash_ids.size(); ++b) {
    if (!map_.contains(r.hash_ids[b])) break;
    hit += std::min<std::uint64_t>(block_tokens_, r.input_length - b * block_tokens_);
  }
  const std::uint64_t cap =
      r.input_length == 0 ? 0 : (r.input_length - 1) / page_size_ * page_size_;
  hit = std::min(hit, cap);
  hit_tokens_ += hit;
  // Most recent: the first block; the tail is the least recent of this request's blocks.
  for (std::size_t i = r.hash_ids.size(); i-- > 0;) {
    const std::uint64_t id = r.hash_ids[i];
    if (auto it = map_.find(id); it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
    } else if (capacity_ > 0) {
      lru_.push_front(id);
      map_.emplace(id, lru_.begin());
    }
  }
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
    ++evictions_;
  }
  return hit;
}

std::uint64_t BlockLruIdeal::leading_blocks(const TraceRequest& r) const {
  std::uint64_t n = 0;
  while (n < r.hash_ids.size() && map_.contains(r.hash_ids[n])) ++n;
  return n;
}

BlockLruIdeal run_block_lru_ideal(std::span<const TraceRequest> requests,
                                  std::uint64_t capacity_bytes, std::uint64_t kv_bytes_per_token,
                                  std::uint32_t page_size, std::uint32_t block_tokens) {
  const std::uint64_t block_bytes = std::uint64_t{block_tokens} * kv_bytes_per_token;
  BlockLruIdeal ideal(block_bytes == 0 ? 0 : capacity_bytes / block_bytes, page_size, block_tokens);
  for (const TraceRequest& r : requests) ideal.access(r);
  return ideal;
}

}  // namespace radixtier::sim
