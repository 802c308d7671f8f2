// vLLM's hybrid prefix caching (see vllm_like_cache.hpp and docs/vllm-like.md).
#include "sim/vllm_like_cache.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "radixtier/cache/block_hash.hpp"

namespace radixtier::sim {

namespace {

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

Result<VllmBlockGeometry> vllm_block_geometry(std::uint32_t full_layers,
                                              std::uint64_t kv_bytes_per_token,
                                              std::uint32_t gdn_layers, std::uint64_t state_bytes) {
  if (full_layers == 0 || gdn_layers == 0 || kv_bytes_per_token == 0 || state_bytes == 0) {
    return invalid_argument(
        "vllm-like needs a hybrid model: attention and GDN layers, KV and "
        "state bytes all > 0");
  }
  // _get_kv_cache_groups_uniform_page_size: the group size is the smallest layer count per
  // type, or the largest when that is below 1.5x the smallest.
  const std::uint32_t lo = std::min(full_layers, gdn_layers);
  const std::uint32_t hi = std::max(full_layers, gdn_layers);
  VllmBlockGeometry g;
  g.group_size = hi < lo + lo / 2 ? hi : lo;
  g.kv_ids = static_cast<std::uint32_t>(cdiv(full_layers, g.group_size));
  g.state_ids = static_cast<std::uint32_t>(cdiv(gdn_layers, g.group_size));
  // verify_and_update_config: attention block size = 16 x cdiv(mamba page, 16 x attention
  // page of one token), per layer; the mamba page is padded up to the attention page.
  const std::uint64_t attn_token_layer = cdiv(kv_bytes_per_token, full_layers);
  const std::uint64_t state_layer = cdiv(state_bytes, gdn_layers);
  g.block_size = static_cast<std::uint32_t>(16 * cdiv(state_layer, 16 * attn_token_layer));
  g.id_bytes = std::uint64_t{g.group_size} * g.block_size * attn_token_layer;
  return g;
}

Result<std::unique_ptr<VllmLikeCache>> VllmLikeCache::create(
    std::uint32_t blocks, std::uint32_t page_size, std::uint32_t kv_ids, std::uint32_t state_ids,
    std::uint64_t cpu_ids, std::uint64_t id_bytes) {
  if (page_size == 0 || kv_ids == 0 || state_ids == 0) {
    return invalid_argument("VllmLikeCache: page_size, kv_ids and state_ids must be > 0");
  }
  if (blocks < kv_ids + state_ids) {
    return invalid_argument("VllmLikeCache: " + std::to_string(blocks) +
                            " block ids cannot hold one page and one state");
  }
  return std::unique_ptr<VllmLikeCache>(
      new VllmLikeCache(blocks, page_size, kv_ids, state_ids, cpu_ids, id_bytes));
}

VllmLikeCache::VllmLikeCache(std::uint32_t blocks, std::uint32_t page_size, std::uint32_t kv_ids,
                             std::uint32_t state_ids, std::uint64_t cpu_ids, std::uint64_t id_bytes)
    : page_size_(page_size),
      kv_ids_(kv_ids),
      state_ids_(state_ids),
      blocks_(blocks),
      cpu_capacity_(cpu_ids),
      id_bytes_(id_bytes) {
  for (std::uint32_t i = 0; i < blocks; ++i) {
    blocks_[i].queued = true;
    blocks_[i].at = queue_.insert(queue_.end(), i);
  }
}

void VllmLikeCache::evict(std::uint32_t u) {
  Unit& unit = units_[u];
  const bool state = blocks_[unit.ids.front()].owner == Owner::kState;
  if (unit.hash) {
    auto& index = state ? states_ : kv_;
    index.erase(*unit.hash);
    if (state) {
      ++stats_.snapshots_dropped;
    } else {
      ++stats_.kv_pages_dropped_gpu;
    }
  }
  for (std::uint32_t id : unit.ids) blocks_[id].owner = Owner::kNone;
  unit = Unit{};
  free_units_.push_back(u);
}

Result<std::vector<std::uint32_t>> VllmLikeCache::take(std::size_t n) {
  if (queue_.size() < n) {
    return Status(ErrorCode::kOutOfMemory, "vllm-like: " + std::to_string(n) +
                                               " block ids asked for, " +
                                               std::to_string(queue_.size()) + " free");
  }
  std::vector<std::uint32_t> ids;
  ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t id = queue_.front();
    queue_.pop_front();
    Block& b = blocks_[id];
    b.queued = false;
    if (b.owner != Owner::kNone) evict(b.unit);  // its other ids stay free, unowned
    ids.push_back(id);
  }
  return ids;
}

std::uint32_t VllmLikeCache::new_unit(Owner kind, std::vector<std::uint32_t> ids) {
  std::uint32_t u;
  if (!free_units_.empty()) {
    u = free_units_.back();
    free_units_.pop_back();
  } else {
    u = static_cast<std::uint32_t>(units_.size());
    units_.emplace_back();
  }
  for (std::uint32_t id : ids) {
    blocks_[id].owner = kind;
    blocks_[id].unit = u;
  }
  units_[u].ids = std::move(ids);
  units_[u].ref = 1;
  units_[u].live = true;
  return u;
}

void VllmLikeCache::pin(std::uint32_t u) {
  Unit& unit = units_[u];
  if (unit.ref++ == 0) {
    for (std::uint32_t id : unit.ids) {
      queue_.erase(blocks_[id].at);
      blocks_[id].queued = false;
    }
  }
}

void VllmLikeCache::unpin(std::uint32_t u) {
  Unit& unit = units_[u];
  if (--unit.ref > 0) return;
  if (unit.hash) {
    // block_pool.py free_blocks: cached blocks to the back (kept longest).
    for (std::uint32_t id : unit.ids) {
      blocks_[id].queued = true;
      blocks_[id].at = queue_.insert(queue_.end(), id);
    }
    return;
  }
  // Never cached: fresh blocks to the front (used first).
  for (std::uint32_t id : unit.ids) {
    blocks_[id].owner = Owner::kNone;
    blocks_[id].queued = true;
    blocks_[id].at = queue_.insert(queue_.begin(), id);
  }
  unit = Unit{};
  free_units_.push_back(u);
}

void VllmLikeCache::offload(std::uint64_t hash, bool state) {
  const std::uint64_t ids = state ? state_ids_ : kv_ids_;
  if (cpu_capacity_ < ids) return;
  const std::uint64_t key = cpu_key(hash, state);
  if (auto it = cpu_.find(key); it != cpu_.end()) {  // LRUCachePolicy.touch: most recent
    cpu_lru_.splice(cpu_lru_.end(), cpu_lru_, it->second);
    return;
  }
  while (cpu_used_ + ids > cpu_capacity_) {
    cpu_used_ -= cpu_lru_.front().ids;
    cpu_.erase(cpu_lru_.front().key);
    cpu_lru_.pop_front();
  }
  cpu_lru_.push_back({key, ids});
  cpu_.emplace(key, std::prev(cpu_lru_.end()));
  cpu_used_ += ids;
  stats_.bytes_d2h += ids * id_bytes_;
  ++stats_.copies_d2h;
  if (state) {
    ++stats_.snapshots_demoted;
  } else {
    ++stats_.kv_pages_demoted;
  }
}

std::optional<std::uint32_t> VllmLikeCache::load(std::uint64_t hash, bool state) {
  if (!on_cpu(hash, state)) return std::nullopt;  // evicted from the CPU meanwhile
  auto ids = take(state ? state_ids_ : kv_ids_);
  if (!ids) return std::nullopt;
  const std::uint32_t u = new_unit(state ? Owner::kState : Owner::kPage, std::move(*ids));
  units_[u].hash = hash;
  (state ? states_ : kv_).emplace(hash, u);
  const auto key = cpu_key(hash, state);
  cpu_lru_.splice(cpu_lru_.end(), cpu_lru_, cpu_.at(key));
  stats_.bytes_h2d += units_[u].ids.size() * id_bytes_;
  ++stats_.copies_h2d;
  if (state) {
    ++stats_.snapshots_promoted;
  } else {
    ++stats_.kv_pages_promoted;
  }
  return u;
}

Result<Admission> VllmLikeCache::admit(std::span<const Token> prompt) {
  if (prompt.empty()) return invalid_argument("admit: empty prompt");
  // kv_cache_manager.py get_computed_blocks: at most num_tokens - 1 tokens can hit.
  const auto hashes = block_hashes(prompt.first(prompt.size() - 1), page_size_);
  std::size_t kv = 0;
  while (kv < hashes.size() && (kv_.count(hashes[kv]) || on_cpu(hashes[kv], false))) ++kv;
  // MambaManager.find_longest_cache_hit: the deepest boundary among them with a state (on the
  // GPU, or on the CPU with offloading: the connector extends the GPU hit).
  std::size_t hit = kv;
  while (hit > 0 && !states_.count(hashes[hit - 1]) && !on_cpu(hashes[hit - 1], true)) --hit;
  // Pin what the GPU holds first (a load's allocation must not evict it), then load the rest.
  Request r;
  std::vector<std::optional<std::uint32_t>> path(hit);
  std::size_t gpu_hit = 0;  // the leading part of the hit already on the GPU
  for (std::size_t i = 0; i < hit; ++i) {
    if (auto it = kv_.find(hashes[i]); it != kv_.end()) {
      pin(it->second);
      path[i] = it->second;
      if (gpu_hit == i) ++gpu_hit;
    }
  }
  if (hit > 0) {
    if (auto it = states_.find(hashes[hit - 1]); it != states_.end()) {
      r.path_state = it->second;
      pin(it->second);
    }
  }
  bool loaded_all = true;
  for (std::size_t i = 0; i < hit && loaded_all; ++i) {
    if (!path[i]) {
      path[i] = load(hashes[i], false);
      loaded_all = path[i].has_value();
    }
  }
  if (hit > 0 && loaded_all && !r.path_state) {
    r.path_state = load(hashes[hit - 1], true);
    loaded_all = r.path_state.has_value();
  }
  if (!loaded_all) {
    // No GPU room for the load: resume at the deepest GPU state the leading GPU pages reach.
    for (const auto& u : path) {
      if (u) unpin(*u);
    }
    if (r.path_state) unpin(*r.path_state);
    r.path_state.reset();
    hit = gpu_hit;
    while (hit > 0 && !states_.count(hashes[hit - 1])) --hit;
    for (std::size_t i = 0; i < hit; ++i) {
      const std::uint32_t u = kv_.at(hashes[i]);
      pin(u);
      path[i] = u;
    }
    if (hit > 0) {
      r.path_state = states_.at(hashes[hit - 1]);
      pin(*r.path_state);
    }
  }
  for (std::size_t i = 0; i < hit; ++i) r.path.push_back(*path[i]);
  r.cached = r.inserted = hit * page_size_;
  const LockId lock = add(std::move(r));
  ++stats_.admissions;
  stats_.requested_tokens += prompt.size() - 1;
  const std::size_t on_gpu = std::min(gpu_hit, hit);
  stats_.hit_tokens_gpu += on_gpu * page_size_;
  stats_.hit_tokens_host += (hit - on_gpu) * page_size_;
  Admission a;
  a.lock = lock;
  a.cached_tokens = hit * page_size_;
  a.gpu_tokens = on_gpu * page_size_;
  a.host_tokens = (hit - on_gpu) * page_size_;
  a.kv_tokens = kv * page_size_;
  return a;
}

Result<std::vector<GpuPageId>> VllmLikeCache::path_pages(LockId lock) const {
  auto r = find(lock, "path_pages");
  if (!r) return r.status();
  std::vector<GpuPageId> out;
  for (std::uint32_t u : (*r)->path) out.emplace_back(u);
  return out;
}

Result<GpuSlotId> VllmLikeCache::path_snapshot(LockId lock) const {
  auto r = find(lock, "path_snapshot");
  if (!r) return r.status();
  if (!(*r)->path_state) return Status(ErrorCode::kNotFound, "path_snapshot: no match");
  return GpuSlotId(*(*r)->path_state);
}

Result<std::vector<GpuPageId>> VllmLikeCache::alloc_pages(LockId lock, std::size_t n) {
  auto r = find(lock, "alloc_pages");
  if (!r) return r.status();
  auto ids = take(n * kv_ids_);
  if (!ids) return ids.status();
  std::vector<GpuPageId> out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u =
        new_unit(Owner::kPage,
                 std::vector<std::uint32_t>(ids->begin() + static_cast<long>(i * kv_ids_),
                                            ids->begin() + static_cast<long>((i + 1) * kv_ids_)));
    (*r)->pages.push_back(u);
    out.emplace_back(u);
  }
  return out;
}

