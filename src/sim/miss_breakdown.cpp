// The miss breakdown (see miss_breakdown.hpp for the definitions).
#include "sim/miss_breakdown.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "radixtier/scheduler/placement_learner.hpp"

namespace radixtier::sim {

MissBreakdown miss_breakdown(std::span<const MissInput> requests, std::uint32_t page_size,
                             std::size_t alignment) {
  MissBreakdown out;
  if (page_size == 0) return out;
  alignment = std::max<std::size_t>(alignment, page_size);
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return requests[a].admitted_s < requests[b].admitted_s;
  });
  // Page-prefix hash -> the fewest query tokens an earlier prompt through it had left past it.
  std::unordered_map<std::uint64_t, std::size_t> seen;
  std::unordered_set<std::uint64_t> placed_at;   ///< where snapshots were kept
  std::unordered_set<std::uint64_t> reached_at;  ///< earlier admissions' reachable points
  std::vector<Token> seq;
  for (std::size_t i : order) {
    const MissInput& r = requests[i];
    ++out.requests;
    if (r.prompt.empty()) continue;
    const auto query = r.prompt.first(r.prompt.size() - 1);
    const auto hashes = sched::PlacementLearner::page_prefix_hashes(query, page_size);
    std::size_t reach_pages = 0;
    for (std::size_t p = hashes.size(); p > 0; --p) {
      if (seen.count(hashes[p - 1]) != 0) {
        reach_pages = p;
        break;
      }
    }
    std::size_t placed_pages = 0;
    for (std::size_t p = reach_pages; p > 0; --p) {
      if (placed_at.count(hashes[p - 1]) != 0) {
        placed_pages = p;
        break;
      }
    }
    const std::size_t reachable = reach_pages * page_size;
    const std::size_t placed = placed_pages * page_size;
    const std::size_t cached = std::min(r.cached_tokens, reachable);
    out.reachable_tokens += reachable;
    out.cached_tokens += cached;
    if (cached < placed) {
      const std::size_t kv = std::min(r.kv_tokens, placed);
      const std::size_t snap_base = std::max(kv, cached);
      out.kv_missing += placed - snap_base;
      out.snapshot_missing += snap_base - cached;
    }
    const std::size_t lost_to_placement = reachable - std::max(placed, cached);
    if (lost_to_placement > 0) {
      out.no_snapshot_placed += lost_to_placement;
      const std::uint64_t h = hashes[reach_pages - 1];
      if (seen.at(h) < alignment) {
        out.no_snapshot_tail += lost_to_placement;
      } else if (reached_at.count(h) != 0) {
        out.no_snapshot_branch += lost_to_placement;
      } else {
        out.no_snapshot_divergence += lost_to_placement;
      }
    }
    if (reach_pages > 0) reached_at.insert(hashes[reach_pages - 1]);
    seq.assign(r.prompt.begin(), r.prompt.end());
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    const auto seq_hashes = sched::PlacementLearner::page_prefix_hashes(seq, page_size);
    for (std::size_t p = 0; p < seq_hashes.size(); ++p) {
      // Past the query (the output the cache inserts at finish): 0 tokens left.
      const std::size_t end = (p + 1) * page_size;
      const std::size_t left = end < query.size() ? query.size() - end : 0;
      auto [it, fresh] = seen.emplace(seq_hashes[p], left);
      if (!fresh) it->second = std::min(it->second, left);
    }
    for (std::size_t b : r.snapshot_boundaries) {
      if (b >= page_size && b % page_size == 0 && b / page_size <= seq_hashes.size()) {
        placed_at.insert(seq_hashes[b / page_size - 1]);
      }
    }
  }
  return out;
}

}  // namespace radixtier::sim
