// SnapshotPolicy: which page boundaries of a prefill keep a snapshot of the recurrent state.
//
// After a prefill chunk ends on a page boundary the scheduler asks keep(); on yes it copies
// the live state into a snapshot slot and the cache attaches it to the node at that boundary.
// A snapshot is expensive (the tiny model's is as big as the KV of 34 tokens, Qwen3-Next's as
// the KV of ~3,100), so where to keep them is a trade-off between memory and the recompute a
// later request that ends inside this prompt would pay (docs/snapshot-policies.md).
//
// Every policy but adaptive keeps the two boundaries a continuing conversation needs:
//   the final prompt boundary (the prompt length floored to a page) and
//   the finish boundary (prompt + output, floored to a page).
// Beyond those:
//   end-only      nothing else (what the index-based tier does)
//   every-chunk   every chunk end
//   interval:N    every multiple of N tokens (N a page multiple; the scheduler makes it a
//                 boundary, next_cut: a replay recomputes at most N tokens)
//   budgeted[:B]  per prompt, at most B bytes of intermediate snapshots (default: 1/8 of the
//                 prompt's KV bytes), placed greedily by expected saved recompute per byte: a
//                 later replay ending uniformly inside the prompt that resumes at boundary c
//                 instead of the kept boundary p below it saves (c - p) tokens when it ends in
//                 [c, n) (n: the next kept boundary), so a candidate's value is
//                 (c - p) * (n - c) / L tokens per snapshot_bytes.
// Two modifiers add boundaries to any of these ("BASE+tail", "BASE+branch", "BASE+tail+branch"):
//   +tail         the last chunk boundary below the final prompt boundary: a later request
//                 that shares the prompt but not its last partial chunk (an agent turn that
//                 diverges before the previous end; the next turn of a trace conversation,
//                 whose last partial block gets a new hash id) resumes there
//   +branch       the chunk boundary at or below the point where this prompt leaves the
//                 deepest cached KV path (Admission::kv_tokens, when it is above the usable
//                 match): the second request to share a prefix keeps a snapshot there, so the
//                 third one hits
// Both are chunk multiples, so the scheduler's chunking already ends a chunk there.
//   adaptive      the default: the prompt end; the finish boundary while continuations
//                 resume there (SnapshotQuery::keep_finish); the chunk tail (as +tail:
//                 since cached GPU snapshots are pages of the one GPU pool, issue 21, eviction
//                 weighs it against the KV it displaces); the aligned tail
//                 floor(L / G) * G, G = the learned alignment of branch points
//                 (SnapshotQuery::alignment); the branch point itself, at page granularity
//                 (branch_tokens, when above the usable match); and the budgeted plan's
//                 intermediate snapshots for replays and divergences that end inside an
//                 earlier prompt: 1/8 of the KV bytes the request computes, or, when more,
//                 the host bytes that would stay free once that KV is there
//                 (SnapshotQuery::host_free_bytes minus the KV): bytes nothing claims cost
//                 nothing until eviction needs them, and cost-aware eviction then drops the
//                 snapshots with the smallest gaps first. A full host tier gets the 1/8. The
//                 scheduler makes the tail and the branch point boundaries (next_cut): a
//                 forward past one captures the state there, or ends there.
//                 PlacementLearner learns G and keep_finish from what admissions do
//                 (placement_learner.hpp); the same rule for every workload.
// Two bases reproduce SGLang's hybrid radix cache (docs/sglang-like.md cites each rule), for
// the sglang-like baseline; the scheduler runs them with chunks counted from where the
// request resumed (SchedulerConfig::chunk_origin):
//   sglang-no-buffer     SGLang's default (--mamba-scheduler-strategy auto -> no_buffer):
//                        cache_unfinished_req inserts every non-final chunk end with a copy of
//                        the live state; cache_finished_req inserts the whole sequence with the
//                        request's state (the finish boundary). No state at the prompt end.
//   sglang-extra-buffer  extra_buffer: one state per prefill chunk at its page-aligned end, or
//                        at the branch point instead when the chunk contains it (the KV match
//                        beyond the usable match, floored to 64 tokens); decode tracks a state
//                        every 256 tokens and the finish inserts the last track, so the prompt
//                        end's state survives only when decode crossed no multiple of 256.
// Policies are values: cheap to copy, no per-request state (the budgeted plan is a pure
// function of the prompt's geometry, and for adaptive of the free host bytes the scheduler
// fixes at admission, so keep() answers the same at every chunk; the adaptive policy's
// learned state reaches it through the query).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::sched {

