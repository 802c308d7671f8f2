// Simulator-side snapshot placement rules (see placement.hpp).
#include "radixtier/sim/placement.hpp"

namespace radixtier::sim {

std::string Placement::name() const {
  return base.name() + (tail ? "+tail" : "") + (branch ? "+branch" : "");
}

Result<Placement> parse_placement(std::string_view text) {
  Placement p;
  const auto plus = text.find('+');
  auto base = sched::SnapshotPolicy::parse(text.substr(0, plus));
  if (!base) return base.status();
  p.base = *base;
  std::string_view rest = plus == std::string_view::npos ? "" : text.substr(plus + 1);
  while (!rest.empty()) {
    const auto next = rest.find('+');
    const std::string_view word = rest.substr(0, next);
    if (word == "tail") {
      p.tail = true;
    } else if (word == "branch") {
      p.branch = true;
    } else {
      return invalid_argument("placement '" + std::string(text) + "': unknown rule '" +
                              std::string(word) + "' (known: tail, branch)");
    }
    rest = next == std::string_view::npos ? "" : rest.substr(next + 1);
  }
  return p;
}

PlacementCache::PlacementCache(CacheBackend& inner, const PrefixCache* node, Placement placement,
                               std::size_t chunk_tokens, std::size_t snapshot_bytes,
                               std::size_t kv_bytes_per_token)
    : inner_(inner),
      node_(node),
      placement_(placement),
      chunk_tokens_(chunk_tokens),
      snapshot_bytes_(snapshot_bytes),
      kv_bytes_per_token_(kv_bytes_per_token) {}

Result<Admission> PlacementCache::admit(std::span<const Token> prompt) {
  Prompt p;
  p.length = prompt.size();
  if (placement_.branch && node_ != nullptr && !prompt.empty()) {
    const std::size_t ps = inner_.page_size();
    const std::size_t want = (prompt.size() - 1) / ps * ps;
    p.branch = node_->match(prompt.first(want)).kv_tokens;
  }
  auto a = inner_.admit(prompt);
  if (!a) return a;
  p.cached = a->cached_tokens;
  prompts_[a->lock.value()] = p;
  return a;
}

Result<GpuSlotId> PlacementCache::alloc_snapshot_slot() {
  const GpuSlotId id(next_placeholder_++);
  if (next_placeholder_ == GpuSlotId::kInvalid) next_placeholder_ = kPlaceholderBase;
  placeholders_.insert(id.value());
  return id;
}

Status PlacementCache::free_snapshot_slot(GpuSlotId slot) {
  if (placeholders_.erase(slot.value()) == 1) return Status::ok();
  return inner_.free_snapshot_slot(slot);
}

bool PlacementCache::keep(const Prompt& p, std::size_t boundary) const {
  const std::size_t ps = inner_.page_size();
  const std::size_t final_boundary = p.length / ps * ps;
  sched::SnapshotQuery q;
  q.boundary = boundary;
  q.prompt_tokens = p.length;
  q.cached_tokens = p.cached;
  q.last_prompt_chunk = boundary == final_boundary;
  q.at_finish = boundary > final_boundary;
  q.snapshot_bytes = snapshot_bytes_;
  q.kv_bytes_per_token = kv_bytes_per_token_;
  q.page_size = static_cast<std::uint32_t>(ps);
  q.chunk_tokens = chunk_tokens_;
  if (placement_.base.keep(q)) return true;
  if (placement_.tail && final_boundary > 0 &&
      boundary == (final_boundary - 1) / chunk_tokens_ * chunk_tokens_) {
    return true;
  }
  if (placement_.branch && p.branch > p.cached &&
      boundary == p.branch / chunk_tokens_ * chunk_tokens_) {
    return true;
  }
  return false;
}

Result<InsertResult> PlacementCache::insert(LockId lock, std::span<const Token> tokens,
                                            std::span<const GpuPageId> pages,
                                            std::optional<GpuSlotId> snapshot) {
  auto it = prompts_.find(lock.value());
  if (it == prompts_.end() || !snapshot || !placeholders_.contains(snapshot->value())) {
    return inner_.insert(lock, tokens, pages, snapshot);
  }
  std::optional<GpuSlotId> real;
  if (keep(it->second, tokens.size())) {
    if (auto s = inner_.alloc_snapshot_slot(); s) real = *s;
  }
  auto r = inner_.insert(lock, tokens, pages, real);
  if (!r) {
    if (real) (void)inner_.free_snapshot_slot(*real);
    return r;
  }
  if (real && !r->snapshot_taken) (void)inner_.free_snapshot_slot(*real);
  // Taken: the placeholder is consumed. Not taken: the scheduler frees it (a no-op here).
  if (real && r->snapshot_taken) {
    placeholders_.erase(snapshot->value());
  } else {
    r->snapshot_taken = false;
  }
  return r;
}

Status PlacementCache::release(LockId lock) {
  Status s = inner_.release(lock);
  if (s) prompts_.erase(lock.value());
  return s;
}

}  // namespace radixtier::sim
