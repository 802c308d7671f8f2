// PlacementLearner: learns, from where admissions actually resume and branch, which prompt
// boundaries earn a snapshot (the state behind SnapshotPolicy::adaptive()).
//
// A snapshot is useful only where a later request resumes exactly (rule 1). Where that is
// depends on how the traffic shares prefixes, which no constant can say for every workload:
//   - natural text (agents, chat): a continuation shares the whole prompt, often the output
//     too, and branches at any page;
//   - block-hashed traces (Mooncake: one hash id per 512-token block, a partial last block
//     gets a new id): a continuation shares only whole blocks, so it resumes at the last
//     full block of the earlier prompt, below the prompt-end snapshot, and never shares the
//     output.
// The learner observes what the scheduler sees anyway and answers two questions:
//
//   alignment()    G, the largest page multiple that divides at least `share` (90 %) of the
//                  recent branch points (Admission::kv_tokens where a prompt leaves the
//                  cached KV path inside its query), from the first one on: under "branch
//                  points are multiples of G" the likeliest G is the largest one the samples
//                  allow (their gcd, up to the `share` of outliers), and guessing G too
//                  large is cheap (the tail lands less than G below the right boundary, a
//                  continuation resumes there) where too small is not (one page: the tail
//                  is the prompt end, a continuation resumes from the snapshot above, often
//                  nothing). So no warm-up: each instance learns alone, and one that waited
//                  for 32 samples left its first ~100 prompts without a tail (their next
//                  turns, minutes later, resumed from nothing). Natural text falls to one
//                  page within a few samples; block-hashed traces reach the block in 2-3.
//                  The policy keeps a snapshot at floor(L / G) * G, the last boundary of a
//                  prompt of L tokens that a continuation would share.
//   keep_finish()  whether finish snapshots (prompt + output) get resumed from: false once
//                  `finish_window` admissions in a row extended no recorded finish boundary
//                  (recorded whether or not a snapshot was kept there, so the answer comes
//                  back as soon as continuations start sharing outputs).
//   keep(kind)     the same question for the prompt's own boundaries (issue 36): its end
//                  (kPromptEnd), its tails (kTail: the aligned tail and the chunk tail) and
//                  the chunk ends below them (kChunk: the budgeted intermediates); its
//                  branch point (kBranch) is recorded too, never dropped: a junction many
//                  requests leave (a shared system prompt) credits it, not the chunks. Every
//                  admitted prompt records its boundaries of each kind (kept or not); an
//                  admission credits the kind of the DEEPEST recorded boundary (finishes
//                  included) on its query: the one it would resume from had every boundary
//                  been kept; an admission with no recorded boundary on its query credits
//                  nothing and counts for nothing. A kind is kept while one of the last
//                  `finish_window` admissions that credited any kind credited it. In conversations
//                  that continue from their outputs every admission credits a finish, so prompt
//                  ends and tails stop costing bytes (they would only serve a regenerated turn);
//                  replays and agents that end inside earlier prompts keep crediting them. A
//                  workload starts with every kind kept, so a short one (the seed scenarios) never
//                  drops any.
//
// Observations are hashes of page-prefixes, O(prompt) per call, and bounded memory (the
// last `window` branch points, the last `finish_memory` finish boundaries). Not thread-safe:
// the scheduler's one thread calls it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier::sched {

/// The prompt boundaries keep() answers for (finishes: keep_finish()).
/// kBranch: where the prompt left the cached KV path (always offered: the next request that
/// leaves there resumes from it); recorded so a resume there is not credited to a chunk end.
enum class BoundaryKind : std::uint8_t { kPromptEnd, kTail, kChunk, kFinish, kBranch };
inline constexpr std::size_t kBoundaryKinds = 5;

struct PlacementLearnerOptions {
  std::size_t window = 256;  ///< branch points remembered
  double share = 0.9;        ///< of the branch points G must divide
  std::size_t max_alignment_pages = 128;
  /// admissions without a finish continuation to skip finishes; without a credit to a prompt
  /// boundary kind, to skip that kind
  std::size_t finish_window = 64;
  std::size_t finish_memory = 4096;      ///< finish boundaries remembered
  std::size_t boundary_memory = 65'536;  ///< prompt boundaries remembered (every kind)
};

class PlacementLearner {
 public:
  explicit PlacementLearner(std::uint32_t page_size, PlacementLearnerOptions options = {});

  /// One admission: its prompt, usable match and where it left the cached KV path.
  void observe_admission(std::span<const Token> prompt, std::size_t cached_tokens,
                         std::size_t kv_tokens);
  /// A request reached its finish boundary: `sequence` is prompt + output up to it.
  void observe_finish(std::span<const Token> sequence);
  /// An admitted prompt's own boundaries: its end (floored to a page), its tails (the aligned
  /// tail at the current alignment and the last chunk end below the end), every other chunk
  /// end, and its branch point (`branch_tokens`, Admission::kv_tokens, floored to a page).
  /// Call after observe_admission() (an admission never credits its own).
  void observe_prompt(std::span<const Token> prompt, std::size_t chunk_tokens,
                      std::size_t branch_tokens);

  /// G in tokens (a page multiple, >= one page).
  std::size_t alignment() const { return alignment_; }
  bool keep_finish() const;
  /// Whether boundaries of `kind` are being resumed from (kFinish: keep_finish(); kBranch:
  /// always).
  bool keep(BoundaryKind kind) const;

  // --- what it has seen (reports, tests) ---------------------------------------------------
  std::size_t branch_samples() const { return branches_.size(); }
  std::uint64_t admissions() const { return admissions_; }
  std::uint64_t finish_continuations() const { return finish_hits_; }
  std::uint64_t admissions_since_finish_continuation() const { return since_finish_hit_; }
  /// Admissions whose deepest recorded boundary was of `kind`.
  std::uint64_t credits(BoundaryKind kind) const {
    return credits_[static_cast<std::size_t>(kind)];
  }

  /// The hash of every page-prefix of `tokens` (entry i: the first (i + 1) pages).
  static std::vector<std::uint64_t> page_prefix_hashes(std::span<const Token> tokens,
                                                       std::uint32_t page_size);

 private:
  void update_alignment();

  std::uint32_t page_size_;
  PlacementLearnerOptions options_;
  std::deque<std::size_t> branches_;  ///< recent branch points, in pages
  std::size_t alignment_;
  std::uint64_t admissions_ = 0;
  std::uint64_t finish_hits_ = 0;
  std::uint64_t since_finish_hit_ = 0;
  std::deque<std::uint64_t> finish_order_;  ///< FIFO of finish_keys_ (bounded memory)
  std::unordered_multiset<std::uint64_t> finish_keys_;
  struct Recorded {
    BoundaryKind kind;
    std::uint32_t count;  ///< entries of boundary_order_ naming it
  };
  std::unordered_map<std::uint64_t, Recorded> boundaries_;  ///< page-prefix hash -> last kind
  std::deque<std::uint64_t> boundary_order_;                ///< FIFO of boundaries_ entries
  std::array<std::uint64_t, kBoundaryKinds> credits_{};
  std::array<std::uint64_t, kBoundaryKinds> since_credit_{};
};

}  // namespace radixtier::sched