/// What the scheduler knows when it asks whether to keep a snapshot at `boundary`.
struct SnapshotQuery {
  std::size_t boundary = 0;        ///< tokens from the root to this chunk end (page multiple)
  std::size_t prompt_tokens = 0;   ///< L
  std::size_t cached_tokens = 0;   ///< the request's usable match (a snapshot is there)
  std::size_t branch_tokens = 0;   ///< where the prompt left the cached KV path at admission
                                   ///< (Admission::kv_tokens; >= cached_tokens)
  bool last_prompt_chunk = false;  ///< boundary == L floored to a page
  bool at_finish = false;          ///< the finish boundary (prompt + output)
  std::size_t snapshot_bytes = 0;  ///< bytes of one snapshot
  std::size_t kv_bytes_per_token = 0;
  std::uint32_t page_size = 0;
  std::size_t chunk_tokens = 0;
  std::size_t alignment = 0;  ///< adaptive: learned alignment G of branch points (0: a page)
  bool keep_finish = true;    ///< adaptive: finish snapshots are being resumed from
  /// adaptive: prompt ends / tails (aligned and chunk) / budgeted chunk ends are being resumed
  /// from (PlacementLearner::keep(); a branch point is always offered)
  bool keep_prompt_end = true;
  bool keep_tail = true;
  bool keep_chunks = true;
  std::size_t output_tokens = 0;  ///< the request's max_new_tokens (sglang-extra-buffer)
  /// adaptive: host bytes free at the request's admission (CacheBackend::host_bytes_free();
  /// 0: none, or the backend does not say)
  std::uint64_t host_free_bytes = 0;
};

class SnapshotPolicy {
 public:
  enum class Kind {
    kEndOnly,
    kEveryChunk,
    kInterval,
    kBudgeted,
    kAdaptive,
    kSglangNoBuffer,
    kSglangExtraBuffer
  };

  static SnapshotPolicy end_only() { return SnapshotPolicy(Kind::kEndOnly, 0, std::nullopt); }
  static SnapshotPolicy every_chunk() { return SnapshotPolicy(Kind::kEveryChunk, 0, std::nullopt); }
  static SnapshotPolicy interval(std::size_t tokens) {
    return SnapshotPolicy(Kind::kInterval, tokens, std::nullopt);
  }
  static SnapshotPolicy budgeted(std::optional<std::size_t> bytes = std::nullopt) {
    return SnapshotPolicy(Kind::kBudgeted, 0, bytes);
  }
  /// The default: learned placement (see above and placement_learner.hpp).
  static SnapshotPolicy adaptive() { return SnapshotPolicy(Kind::kAdaptive, 0, std::nullopt); }
  /// SGLang's placements (see above).
  static SnapshotPolicy sglang_no_buffer() {
    return SnapshotPolicy(Kind::kSglangNoBuffer, 0, std::nullopt);
  }
  static SnapshotPolicy sglang_extra_buffer() {
    return SnapshotPolicy(Kind::kSglangExtraBuffer, 0, std::nullopt);
  }
  /// SGLang's decode track interval (mamba_track_interval) and state-tracking granularity
  /// (FLA_CHUNK_SIZE): sglang-extra-buffer's constants.
  static constexpr std::size_t kSglangTrackInterval = 256;
  static constexpr std::size_t kSglangTrackGranularity = 64;

