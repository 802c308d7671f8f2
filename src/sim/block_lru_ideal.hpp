// BlockLruIdeal: the hybrid-free reference for trace replay: an LRU cache of KV blocks alone
// (a pure-attention model needs no snapshot, so any cached prefix is usable), keyed by the
// trace's block hash ids, holding `capacity_blocks` blocks.
//
// Per request, in order: the hit is the run of leading blocks present (a partial last block
// counts its own tokens), capped like admission is (all but the last prompt token, floored to
// `page_size`); then every block of the request becomes most recent, the last block the least
// recent of them, so eviction takes the tails of prefixes first (leaf-first, as a radix
// cache), and the least recent blocks are evicted until the capacity holds.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "sim/trace.hpp"

namespace radixtier::sim {

class BlockLruIdeal {
 public:
  BlockLruIdeal(std::uint64_t capacity_blocks, std::uint32_t page_size,
                std::uint32_t block_tokens = kTraceBlockTokens);

  /// Serves one request; returns its hit tokens.
  std::uint64_t access(const TraceRequest& request);
  /// How many of the request's leading blocks are cached now (changes nothing).
  std::uint64_t leading_blocks(const TraceRequest& request) const;

  std::uint64_t hit_tokens() const { return hit_tokens_; }
  std::uint64_t input_tokens() const { return input_tokens_; }
  double hit_ratio() const {
    return input_tokens_ == 0
               ? 0.0
               : static_cast<double>(hit_tokens_) / static_cast<double>(input_tokens_);
  }
  std::size_t blocks() const { return map_.size(); }
  std::uint64_t capacity_blocks() const { return capacity_; }
  std::uint64_t evictions() const { return evictions_; }

 private:
  std::uint64_t capacity_;
  std::uint32_t page_size_, block_tokens_;
  std::list<std::uint64_t> lru_;  ///< front: most recent
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> map_;
  std::uint64_t hit_tokens_ = 0, input_tokens_ = 0, evictions_ = 0;
};

/// Runs the ideal over a whole trace; capacity from bytes: capacity_bytes / (block_tokens x
/// kv_bytes_per_token).
BlockLruIdeal run_block_lru_ideal(std::span<const TraceRequest> requests,
                                  std::uint64_t capacity_bytes, std::uint64_t kv_bytes_per_token,
                                  std::uint32_t page_size,
                                  std::uint32_t block_tokens = kTraceBlockTokens);

}  // namespace radixtier::sim
