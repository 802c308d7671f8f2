// MissBreakdown: where a cache lost the reuse an infinite cache would have had, request by
// request, so a hit ratio below the attention-only twin's says why (issue 11).
//
// Requests are taken in admission order. For each one:
//   reachable  the deepest page boundary of its query (all but the last prompt token) that
//              some earlier admitted prompt shares (an infinite attention-only cache over the
//              whole cluster: the most it could resume at);
//   placed     the deepest boundary <= reachable at which some earlier request kept a snapshot
//              (RequestResult::snapshot_boundaries): the most placement allowed, had nothing
//              been evicted;
//   cached     the usable match it got; kv the KV it found along the prompt (kv_tokens).
// The lost tokens reachable - cached split exactly into
//   no_snapshot_placed = reachable - placed            placement never put a snapshot there
//   kv_missing         = placed - max(cached, min(kv, placed))   the KV was evicted (or is on
//                                                       another instance)
//   snapshot_missing   = min(kv, placed) - cached      the KV is there, the snapshot is gone
// (each clamped at 0; a request admitted with a usable match deeper than `placed`, possible
// when a concurrent request's snapshot arrived first, counts no loss). no_snapshot_placed is
// further split by the kind of resume point: `tail` where some earlier prompt through the
// point ends less than `alignment` tokens below it (the next turn of a conversation),
// `branch` where an earlier admission already reached exactly this point, `divergence` the
// rest (a first-time divergence inside an earlier prompt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier::sim {

struct MissBreakdown {
  std::uint64_t requests = 0;
  std::uint64_t reachable_tokens = 0;
  std::uint64_t cached_tokens = 0;
  std::uint64_t no_snapshot_placed = 0;
  std::uint64_t no_snapshot_tail = 0;        ///< of no_snapshot_placed
  std::uint64_t no_snapshot_branch = 0;      ///< of no_snapshot_placed
  std::uint64_t no_snapshot_divergence = 0;  ///< of no_snapshot_placed
  std::uint64_t kv_missing = 0;
  std::uint64_t snapshot_missing = 0;
};

/// One admitted request as the breakdown needs it.
struct MissInput {
  double admitted_s = 0;
  std::span<const Token> prompt;
  std::span<const Token> output;
  std::size_t cached_tokens = 0;
  std::size_t kv_tokens = 0;
  std::span<const std::size_t> snapshot_boundaries;  ///< token counts into prompt + output
};

/// The breakdown over `requests` (any order: they are sorted by admitted_s, ties by index).
/// `alignment` (tokens, >= page_size) is the tail rule's G (placement_alignment).
MissBreakdown miss_breakdown(std::span<const MissInput> requests, std::uint32_t page_size,
                             std::size_t alignment);

}  // namespace radixtier::sim
