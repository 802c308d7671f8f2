#include "sim/trace_replay.hpp"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "radixtier/cache/block_hash.hpp"
#include "sim/cost_executor.hpp"

namespace radixtier::sim {

namespace {

std::size_t full_blocks(const TraceRequest& r, std::uint32_t block_tokens) {
  const std::size_t n = r.hash_ids.size();
  return r.input_length % block_tokens == 0 ? n : (n == 0 ? 0 : n - 1);
}

// Chained 64-bit key of the first ids of a request (a map key only: matches are verified).
std::uint64_t chain(std::uint64_t h, std::uint64_t id) {
  h ^= id + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// prompt(parent) + its generated output + `r`'s own hash-id tokens for the positions left.
std::vector<Token> extend(std::vector<Token> base, const TraceRequest& parent,
                          const TraceRequest& r, std::uint32_t block_tokens) {
  base.reserve(r.input_length);
  base = CostExecutor::continuation(std::move(base), parent.output_length);
  for (std::size_t pos = base.size(); pos < r.input_length; ++pos) {
    base.push_back(trace_token(r.hash_ids[pos / block_tokens],
                               static_cast<std::uint32_t>(pos % block_tokens)));
  }
  return base;
}

}  // namespace

TraceParents find_trace_parents(std::span<const TraceRequest> trace, std::uint32_t block_tokens) {
  TraceParents out;
  out.parent.assign(trace.size(), -1);
  // Distinct next blocks of every block, counted up to kHubSuccessors + 1.
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> next;
  for (const TraceRequest& r : trace) {
    for (std::size_t k = 0; k + 1 < r.hash_ids.size(); ++k) {
      auto& v = next[r.hash_ids[k]];
      if (v.size() <= kHubSuccessors &&
          std::find(v.begin(), v.end(), r.hash_ids[k + 1]) == v.end()) {
        v.push_back(r.hash_ids[k + 1]);
      }
    }
  }
  auto hub = [&](std::uint64_t id) {
    auto it = next.find(id);
    return it != next.end() && it->second.size() > kHubSuccessors;
  };
  for (const auto& [id, v] : next) out.hub_blocks += v.size() > kHubSuccessors ? 1 : 0;

  // Requests by the key of their full blocks (only those that can be a parent).
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> by_full;
  std::vector<std::uint64_t> keys;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& b = trace[i];
    keys.assign(b.hash_ids.size() + 1, 0);
    for (std::size_t k = 0; k < b.hash_ids.size(); ++k) keys[k + 1] = chain(keys[k], b.hash_ids[k]);
    for (std::size_t len = b.hash_ids.size(); len > 0 && out.parent[i] < 0; --len) {
      auto it = by_full.find(keys[len]);
      if (it == by_full.end()) continue;
      for (auto j = it->second.rbegin(); j != it->second.rend(); ++j) {
        const TraceRequest& a = trace[*j];
        if (b.input_length < a.input_length + a.output_length) continue;
        if (!std::equal(a.hash_ids.begin(), a.hash_ids.begin() + static_cast<std::ptrdiff_t>(len),
                        b.hash_ids.begin())) {
          continue;  // a key collision
        }
        out.parent[i] = static_cast<std::int64_t>(*j);
        ++out.with_parent;
        break;
      }
    }
    const std::size_t full = full_blocks(b, block_tokens);
    if (full == 0) continue;
    if (hub(b.hash_ids[full - 1])) {
      ++out.hub_refusals;
      continue;
    }
    by_full[keys[full]].push_back(i);
  }
  return out;
}

std::vector<Token> faithful_prompt(std::span<const TraceRequest> trace, const TraceParents& parents,
                                   std::size_t i, std::uint32_t block_tokens) {
  const std::int64_t p = parents.parent.at(i);
  if (p < 0) return synthesize_tokens(trace[i], block_tokens);
  const auto a = static_cast<std::size_t>(p);
  return extend(faithful_prompt(trace, parents, a, block_tokens), trace[a], trace[i], block_tokens);
}

TracePrompts::TracePrompts(std::span<const TraceRequest> trace, const TraceParents* parents,
                           std::uint32_t block_tokens)
    : trace_(trace),
      parents_(parents != nullptr && !parents->empty() ? parents : nullptr),
      block_tokens_(block_tokens) {
  if (parents_ == nullptr) return;
  children_.assign(trace.size(), 0);
  for (std::int64_t p : parents_->parent) {
    if (p >= 0) ++children_[static_cast<std::size_t>(p)];
  }
  remaining_ = children_;
}

const std::vector<Token>& TracePrompts::kept(std::size_t i) {
  if (auto it = kept_.find(i); it != kept_.end()) return it->second;
  auto built = prompt(i);  // keeps it (i has a child: the caller)
  return kept_.try_emplace(i, std::move(built)).first->second;
}

std::vector<Token> TracePrompts::prompt(std::size_t i) {
  if (parents_ == nullptr) return synthesize_tokens(trace_[i], block_tokens_);
  const std::int64_t p = parents_->parent.at(i);
  std::vector<Token> out;
  if (p < 0) {
    out = synthesize_tokens(trace_[i], block_tokens_);
  } else {
    const auto a = static_cast<std::size_t>(p);
    out = extend(kept(a), trace_[a], trace_[i], block_tokens_);
    if (remaining_[a] > 0) --remaining_[a];
    if (remaining_[a] == 0) kept_.erase(a);
  }
  if (children_[i] > 0) {
    kept_.insert_or_assign(i, out);
    remaining_[i] = children_[i];
  }
  return out;
}

std::vector<std::uint64_t> token_reuse(std::span<const TraceRequest> trace, TracePrompts& prompts,
                                       std::uint32_t granule) {
  std::vector<std::uint64_t> reuse(trace.size(), 0);
  std::unordered_set<std::uint64_t> pages;  // chained hashes of every granule-aligned prefix
  std::unordered_set<std::uint64_t> ends;   // ... and of every sequence's unaligned end
  const std::uint64_t kEndTag = 0xE1D5'0000'0000'0001ull;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    std::vector<Token> seq = prompts.prompt(i);
    const std::size_t limit = seq.empty() ? 0 : seq.size() - 1;
    std::uint64_t h = 0;
    std::size_t len = 0;
    while (len + granule <= limit) {
      const std::uint64_t next = block_hash(h, std::span<const Token>(seq).subspan(len, granule));
      if (!pages.contains(next)) break;
      h = next;
      len += granule;
    }
    for (std::size_t t = std::min<std::size_t>(granule - 1, limit - len); t > 0; --t) {
      if (ends.contains(block_hash(h ^ kEndTag, std::span<const Token>(seq).subspan(len, t)))) {
        len += t;
        break;
      }
    }
    reuse[i] = len;
    // Register what this request leaves with KV: its prompt and all but its last output token.
    const std::uint64_t out = trace[i].output_length;
    if (out > 1) seq = CostExecutor::continuation(std::move(seq), out - 1);
    const auto hashes = block_hashes(seq, granule);
    pages.insert(hashes.begin(), hashes.end());
    const std::size_t at = hashes.size() * granule;
    if (at < seq.size()) {
      const std::uint64_t last = hashes.empty() ? 0 : hashes.back();
      ends.insert(block_hash(last ^ kEndTag, std::span<const Token>(seq).subspan(at)));
    }
  }
  return reuse;
}

}  // namespace radixtier::sim
