// The placement learner (see placement_learner.hpp for what it learns and why).
#include "radixtier/scheduler/placement_learner.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

namespace radixtier::sched {

namespace {
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Chunk end < tail < prompt end < branch point (finishes are kept apart).
int rank(BoundaryKind k) {
  switch (k) {
    case BoundaryKind::kChunk:
      return 0;
    case BoundaryKind::kTail:
      return 1;
    case BoundaryKind::kPromptEnd:
      return 2;
    case BoundaryKind::kFinish:
    case BoundaryKind::kBranch:
      return 3;
  }
  return 0;
}
}  // namespace

PlacementLearner::PlacementLearner(std::uint32_t page_size, PlacementLearnerOptions options)
    : page_size_(std::max<std::uint32_t>(1, page_size)),
      options_(options),
      alignment_(page_size_) {}

std::vector<std::uint64_t> PlacementLearner::page_prefix_hashes(std::span<const Token> tokens,
                                                                std::uint32_t page_size) {
  std::vector<std::uint64_t> out;
  if (page_size == 0) return out;
  out.reserve(tokens.size() / page_size);
  std::uint64_t h = 0x243F6A8885A308D3ull;
  for (std::size_t p = 0; p + page_size <= tokens.size(); p += page_size) {
    std::uint64_t page = 0;
    for (std::size_t i = p; i < p + page_size; ++i) {
      page = mix(page ^ static_cast<std::uint32_t>(tokens[i]));
    }
    h = mix(h ^ page);
    out.push_back(h);
  }
  return out;
}

void PlacementLearner::observe_admission(std::span<const Token> prompt, std::size_t cached_tokens,
                                         std::size_t kv_tokens) {
  if (prompt.empty()) return;
  ++admissions_;
  const auto query = prompt.first(prompt.size() - 1);
  const std::size_t query_end = query.size() / page_size_ * page_size_;
  // A branch point: the prompt leaves the cached KV path inside its query (not at its end,
  // which is where a replay that is a prefix of an earlier prompt stops).
  const std::size_t branch = std::max(kv_tokens, cached_tokens);
  if (branch > 0 && branch < query_end && branch % page_size_ == 0) {
    branches_.push_back(branch / page_size_);
    if (branches_.size() > options_.window) branches_.pop_front();
    update_alignment();
  }
  bool extends_finish = false;
  const auto hashes = page_prefix_hashes(query, page_size_);
  if (!finish_keys_.empty()) {
    for (std::uint64_t h : hashes) {
      if (finish_keys_.count(h) != 0) {
        extends_finish = true;
        break;
      }
    }
  }
  // The kind of the deepest recorded boundary on the query gets the credit.
  std::optional<BoundaryKind> deepest;
  for (auto h = hashes.rbegin(); h != hashes.rend() && !deepest; ++h) {
    if (finish_keys_.count(*h) != 0) {
      deepest = BoundaryKind::kFinish;
    } else if (auto it = boundaries_.find(*h); it != boundaries_.end()) {
      deepest = it->second.kind;
    }
  }
  // Only an admission that resumes where some recorded boundary is says which kind served:
  // one that shares nothing this instance recorded (a first prompt, or a turn whose earlier
  // turns ran on another instance and come from a shared tier) is no evidence against any.
  if (deepest) {
    for (std::size_t k = 0; k < kBoundaryKinds; ++k) ++since_credit_[k];
    const auto k = static_cast<std::size_t>(*deepest);
    ++credits_[k];
    since_credit_[k] = 0;
  }
  if (extends_finish) {
    ++finish_hits_;
    since_finish_hit_ = 0;
  } else {
    ++since_finish_hit_;
  }
}

void PlacementLearner::observe_finish(std::span<const Token> sequence) {
  const auto hashes = page_prefix_hashes(sequence, page_size_);
  if (hashes.empty()) return;
  finish_keys_.insert(hashes.back());
  finish_order_.push_back(hashes.back());
  if (finish_order_.size() > options_.finish_memory) {
    finish_keys_.erase(finish_keys_.find(finish_order_.front()));
    finish_order_.pop_front();
  }
}

void PlacementLearner::observe_prompt(std::span<const Token> prompt, std::size_t chunk_tokens,
                                      std::size_t branch_tokens) {
  const auto hashes = page_prefix_hashes(prompt, page_size_);
  if (hashes.empty()) return;
  const std::size_t end = hashes.size();  // pages to the prompt end, floored
  auto record = [&](std::size_t pages, BoundaryKind kind) {
    if (pages == 0 || pages > end) return;
    const std::uint64_t h = hashes[pages - 1];
    auto [it, fresh] = boundaries_.try_emplace(h, Recorded{kind, 0});
    // A boundary keeps the strongest kind any prompt recorded it as: a junction that was a
    // branch point stays one when a later prompt passes it as a mere chunk end.
    if (rank(kind) > rank(it->second.kind)) it->second.kind = kind;
    ++it->second.count;
    boundary_order_.push_back(h);
    if (boundary_order_.size() > options_.boundary_memory) {
      auto old = boundaries_.find(boundary_order_.front());
      if (--old->second.count == 0) boundaries_.erase(old);
      boundary_order_.pop_front();
    }
  };
  const std::size_t chunk_pages = chunk_tokens / page_size_;
  if (chunk_pages > 0) {
    for (std::size_t p = chunk_pages; p < end; p += chunk_pages) record(p, BoundaryKind::kChunk);
    record((end - 1) / chunk_pages * chunk_pages, BoundaryKind::kTail);
  }
  const std::size_t g = alignment_ / page_size_;
  if (g > 1) {
    const std::size_t tail = prompt.size() / alignment_ * g;
    if (tail < end) record(tail, BoundaryKind::kTail);
  }
  record(end, BoundaryKind::kPromptEnd);
  if (branch_tokens / page_size_ < end) record(branch_tokens / page_size_, BoundaryKind::kBranch);
}

bool PlacementLearner::keep_finish() const {
  return since_finish_hit_ < options_.finish_window;
}

bool PlacementLearner::keep(BoundaryKind kind) const {
  if (kind == BoundaryKind::kFinish) return keep_finish();
  if (kind == BoundaryKind::kBranch) return true;
  return since_credit_[static_cast<std::size_t>(kind)] < options_.finish_window;
}

void PlacementLearner::update_alignment() {
  alignment_ = page_size_;
  const std::size_t n = branches_.size();
  if (n == 0) return;
  const auto need = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::ceil(options_.share * static_cast<double>(n) - 1e-9)));
  for (std::size_t k = options_.max_alignment_pages; k > 1; --k) {
    std::size_t divides = 0;
    for (std::size_t b : branches_) divides += b % k == 0;
    if (divides >= need) {
      alignment_ = k * page_size_;
      return;
    }
  }
}

}  // namespace radixtier::sched
