// Snapshot placement policies (see snapshot_policy.hpp for what each keeps and why).
#include "radixtier/scheduler/snapshot_policy.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <set>

namespace radixtier::sched {

namespace {

constexpr const char* kForms =
    "expected adaptive, end-only, every-chunk, interval:N (tokens), budgeted or budgeted:BYTES "
    "(BYTES may end in K, M or G), sglang-no-buffer or sglang-extra-buffer, optionally followed "
    "by +tail and/or +branch";

std::optional<std::size_t> parse_size(std::string_view s, bool allow_suffix) {
  std::size_t mult = 1;
  if (allow_suffix && !s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        mult = std::size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        mult = std::size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        mult = std::size_t{1} << 30;
        break;
      default:
        break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  std::size_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  if (v > std::numeric_limits<std::size_t>::max() / mult) return std::nullopt;
  return v * mult;
}

}  // namespace

Result<SnapshotPolicy> SnapshotPolicy::parse(std::string_view text) {
  const auto plus = text.find('+');
  if (plus != std::string_view::npos) {
    auto base = parse(text.substr(0, plus));
    if (!base) return base.status();
    std::string_view rest = text.substr(plus + 1);
    for (;;) {
      const auto next = rest.find('+');
      const std::string_view word = rest.substr(0, next);
      if (word == "tail" && !base->tail_) {
        base->tail_ = true;
      } else if (word == "branch" && !base->branch_) {
        base->branch_ = true;
      } else {
        return invalid_argument("snapshot policy '" + std::string(text) + "': modifier '" +
                                std::string(word) +
                                "' is unknown or repeated (known: +tail, +branch)");
      }
      if (next == std::string_view::npos) break;
      rest = rest.substr(next + 1);
    }
    return base;
  }
  if (text == "adaptive") return adaptive();
  if (text == "end-only") return end_only();
  if (text == "every-chunk") return every_chunk();
  if (text == "budgeted") return budgeted();
  if (text == "sglang-no-buffer") return sglang_no_buffer();
  if (text == "sglang-extra-buffer") return sglang_extra_buffer();
  const auto colon = text.find(':');
  if (colon != std::string_view::npos) {
    const auto head = text.substr(0, colon);
    const auto arg = text.substr(colon + 1);
    if (head == "interval") {
      auto n = parse_size(arg, false);
      if (!n || *n == 0) {
        return invalid_argument("snapshot policy '" + std::string(text) +
                                "': interval:N needs a positive token count");
      }
      return interval(*n);
    }
    if (head == "budgeted") {
      auto b = parse_size(arg, true);
      if (!b) {
        return invalid_argument("snapshot policy '" + std::string(text) +
                                "': budgeted:BYTES needs a byte count (K, M, G allowed)");
      }
      return budgeted(*b);
    }
  }
  return invalid_argument("unknown snapshot policy '" + std::string(text) + "': " + kForms);
}

Status SnapshotPolicy::validate(std::uint32_t page_size) const {
  if (kind_ == Kind::kInterval &&
      (interval_ == 0 || page_size == 0 || interval_ % page_size != 0)) {
    return invalid_argument("snapshot policy interval:" + std::to_string(interval_) +
                            ": the interval must be a positive multiple of the page size (" +
                            std::to_string(page_size) + " tokens)");
  }
  return Status::ok();
}

std::string SnapshotPolicy::name() const {
  std::string base = "?";
  switch (kind_) {
    case Kind::kEndOnly:
      base = "end-only";
      break;
    case Kind::kEveryChunk:
      base = "every-chunk";
      break;
    case Kind::kInterval:
      base = "interval:" + std::to_string(interval_);
      break;
    case Kind::kBudgeted:
      base = budget_ ? "budgeted:" + std::to_string(*budget_) : "budgeted";
      break;
    case Kind::kAdaptive:
      base = "adaptive";
      break;
    case Kind::kSglangNoBuffer:
      base = "sglang-no-buffer";
      break;
    case Kind::kSglangExtraBuffer:
      base = "sglang-extra-buffer";
      break;
  }
  if (tail_) base += "+tail";
  if (branch_) base += "+branch";
  return base;
}

std::optional<std::size_t> SnapshotPolicy::next_cut(const SnapshotQuery& q,
                                                    std::size_t done) const {
  if (kind_ == Kind::kInterval && interval_ > 0) return (done / interval_ + 1) * interval_;
  if (kind_ == Kind::kSglangExtraBuffer) {
    const std::size_t b = sglang_branch_point(q);
    return b > done ? std::optional<std::size_t>(b) : std::nullopt;
  }
  if (kind_ != Kind::kAdaptive) return std::nullopt;
  std::optional<std::size_t> cut;
  for (std::size_t b : {aligned_tail(q), branch_point(q)}) {
    if (b > done && (!cut || b < *cut)) cut = b;
  }
  return cut;
}

std::size_t SnapshotPolicy::aligned_tail(const SnapshotQuery& q) {
  if (q.page_size == 0 || q.alignment <= q.page_size) return 0;
  const std::size_t final_boundary = q.prompt_tokens / q.page_size * q.page_size;
  const std::size_t tail = q.prompt_tokens / q.alignment * q.alignment;
  return tail > q.cached_tokens && tail < final_boundary ? tail : 0;
}

std::size_t SnapshotPolicy::branch_point(const SnapshotQuery& q) {
  if (q.page_size == 0 || q.branch_tokens <= q.cached_tokens) return 0;
  const std::size_t final_boundary = q.prompt_tokens / q.page_size * q.page_size;
  const std::size_t b = q.branch_tokens / q.page_size * q.page_size;
  return b > q.cached_tokens && b < final_boundary ? b : 0;
}

std::size_t SnapshotPolicy::budget_for(const SnapshotQuery& q) const {
  if (budget_) return *budget_;
  // Adaptive: 1/8 of the KV bytes this request computes (a turn that extends a cached
  // conversation pays only for its own new tokens); budgeted: 1/8 of the whole prompt's.
  const std::size_t tokens = kind_ == Kind::kAdaptive && q.prompt_tokens > q.cached_tokens
                                 ? q.prompt_tokens - q.cached_tokens
                                 : q.prompt_tokens;
  if (q.kv_bytes_per_token == 0) return kind_ == Kind::kAdaptive ? 0 : 4 * q.snapshot_bytes;
  const std::uint64_t kv = std::uint64_t{tokens} * q.kv_bytes_per_token;
  // Adaptive: also the host bytes that stay free once this KV is there (nothing claims them;
  // eviction takes them back, lowest-value snapshots first, when something does).
  const std::uint64_t spare =
      kind_ == Kind::kAdaptive && q.host_free_bytes > kv ? q.host_free_bytes - kv : 0;
  return static_cast<std::size_t>(std::max(kv / 8, spare));
}

std::vector<std::size_t> SnapshotPolicy::plan(const SnapshotQuery& q) const {
  if ((kind_ != Kind::kBudgeted && kind_ != Kind::kAdaptive) || q.page_size == 0 ||
      q.chunk_tokens == 0 || q.snapshot_bytes == 0 || q.prompt_tokens == 0) {
    return {};
  }
  const std::size_t end = q.prompt_tokens / q.page_size * q.page_size;
  const std::size_t max_count = budget_for(q) / q.snapshot_bytes;
  std::vector<std::size_t> candidates;
  for (std::size_t c = (q.cached_tokens / q.chunk_tokens + 1) * q.chunk_tokens; c < end;
       c += q.chunk_tokens) {
    candidates.push_back(c);
  }
  // Greedy by expected saved recompute per byte. The snapshot size is the same for every
  // candidate, so the order is by (c - p) * (n - c); ties go to the shallower boundary.
  std::set<std::size_t> kept = {q.cached_tokens, end};
  std::vector<std::size_t> chosen;
  while (chosen.size() < max_count) {
    std::size_t best = 0, best_gain = 0;
    for (std::size_t c : candidates) {
      auto next = kept.lower_bound(c);
      if (*next == c) continue;
      const std::size_t p = *std::prev(next);
      const std::size_t gain = (c - p) * (*next - c);
      if (gain > best_gain) {
        best_gain = gain;
        best = c;
      }
    }
    if (best_gain == 0) break;
    kept.insert(best);
    chosen.push_back(best);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::size_t SnapshotPolicy::tail_boundary(const SnapshotQuery& q) {
  if (q.page_size == 0 || q.chunk_tokens == 0) return 0;
  const std::size_t final_boundary = q.prompt_tokens / q.page_size * q.page_size;
  if (final_boundary == 0) return 0;
  return (final_boundary - 1) / q.chunk_tokens * q.chunk_tokens;
}

std::size_t SnapshotPolicy::branch_boundary(const SnapshotQuery& q) {
  if (q.chunk_tokens == 0 || q.branch_tokens <= q.cached_tokens) return 0;
  return q.branch_tokens / q.chunk_tokens * q.chunk_tokens;
}

bool SnapshotPolicy::keep(const SnapshotQuery& q) const {
  if (kind_ == Kind::kSglangNoBuffer || kind_ == Kind::kSglangExtraBuffer) return keep_sglang(q);
  if (q.last_prompt_chunk) return kind_ != Kind::kAdaptive || q.keep_prompt_end;
  if (q.at_finish) return kind_ != Kind::kAdaptive || q.keep_finish;
  if (keep_base(q)) return true;
  if (tail_ && q.boundary > 0 && q.boundary == tail_boundary(q)) return true;
  if (branch_ && q.boundary > 0 && q.boundary == branch_boundary(q)) return true;
  return false;
}

std::size_t SnapshotPolicy::sglang_branch_point(const SnapshotQuery& q) {
  // mamba_radix_cache.py, _match_prefix_helper: mamba_branching_seqlen = the KV match floored
  // to the tracking granularity, when the KV match goes beyond the usable (state) match.
  const std::size_t g = std::max<std::size_t>(kSglangTrackGranularity, q.page_size);
  if (q.branch_tokens <= q.cached_tokens) return 0;
  const std::size_t b = q.branch_tokens / g * g;
  const std::size_t final_boundary =
      q.page_size == 0 ? 0 : q.prompt_tokens / q.page_size * q.page_size;
  return b > q.cached_tokens && b < final_boundary ? b : 0;
}

bool SnapshotPolicy::keep_sglang(const SnapshotQuery& q) const {
  if (q.at_finish) return true;  // cache_finished_req: the whole sequence / the last track
  if (kind_ == Kind::kSglangNoBuffer) return !q.last_prompt_chunk;  // cache_unfinished_req
  // extra_buffer (schedule_batch.py, _mamba_radix_cache_v2_req_prepare_for_extend): one track
  // per extend of >= 64 tokens, at its aligned end or at the branch point inside it.
  if (q.last_prompt_chunk) {
    // Inserted only by cache_finished_req, and only if no decode track replaced it.
    const std::size_t i = kSglangTrackInterval;
    const std::size_t last = q.prompt_tokens + (q.output_tokens > 0 ? q.output_tokens - 1 : 0);
    if (last / i > q.prompt_tokens / i) return false;
  }
  const std::size_t branch = sglang_branch_point(q);
  if (branch != 0 && q.boundary == branch) return true;
  // A chunk end (counted from the resume point) whose chunk held the branch point tracked it
  // instead.
  if (branch != 0 && q.chunk_tokens > 0 && q.boundary > branch) {
    const std::size_t chunk_start =
        q.cached_tokens + (q.boundary - q.cached_tokens - 1) / q.chunk_tokens * q.chunk_tokens;
    if (branch > chunk_start) return false;
  }
  return true;
}

bool SnapshotPolicy::keep_base(const SnapshotQuery& q) const {
  switch (kind_) {
    case Kind::kSglangNoBuffer:
    case Kind::kSglangExtraBuffer:
      return keep_sglang(q);
    case Kind::kEndOnly:
      return false;
    case Kind::kEveryChunk:
      return true;
    case Kind::kInterval:
      return interval_ > 0 && q.boundary % interval_ == 0;
    case Kind::kBudgeted: {
      const auto chosen = plan(q);
      return std::binary_search(chosen.begin(), chosen.end(), q.boundary);
    }
    case Kind::kAdaptive: {
      // The chunk tail too (issue 21): with cached snapshots in the one GPU pool, eviction
      // weighs each against the KV it displaces, so a boundary that may be resumed is offered
      // and kept only while it is worth its bytes.
      if (q.boundary == 0) return false;
      if (q.boundary == branch_point(q)) return true;
      if (q.boundary == aligned_tail(q) || q.boundary == tail_boundary(q)) return q.keep_tail;
      if (!q.keep_chunks) return false;
      const auto chosen = plan(q);
      return std::binary_search(chosen.begin(), chosen.end(), q.boundary);
    }
  }
  return false;
}

}  // namespace radixtier::sched