Result<GpuSlotId> VllmLikeCache::alloc_snapshot_slot(LockId lock) {
  auto r = find(lock, "alloc_snapshot_slot");
  if (!r) return r.status();
  auto ids = take(state_ids_);
  if (!ids) return ids.status();
  const std::uint32_t u = new_unit(Owner::kState, std::move(*ids));
  (*r)->states.push_back(u);
  return GpuSlotId(u);
}

Result<InsertResult> VllmLikeCache::insert(LockId lock, std::span<const Token> tokens,
                                           std::span<const GpuPageId> pages,
                                           std::optional<GpuSlotId> snapshot) {
  auto found = find(lock, "insert");
  if (!found) return found.status();
  Request& r = **found;
  const std::size_t n = tokens.size() / page_size_;
  if (tokens.size() % page_size_ != 0 || pages.size() != n || tokens.size() < r.inserted) {
    return invalid_argument("insert: " + std::to_string(tokens.size()) + " tokens and " +
                            std::to_string(pages.size()) + " pages: whole pages from the root, " +
                            "at or beyond the inserted " + std::to_string(r.inserted));
  }
  if (Status s = check_owned(r, pages, r.path.size(), snapshot); !s) return s;
  InsertResult out;
  std::uint64_t parent = r.path.empty() ? 0 : *units_[r.path.back()].hash;
  for (std::size_t i = r.path.size(); i < n; ++i) {
    const std::uint64_t h = block_hash(parent, tokens.subspan(i * page_size_, page_size_));
    parent = h;
    if (auto it = kv_.find(h); it != kv_.end()) {
      pin(it->second);  // cached already: the request uses that copy
      r.path.push_back(it->second);
      out.not_taken.push_back(pages[i]);
      continue;
    }
    const std::uint32_t u = pages[i].value();
    disown(r.pages, u);  // its ownership reference becomes the path's pin
    units_[u].hash = h;
    kv_.emplace(h, u);
    r.path.push_back(u);
    offload(h, false);
  }
  r.inserted = tokens.size();
  if (snapshot && n > 0 && !states_.count(parent)) {
    const std::uint32_t s = snapshot->value();
    disown(r.states, s);
    units_[s].hash = parent;
    states_.emplace(parent, s);
    ++stats_.snapshots_inserted;
    offload(parent, true);
    unpin(s);  // the running request moves on to a new state block; this one stays cached
    out.snapshot_taken = true;
  }
  return out;
}

