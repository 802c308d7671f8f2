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
//
// Observations are hashes of page-prefixes, O(prompt) per call, and bounded memory (the
// last `window` branch points, the last `finish_memory` finish boundaries). Not thread-safe:
// the scheduler's one thread calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_set>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier::sched {

struct PlacementLearnerOptions {
  std::size_t window = 256;  ///< branch points remembered
  double share = 0.9;        ///< of the branch points G must divide
  std::size_t max_alignment_pages = 128;
  std::size_t finish_window = 64;    ///< admissions without a finish continuation to skip
  std::size_t finish_memory = 4096;  ///< finish boundaries remembered
};

class PlacementLearner {
 public:
  explicit PlacementLearner(std::uint32_t page_size, PlacementLearnerOptions options = {});

  /// One admission: its prompt, usable match and where it left the cached KV path.
  void observe_admission(std::span<const Token> prompt, std::size_t cached_tokens,
                         std::size_t kv_tokens);
  /// A request reached its finish boundary: `sequence` is prompt + output up to it.
  void observe_finish(std::span<const Token> sequence);

  /// G in tokens (a page multiple, >= one page).
  std::size_t alignment() const { return alignment_; }
  bool keep_finish() const;

  // --- what it has seen (reports, tests) ---------------------------------------------------
  std::size_t branch_samples() const { return branches_.size(); }
  std::uint64_t admissions() const { return admissions_; }
  std::uint64_t finish_continuations() const { return finish_hits_; }
  std::uint64_t admissions_since_finish_continuation() const { return since_finish_hit_; }

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
};

}  // namespace radixtier::sched
