// Router: which instance of a modeled cluster serves a trace request.
//
//   round-robin  request i goes to instance i mod N
//   session      sticky by conversation: requests whose first 512-token block has the same
//                hash id (a Mooncake trace has no session field; a conversation's turns share
//                their first block) go where the first of them went; a new key goes to the
//                least loaded instance
//   prefix       SGLang's cache-aware router at its defaults: when the loads are imbalanced
//                (max - min > 64 and max > 1.5 min) the least loaded instance; else the
//                instance whose cache holds the longest run of the request's leading blocks,
//                ties by load, then by index, unless that run is at most 0.3 of the request
//                (then the instance with the smallest tree: the fewest blocks in its index,
//                ties by load, then by index). The router cannot look
//                into an instance's cache without changing it (an admission locks and promotes), so
//                it keeps, per instance, an LRU index of the blocks it sent there, as large as the
//                instance's cache bytes, as SGLang's router keeps an approximate tree of what it
//                routed to each worker
//
// Load = requests routed to the instance and not finished yet, as the caller reports it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "radixtier/status.hpp"
#include "sim/block_lru_ideal.hpp"
#include "sim/trace.hpp"

namespace radixtier::sim {

enum class RouterKind { kRoundRobin, kSession, kPrefix };

/// SGLang router defaults (sgl-router main.rs CliArgs / router_args.py RouterArgs).
inline constexpr std::size_t kBalanceAbsThreshold = 64;
inline constexpr double kBalanceRelThreshold = 1.5;
inline constexpr double kCacheThreshold = 0.3;

const char* to_string(RouterKind kind);
/// "round-robin" | "session" | "prefix"
Result<RouterKind> parse_router_kind(std::string_view text);

class Router {
 public:
  /// `capacity_blocks`: the prefix router's index size per instance, in trace blocks.
  Router(RouterKind kind, std::size_t instances, std::uint64_t capacity_blocks,
         std::uint32_t page_size);

  /// The instance for `request`; `load[i]` is instance i's load now (load.size() = instances).
  std::size_t route(const TraceRequest& request, std::span<const std::size_t> load);

  /// Instance `instance` restarted empty: the prefix router's index of it starts afresh (a
  /// real router learns it from the instance's KV events, AllBlocksCleared).
  void forget(std::size_t instance);

  RouterKind kind() const { return kind_; }
  std::size_t instances() const { return n_; }

 private:
  std::size_t least_loaded(std::span<const std::size_t> load) const;
  /// The prefix router's instance for a request that matches little anywhere.
  std::size_t smallest_tree(std::span<const std::size_t> load) const;

  RouterKind kind_;
  std::size_t n_;
  std::uint32_t page_size_;
  std::size_t next_ = 0;                                    ///< round-robin
  std::unordered_map<std::uint64_t, std::size_t> session_;  ///< first block id -> instance
  std::vector<BlockLruIdeal> index_;                        ///< prefix: per instance
};

}  // namespace radixtier::sim