void VllmLikeCache::drop(Request& r) {
  // single_type_kv_cache_manager.py free(): the tail first, so it is evicted first.
  for (auto u = r.path.rbegin(); u != r.path.rend(); ++u) unpin(*u);
  if (r.path_state) unpin(*r.path_state);
  for (std::uint32_t u : r.pages) unpin(u);
  for (std::uint32_t u : r.states) unpin(u);
}

std::string VllmLikeCache::check_invariants() const {
  std::size_t pinned = 0;
  for (std::uint32_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    if (!unit.live) continue;
    const bool state = blocks_[unit.ids.front()].owner == Owner::kState;
    if (unit.ids.size() != (state ? state_ids_ : kv_ids_)) {
      return "unit " + std::to_string(u) + " has " + std::to_string(unit.ids.size()) + " ids";
    }
    for (std::uint32_t id : unit.ids) {
      if (blocks_[id].unit != u || blocks_[id].queued != (unit.ref == 0)) {
        return "block " + std::to_string(id) + " disagrees with unit " + std::to_string(u);
      }
    }
    if (unit.ref == 0 && !unit.hash) return "unit " + std::to_string(u) + " free but not cached";
    if (unit.hash) {
      const auto& index = state ? states_ : kv_;
      auto it = index.find(*unit.hash);
      if (it == index.end() || it->second != u) {
        return "unit " + std::to_string(u) + " is cached but not indexed";
      }
    }
    if (unit.ref > 0) pinned += unit.ids.size();
  }
  std::size_t queued = 0;
  for (std::uint32_t id : queue_) {
    if (!blocks_[id].queued) return "block " + std::to_string(id) + " queued but not marked";
    ++queued;
  }
  if (queued + pinned != blocks_.size()) {
    return "block ids: " + std::to_string(queued) + " free + " + std::to_string(pinned) +
           " held != " + std::to_string(blocks_.size());
  }
  for (const auto& [h, u] : kv_) {
    if (!units_[u].live || units_[u].hash != h) return "a KV index entry names a stale unit";
  }
  for (const auto& [h, u] : states_) {
    if (!units_[u].live || units_[u].hash != h) return "a state index entry names a stale unit";
  }
  return {};
}

}  // namespace radixtier::sim
