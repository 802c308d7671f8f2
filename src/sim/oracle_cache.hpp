// The oracle (cache 'oracle', traces only): the headroom of any hybrid prefix cache at the same
// bytes, offline. It knows every request's future, serves the trace strictly in order without
// time, with the cluster's total bytes as one pool, at page granularity (docs/simulator.md,
// "The oracle").
//
// Per request t, on its sequence S(t) = prompt + output but its last token (the tokens that
// have KV), cut into full pages named by the chained hash of their prefix (block_hash):
//
//   hit(t)    = the deepest page boundary b <= cap(t) (all but the last prompt token, floored
//               to a page) such that every page up to b is resident and a snapshot at exactly
//               b is resident; with free snapshots (the attention-only bound) every resident
//               boundary is resumable, so b = the leading run of resident pages.
//   insert    = every page of S(t); a snapshot at each boundary of S(t) past hit(t) (the
//               states it computed) that a later request will resume from (its target: the
//               deepest boundary it shares with any earlier sequence, the infinite cache's
//               resume point), unless one is there.
//   evict     = while the bytes exceed the capacity, Belady's MIN over the resident items,
//               priced: an item never used again first; else the one with the largest
//               (next use - now) x bytes / the tokens that use resumes through it (a page: its
//               page_size tokens; a snapshot: its depth, the whole prefix it makes resumable).
//               A page's next use = the next request with that page within its cap; a
//               snapshot's = the next request whose target it is. Candidates: the leaf pages
//               without a snapshot, by (next use, depth) (a page's next use is never after
//               its children's, so the resident pages stay prefix-closed and a page goes only
//               after the snapshot at it), and per bucket of depth (a factor 2^(1/8) each) the
//               snapshot with the farthest next use.
//
// With free snapshots (snapshot_bytes 0) the run is MIN with bypass over unit-size pages,
// each request touching its pages root to leaf: the optimum of a page-granular attention-only
// cache of those bytes serving the trace in order, hence a true upper bound for any hybrid
// cache there (it pays for its snapshots and resumes from fewer boundaries). Exactly so when
// no page reappears past a later request's cap (pages_past_cap 0: a reappearance there is a
// free reload that MIN over counted uses does not exploit). With paid snapshots it is a
// near-optimal oracle, not a bound (the hybrid problem couples a snapshot with the pages under
// it; the greedy prices each item alone and keeps snapshots only at targets).
//
// O(P log P) for P pages over all sequences: every item's next use is found by binary search
// in its sorted list of uses; the candidates are ordered sets.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sim/trace.hpp"
#include "sim/trace_replay.hpp"

namespace radixtier::sim {

/// What the oracle knows offline: every request's pages.
struct OracleTrace {
  std::uint32_t page_size = 64;
  /// Per request: the ids of the full pages of its sequence (prompt + all but the last output
  /// token), root first. An id names a page with its whole prefix: equal ids, equal prefixes.
  std::vector<std::vector<std::uint64_t>> pages;
  /// Per request: how many of its leading pages a hit may cover (all but its last prompt
  /// token, floored to a page).
  std::vector<std::uint32_t> cap_pages;
  std::vector<std::uint64_t> input_tokens;  ///< per request: its prompt length
};

/// The trace's pages from its prompts (`prompts` in trace order) and outputs
/// (CostExecutor::continuation, as the scheduler decodes), hashed by block_hash.
OracleTrace oracle_trace(std::span<const TraceRequest> trace, TracePrompts& prompts,
                         std::uint32_t page_size);

struct OracleStats {
  std::vector<std::uint64_t> hit_tokens;  ///< per request
  std::uint64_t hits = 0, input_tokens = 0;
  /// Pages up to each request's infinite-cache resume point: the oracle's own ceiling.
  std::uint64_t reusable_tokens = 0;
  std::uint64_t page_evictions = 0, snapshot_evictions = 0;
  std::uint64_t snapshots_placed = 0;  ///< snapshots created (paid ones only)
  std::uint64_t peak_bytes = 0;        ///< after eviction, the largest resident bytes
  /// Pages of a sequence past its request's cap that an earlier sequence already had: free
  /// reloads that MIN over counted uses does not exploit. 0: the free-snapshot run is exactly
  /// the optimum (see above).
  std::uint64_t pages_past_cap = 0;
  double hit_ratio() const {
    return input_tokens == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(input_tokens);
  }
  double ceiling_ratio() const {
    return input_tokens == 0
               ? 0.0
               : static_cast<double>(reusable_tokens) / static_cast<double>(input_tokens);
  }
};

/// Runs the oracle over `t` with `capacity_bytes`, `page_bytes` per page and `snapshot_bytes`
/// per snapshot; snapshot_bytes 0: free snapshots at every boundary (the attention-only
/// bound). page_bytes must be > 0.
OracleStats run_oracle(const OracleTrace& t, std::uint64_t capacity_bytes, std::uint64_t page_bytes,
                       std::uint64_t snapshot_bytes);

}  // namespace radixtier::sim