  /// This policy plus the `+tail` / `+branch` rule.
  SnapshotPolicy with_tail(bool on = true) const {
    SnapshotPolicy p = *this;
    p.tail_ = on;
    return p;
  }
  SnapshotPolicy with_branch(bool on = true) const {
    SnapshotPolicy p = *this;
    p.branch_ = on;
    return p;
  }

  /// "BASE[+tail][+branch]", BASE one of "adaptive" | "end-only" | "every-chunk" |
  /// "interval:N" | "budgeted" | "budgeted:BYTES" | "sglang-no-buffer" | "sglang-extra-buffer"
  /// (BYTES may end in K, M or G: powers of 1024); the modifiers in any order, each at most once.
  /// kInvalidArgument naming the accepted forms otherwise.
  static Result<SnapshotPolicy> parse(std::string_view text);

  /// Checks the policy against the scheduler's geometry (interval: a positive page multiple).
  Status validate(std::uint32_t page_size) const;

  /// Keep a snapshot at q.boundary? The base kind's answer, or the tail or branch rule.
  bool keep(const SnapshotQuery& q) const;
  /// The `+tail` boundary of q's prompt: the last chunk multiple below the final prompt
  /// boundary (0: none). Independent of whether the modifier is on.
  static std::size_t tail_boundary(const SnapshotQuery& q);
  /// The `+branch` boundary of q's prompt: q.branch_tokens floored to a chunk, when the
  /// prompt follows cached KV beyond its usable match (0: none).
  static std::size_t branch_boundary(const SnapshotQuery& q);

  /// The first boundary > `done` where this policy needs a chunk to end for q's prompt
  /// (interval: the next multiple of N; adaptive: the aligned tail or the branch point;
  /// sglang-extra-buffer: the branch point);
  /// std::nullopt when chunk ends suffice. q.boundary is ignored.
  std::optional<std::size_t> next_cut(const SnapshotQuery& q, std::size_t done) const;
  /// The adaptive aligned tail of q's prompt: floor(L / G) * G when G (q.alignment) is
  /// larger than a page and that is above the usable match and below the final prompt
  /// boundary (0: none).
  static std::size_t aligned_tail(const SnapshotQuery& q);
  /// The adaptive branch point: q.branch_tokens when above the usable match and below the
  /// final prompt boundary (0: none).
  static std::size_t branch_point(const SnapshotQuery& q);
  /// SGLang's branch point (sglang-extra-buffer): q.branch_tokens floored to
  /// max(64, page), when above the usable match and below the final prompt boundary (0: none).
  static std::size_t sglang_branch_point(const SnapshotQuery& q);

  /// Budgeted and adaptive: the intermediate boundaries (chunk multiples strictly between the
  /// cached prefix and the final prompt boundary) chosen for q's prompt, ascending. Empty for the
  /// other kinds. q.boundary is ignored.
  std::vector<std::size_t> plan(const SnapshotQuery& q) const;

  /// Budgeted and adaptive: the byte budget for q's prompt (explicit, or 1/8 of its KV bytes).
  std::size_t budget_for(const SnapshotQuery& q) const;

  Kind kind() const { return kind_; }
  std::size_t interval_tokens() const { return interval_; }
  std::optional<std::size_t> budget_bytes() const { return budget_; }
  bool tail() const { return tail_; }
  bool branch() const { return branch_; }
  /// The text parse() accepts for this policy (modifiers last: "budgeted+tail+branch").
  std::string name() const;

  bool operator==(const SnapshotPolicy&) const = default;

 private:
  SnapshotPolicy(Kind kind, std::size_t interval, std::optional<std::size_t> budget)
      : kind_(kind), interval_(interval), budget_(budget) {}

  bool keep_base(const SnapshotQuery& q) const;
  bool keep_sglang(const SnapshotQuery& q) const;

  Kind kind_;
  std::size_t interval_;
  std::optional<std::size_t> budget_;
  bool tail_ = false;
  bool branch_ = false;
};

}  // namespace radixtier::sched
