// The shared tier's decision on a local miss (issue 22, item 3), one rule for the real tier
// (SharedTier, over Redis) and the simulator's model of it:
//
//   local tree:   KV to kv_end, usable (KV + snapshot) to resume
//   probe:        KV pages [kv_end, last) and snapshot manifests at boundaries (resume, last]
//                 of the shared tier, one pipelined round
//   candidates:   boundaries B with every KV page in [kv_end, B) and a snapshot at B shared,
//                 deepest first, each worth fetching only when
//                   latency + (KV bytes + snapshot bytes) / bandwidth  <  recompute(resume, B)
//   fetch:        the deepest candidate; when its snapshot does not arrive whole, the next one
//                 down (the KV that arrived is kept), so a partial fetch resumes at the deepest
//                 boundary that arrived whole
//
// `last` is the prompt's last whole page before its last token (admit() computes that one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace radixtier::shared {

/// What a lookup needs to decide; pages and boundaries are counted in pages from the root.
struct FetchPlanInput {
  std::uint32_t page_size = 0;
  std::size_t prompt_tokens = 0;  ///< the whole prompt (its last token is never cached)
  std::size_t resume_tokens = 0;  ///< the local usable match (MatchResult::usable_tokens)
  std::size_t kv_tokens = 0;      ///< the local KV (MatchResult::kv_tokens)
  std::size_t page_bytes = 0;
  std::size_t snapshot_bytes = 0;
  double bandwidth = 0;  ///< bytes/s the shared tier delivers to one reader
  double latency_s = 0;  ///< one round trip (a fetch takes at least one)
  /// Seconds of prefill from `from` to `to` tokens (the cost of not fetching).
  std::function<double(std::size_t from, std::size_t to)> recompute_s;
};

/// The probe's extent: KV pages [first_kv_page, end_page) and snapshot boundaries at pages
/// (first_snapshot_page, end_page] (a boundary at page j ends after j pages).
struct ProbeRange {
  std::size_t first_kv_page = 0;
  std::size_t first_snapshot_page = 0;  ///< exclusive: the local resume point
  std::size_t end_page = 0;
  bool empty() const { return end_page <= first_snapshot_page; }
};

/// Where a lookup probes, at most `max_pages` pages past the local KV; empty when the prompt
/// reaches fewer than `min_tokens` past the local resume point.
ProbeRange probe_range(const FetchPlanInput& in, std::size_t min_tokens, std::size_t max_pages);

struct FetchCandidate {
  std::size_t boundary_page = 0;  ///< resume after this many pages
  std::size_t first_kv_page = 0;  ///< KV pages [first_kv_page, boundary_page) to fetch
  std::uint64_t bytes = 0;
  double fetch_s = 0, recompute_s = 0;
};

/// The candidates worth fetching, deepest first. kv_shared[i]: page first_kv_page + i is
/// shared; snapshot_shared[j]: the boundary at page first_snapshot_page + 1 + j is.
std::vector<FetchCandidate> plan_fetch(const FetchPlanInput& in, const ProbeRange& range,
                                       const std::vector<bool>& kv_shared,
                                       const std::vector<bool>& snapshot_shared);

}  // namespace radixtier::shared
