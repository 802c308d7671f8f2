// Executor: the compute backend a Scheduler drives, kept small so the scheduler does not
// depend on a model. ModelExecutor runs the tiny hybrid model over HostArenas; a simulator
// plugs in an executor that returns modeled seconds instead of computing.
//
// Per request, the executor owns exactly two private state buffers and nothing else:
//   live state   created by begin() (zeroed, or a COPY of a cached snapshot slot: the cached
//                slot is only read, never run on, rule 6 of the brief), advanced by
//                forward(), copied into a snapshot slot by save_snapshot().
//   checkpoint   a copy of the live state taken by checkpoint() (the scheduler takes one at
//                each page boundary during decode), copied into a snapshot slot by
//                save_checkpoint() when the request finishes: the finish boundary is the last
//                page boundary of prompt + output, which decode passes before it ends.
// The request's lifecycle: begin -> forward* (with next_token / checkpoint in between) ->
// save_snapshot / save_checkpoint as the policy asks -> end. end() forgets everything.
//
// Captures: a prefill forward may also save the state at positions inside it
// (forward_capturing), so an engine runs its own chunked-prefill size and still keeps
// snapshots at finer boundaries. A chunked GDN kernel has these states already: it computes
// the recurrent state at every sub-chunk start (FLA's chunk_gated_delta_rule_fwd_h, 64-token
// sub-chunks), and SGLang's extra_buffer strategy copies one of them out at a branch point
// inside a chunk. capture_granularity() says where an executor can capture.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"

namespace radixtier::sched {

using RequestId = std::uint64_t;

/// A state forward_capturing() saves on its way: the state after the tokens before
/// `position` (absolute), copied into GPU snapshot slot `slot` (held by the caller).
struct StateCapture {
  std::size_t position = 0;
  GpuSlotId slot{};
};

class Executor {
 public:
  virtual ~Executor() = default;

  /// Bytes of one live state (= one snapshot); a cost executor may report the modeled size.
  virtual std::size_t state_bytes() const = 0;

  /// Creates the request's own live state: zeroed, or a copy of GPU snapshot slot
  /// `restore_from` (the state after the matched prefix). kInvalidArgument when the request
  /// already exists or the slot is out of range.
  virtual Status begin(RequestId request, std::optional<GpuSlotId> restore_from) = 0;

  /// Runs `tokens` at positions [pos, pos + tokens.size()) with the K/V of every earlier
  /// position in `page_table` (which covers the new positions too). Returns the seconds the
  /// call took (measured) or would take (modeled). On error nothing changed.
  virtual Result<double> forward(RequestId request, std::span<const Token> tokens, std::size_t pos,
                                 std::span<const GpuPageId> page_table) = 0;

  /// Positions inside one forward() where this executor can capture the state are `pos` plus
  /// a multiple of this (the tiny model: 1; a chunked GDN kernel: its sub-chunk, 64). 0: it
  /// cannot capture; the scheduler then ends a forward wherever it needs a state.
  virtual std::size_t capture_granularity() const { return 0; }

  /// forward(), saving the state at each capture's position on the way. Captures are
  /// ascending, strictly inside (pos, pos + tokens.size()), at pos plus a multiple of
  /// capture_granularity(); kInvalidArgument otherwise, and nothing changed. The default
  /// (an executor that cannot capture) accepts only an empty list.
  virtual Result<double> forward_capturing(RequestId request, std::span<const Token> tokens,
                                           std::size_t pos, std::span<const GpuPageId> page_table,
                                           std::span<const StateCapture> captures) {
    if (!captures.empty()) {
      return invalid_argument(
          "forward_capturing: this executor cannot capture states inside a forward");
    }
    return forward(request, tokens, pos, page_table);
  }

  /// Logits of the last token of the last forward(); empty for cost-model executors and
  /// before the first forward().
  virtual std::span<const float> last_logits(RequestId request) const = 0;

  /// The next output token after the last forward(): greedy for a real model, a
  /// deterministic synthesized token for a cost model.
  virtual Result<Token> next_token(RequestId request) = 0;

  /// Copies the live state into GPU snapshot slot `slot` (held by the caller).
  virtual Status save_snapshot(RequestId request, GpuSlotId slot) = 0;

  /// Keeps a private copy of the live state (replacing the previous one).
  virtual Status checkpoint(RequestId request) = 0;

  /// Copies the last checkpoint() into GPU snapshot slot `slot`. kFailedPrecondition when
  /// there is none.
  virtual Status save_checkpoint(RequestId request, GpuSlotId slot) = 0;

  /// Forgets the request (its live state and checkpoint). Unknown ids are ignored.
  virtual void end(RequestId request) = 0;

  /// Seconds the scheduler's thread was blocked while the cache waited for `copies` slices
  /// moving `bytes` (CacheStats::alloc_wait_*) inside an allocation or an admission. A real
  /// executor runs on the wall clock, where such a wait has already been paid: 0. A cost
  /// model charges it to its virtual clock.
  virtual double copy_wait_seconds(std::uint64_t copies, std::uint64_t bytes) const {
    (void)copies;
    (void)bytes;
    return 0;
  }

  /// The same for the tier below host: the cache waited for `waits` store writes moving
  /// `bytes` (CacheStats::store_copy_waits / store_wait_bytes) while making host room on
  /// demand. 0 for a real executor; a cost model charges the writes to its virtual clock.
  virtual double store_wait_seconds(std::uint64_t waits, std::uint64_t bytes) const {
    (void)waits;
    (void)bytes;
    return 0;
  }
};

/// The checks forward_capturing() makes (see there) for a forward of `tokens` tokens at
/// `pos` by an executor of capture granularity `granularity`; kInvalidArgument naming the
/// first bad capture.
Status check_captures(std::span<const StateCapture> captures, std::size_t pos, std::size_t tokens,
                      std::size_t granularity);

}  // namespace radixtier::sched
