// TraceReplay: the token-faithful construction of a Mooncake-format trace's prompts.
//
// A Mooncake trace names each 512-token block by a hash id, so the tokens of a prompt are
// only known up to block identity. Built from hash ids alone (synthesize_tokens, the
// "hash-only" construction), a follow-up turn never contains the previous turn's partial last
// block or the output generated for it, while in real chat traffic it does: turn k+1's prompt
// is turn k's prompt + turn k's output + the new message. The faithful construction restores
// that:
//
//   parent(B) = the earlier request A whose full blocks (every hash id of A but a partial last
//               one) are a prefix of B's hash ids, with B.input_length >= A.input_length +
//               A.output_length and A's last full block not a hub; the longest such shared
//               prefix wins, then the latest A.
//   prompt(B) = prompt(A) + the output_length(A) tokens the executor generates after it
//               (CostExecutor::continuation) + B's own hash-id tokens for the positions left;
//               without a parent, B's hash-id tokens (as the hash-only construction).
//   hub       = a block followed by more than kHubSuccessors distinct next blocks across the
//               trace (full or partial): a system prompt or document shared by many
//               conversations, not a turn of one. A request whose full blocks end in a hub is
//               nobody's parent. One conversation gives a block at most one full successor
//               and one partial successor per turn that ends inside the next block; turns add
//               a message and an output each, so a chain of turns rarely passes 8 within one
//               512-token block.
//
// input_length stays the trace's; only which tokens fill it changes. Prompts are built on
// demand: `TracePrompts` keeps a parent's prompt while children of it are still to come in
// the current in-order pass (in order, every prompt costs its own length once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/ids.hpp"
#include "sim/trace.hpp"

namespace radixtier::sim {

/// More distinct next blocks than this make a block a hub (see above).
inline constexpr std::size_t kHubSuccessors = 8;

/// The faithful construction's parent of every request (-1: none).
struct TraceParents {
  std::vector<std::int64_t> parent;
  std::size_t with_parent = 0;   ///< requests that got a parent
  std::size_t hub_blocks = 0;    ///< blocks with more than kHubSuccessors successors
  std::size_t hub_refusals = 0;  ///< requests whose full blocks end in a hub (no parent)
  bool empty() const { return parent.empty(); }
};

/// Parents by the rule above, in trace order (requests sorted by timestamp: trace order).
TraceParents find_trace_parents(std::span<const TraceRequest> trace,
                                std::uint32_t block_tokens = kTraceBlockTokens);

/// Prompt `i` without any cache: recursive through its ancestors (tests, random access).
std::vector<Token> faithful_prompt(std::span<const TraceRequest> trace, const TraceParents& parents,
                                   std::size_t i, std::uint32_t block_tokens = kTraceBlockTokens);

/// In-order prompt builder: prompt(i) for i = 0, 1, ... costs each prompt's length once; a
/// parent's prompt is kept until its last child was built in this pass. Any order is correct
/// (an evicted ancestor is rebuilt). Not thread-safe: one per simulation run.
class TracePrompts {
 public:
  /// `parents` empty: the hash-only construction (synthesize_tokens).
  TracePrompts(std::span<const TraceRequest> trace, const TraceParents* parents,
               std::uint32_t block_tokens = kTraceBlockTokens);

  std::vector<Token> prompt(std::size_t i);

 private:
  const std::vector<Token>& kept(std::size_t i);

  std::span<const TraceRequest> trace_;
  const TraceParents* parents_;
  std::uint32_t block_tokens_;
  std::vector<std::uint32_t> children_;   ///< per request: children in the trace
  std::vector<std::uint32_t> remaining_;  ///< per request: children not built in this pass
  std::unordered_map<std::size_t, std::vector<Token>> kept_;
};

/// What an infinite cache of every computed token could reuse, request by request: the
/// longest prefix of request i's prompt that some earlier request's prompt + output (all but
/// its last output token: the tokens with KV) shares, on all but i's last prompt token.
/// Exact at page boundaries of `granule` tokens and at every earlier sequence's end (a turn's
/// continuation); a divergence inside a granule counts the granule's start. Prompts come from
/// `prompts` in trace order.
std::vector<std::uint64_t> token_reuse(std::span<const TraceRequest> trace, TracePrompts& prompts,
                                       std::uint32_t granule = 16);

}  // namespace radixtier::sim
