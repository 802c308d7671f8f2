// SGLang's hybrid radix cache with its device pools (see sglang_like_cache.hpp and
// docs/sglang-like.md).
#include "sim/sglang_like_cache.hpp"

#include <algorithm>
#include <string>

#include "radixtier/cache/block_hash.hpp"

namespace radixtier::sim {

Result<std::unique_ptr<SglangLikeCache>> SglangLikeCache::create(const Options& o) {
  if (o.page_size == 0 || o.kv_pages == 0 || o.state_slots == 0 || o.page_bytes == 0 ||
      o.state_bytes == 0 || o.live_per_request == 0) {
    return invalid_argument("SglangLikeCache: page size, pools, bytes and live slots must be > 0");
  }
  const std::uint64_t live = std::uint64_t{std::max(o.max_running, 1u)} * o.live_per_request;
  if (o.pools == Pools::kSplit && o.state_slots <= live) {
    return invalid_argument("SglangLikeCache: " + std::to_string(o.state_slots) +
                            " state slots leave none to cache a state beside " +
                            std::to_string(live) + " live ones");
  }
  const std::uint64_t bytes =
      std::uint64_t{o.kv_pages} * o.page_bytes + std::uint64_t{o.state_slots} * o.state_bytes;
  if (o.pools == Pools::kUnified && bytes <= live * o.state_bytes + o.page_bytes) {
    return invalid_argument("SglangLikeCache: the unified buffer holds no more than the " +
                            std::to_string(live) + " live slots");
  }
  return std::unique_ptr<SglangLikeCache>(new SglangLikeCache(o));
}

SglangLikeCache::SglangLikeCache(const Options& o) : o_(o) {
  const std::uint64_t live = std::uint64_t{std::max(o.max_running, 1u)} * o.live_per_request;
  cache_slots_ =
      static_cast<std::uint32_t>(o.state_slots - std::min<std::uint64_t>(live, o.state_slots));
  budget_bytes_ = std::uint64_t{o.kv_pages} * o.page_bytes +
                  std::uint64_t{o.state_slots} * o.state_bytes - live * o.state_bytes;
  nodes_.emplace_back();  // the root: never evicted, never filed
  nodes_[0].live = true;
}

Result<SglangLikeCache::Request*> SglangLikeCache::find(LockId lock, const char* what) {
  auto r = std::as_const(*this).find(lock, what);
  if (!r) return r.status();
  return const_cast<Request*>(*r);
}

Result<const SglangLikeCache::Request*> SglangLikeCache::find(LockId lock, const char* what) const {
  auto it = requests_.find(lock.value());
  if (it == requests_.end()) {
    return Status(ErrorCode::kNotFound,
                  std::string(what) + ": unknown lock " + std::to_string(lock.value()));
  }
  return &it->second;
}

std::optional<std::uint32_t> SglangLikeCache::lookup(std::uint64_t hash) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------------------
// the two LRU orders

void SglangLikeCache::refile(std::uint32_t n) {
  Node& x = nodes_[n];
  if (x.in_leaves) leaves_.erase({x.stamp, n});
  if (x.in_states) states_.erase({x.stamp, n});
  x.in_leaves = n != 0 && x.live && x.children == 0 && x.full_lock == 0;
  x.in_states = n != 0 && x.live && x.state != kNone && x.mamba_lock == 0;
  if (x.in_leaves) leaves_.insert({x.stamp, n});
  if (x.in_states) states_.insert({x.stamp, n});
}

void SglangLikeCache::touch(std::uint32_t n) {
  Node& x = nodes_[n];
  if (x.in_leaves) leaves_.erase({x.stamp, n});
  if (x.in_states) states_.erase({x.stamp, n});
  x.in_leaves = x.in_states = false;
  x.stamp = ++clock_;
  refile(n);
}

bool SglangLikeCache::lock_path(std::uint32_t n) {
  // inc_lock_ref: KV from the node to the root (the root excluded), the node's state.
  const bool state = n != 0 && nodes_[n].state != kNone;
  if (state) ++nodes_[n].mamba_lock;
  for (std::uint32_t x = n; x != 0; x = nodes_[x].parent) {
    ++nodes_[x].full_lock;
    refile(x);
  }
  return state;
}

void SglangLikeCache::unlock_path(std::uint32_t n, bool state) {
  if (state) --nodes_[n].mamba_lock;
  for (std::uint32_t x = n; x != 0; x = nodes_[x].parent) {
    --nodes_[x].full_lock;
    refile(x);
  }
}

void SglangLikeCache::delete_leaf(std::uint32_t n) {
  Node& x = nodes_[n];
  if (x.in_leaves) leaves_.erase({x.stamp, n});
  if (x.in_states) states_.erase({x.stamp, n});
  put_page(x.page);
  ++stats_.kv_pages_dropped_gpu;
  if (x.state != kNone) {
    put_slot(x.state);
    --states_in_tree_;
    ++stats_.snapshots_dropped;
  }
  index_.erase(x.hash);
  const std::uint32_t parent = x.parent;
  x = Node{};
  free_nodes_.push_back(n);
  --nodes_in_tree_;
  --nodes_[parent].children;
  refile(parent);
}

bool SglangLikeCache::evict_full_one() {
  // evict_full: the least recently used unlocked leaf, its KV and its state together, then
  // the tombstoned ancestors it leaves childless (_iteratively_delete_tombstone_leaf).
  if (leaves_.empty()) return false;
  std::uint32_t n = leaves_.begin()->second;
  for (;;) {
    const std::uint32_t parent = nodes_[n].parent;
    delete_leaf(n);
    const Node& p = nodes_[parent];
    if (parent == 0 || p.state != kNone || p.children != 0 || p.full_lock != 0) break;
    n = parent;
  }
  return true;
}

bool SglangLikeCache::evict_mamba_one() {
  // evict_mamba: the least recently used unlocked state; an inner node's alone (the node
  // becomes a tombstone), a leaf's with its KV (_evict_leaf_node, and its tombstoned
  // ancestors). A leaf whose KV is locked is skipped.
  for (const auto& entry : states_) {
    const std::uint32_t n = entry.second;
    Node& x = nodes_[n];
    if (x.children > 0) {
      put_slot(x.state);
      x.state = kNone;
      --states_in_tree_;
      ++stats_.snapshots_dropped;
      refile(n);
      return true;
    }
    if (x.full_lock != 0) continue;
    std::uint32_t m = n;
    for (;;) {
      const std::uint32_t parent = nodes_[m].parent;
      delete_leaf(m);
      const Node& p = nodes_[parent];
      if (parent == 0 || p.state != kNone || p.children != 0 || p.full_lock != 0) break;
      m = parent;
    }
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------
// the pools

std::uint64_t SglangLikeCache::used_bytes() const {
  return std::uint64_t{pages_used_} * o_.page_bytes + std::uint64_t{slots_used_} * o_.state_bytes;
}

std::uint64_t SglangLikeCache::free_pages() const {
  if (o_.pools == Pools::kSplit) return o_.kv_pages - pages_used_;
  return (budget_bytes_ - used_bytes()) / o_.page_bytes;
}

std::uint64_t SglangLikeCache::free_state_slots() const {
  if (o_.pools == Pools::kSplit) return cache_slots_ - slots_used_;
  return (budget_bytes_ - used_bytes()) / o_.state_bytes;
}

bool SglangLikeCache::room_for_pages(std::size_t n) {
  // Split: the KV pool evicts from the KV order (evict_full). Unified: the KV order first,
  // then the state order when no unlocked leaf is left.
  while (free_pages() < n) {
    if (evict_full_one()) continue;
    if (o_.pools == Pools::kSplit || !evict_mamba_one()) return false;
  }
  return true;
}

bool SglangLikeCache::room_for_state() {
  // _alloc_mamba_slot: evict(mamba_num = 1) when the state pool is full. Unified: the state
  // order first, then the KV order.
  while (free_state_slots() < 1) {
    if (evict_mamba_one()) continue;
    if (o_.pools == Pools::kSplit || !evict_full_one()) return false;
  }
  return true;
}

std::uint32_t SglangLikeCache::take_page() {
  ++pages_used_;
  if (!free_page_ids_.empty()) {
    const std::uint32_t p = free_page_ids_.back();
    free_page_ids_.pop_back();
    return p;
  }
  return next_page_id_++;
}

std::uint32_t SglangLikeCache::take_slot() {
  ++slots_used_;
  if (!free_slot_ids_.empty()) {
    const std::uint32_t s = free_slot_ids_.back();
    free_slot_ids_.pop_back();
    return s;
  }
  return next_slot_id_++;
}

void SglangLikeCache::put_page(std::uint32_t p) {
  --pages_used_;
  free_page_ids_.push_back(p);
}

void SglangLikeCache::put_slot(std::uint32_t s) {
  --slots_used_;
  free_slot_ids_.push_back(s);
}

// ---------------------------------------------------------------------------------------
// the backend

Result<Admission> SglangLikeCache::admit(std::span<const Token> prompt) {
  if (prompt.empty()) return invalid_argument("admit: empty prompt");
  // At least one token is computed: the match covers the prompt but its last token.
  const auto hashes = block_hashes(prompt.first(prompt.size() - 1), o_.page_size);
  std::vector<std::uint32_t> path;
  std::size_t best = 0;  // _match_prefix_helper: the deepest node on the path with a state
  for (std::uint64_t h : hashes) {
    auto n = lookup(h);
    if (!n) break;
    path.push_back(*n);
    if (nodes_[*n].state != kNone) best = path.size();
  }
  Request r;
  r.kv = path.size() * o_.page_size;
  path.resize(best);
  // _match_post_processor: reset_node_and_parents_mru on both orders, from the matched node
  // up; the node is the most recent, each parent just older than its child.
  for (std::uint32_t n : path) touch(n);
  r.locked = best > 0 ? path.back() : 0;
  r.resume = r.locked;
  r.state_locked = lock_path(r.locked);
  r.path = std::move(path);
  r.cached = best * o_.page_size;
  const LockId id(next_lock_++);
  Admission a;
  a.lock = id;
  a.cached_tokens = a.gpu_tokens = r.cached;
  a.kv_tokens = r.kv;
  requests_.emplace(id.value(), std::move(r));
  ++stats_.admissions;
  stats_.requested_tokens += prompt.size() - 1;
  stats_.hit_tokens_gpu += a.cached_tokens;
  return a;
}

Result<TransferState> SglangLikeCache::poll(LockId lock) {
  auto r = find(lock, "poll");
  if (!r) return r.status();
  return TransferState::kDone;  // device pools only: nothing is copied
}

Result<std::size_t> SglangLikeCache::wait(LockId lock) {
  auto r = find(lock, "wait");
  if (!r) return r.status();
  return (*r)->cached;
}

Result<std::vector<GpuPageId>> SglangLikeCache::path_pages(LockId lock) const {
  auto r = find(lock, "path_pages");
  if (!r) return r.status();
  std::vector<GpuPageId> out;
  for (std::uint32_t n : (*r)->path) out.emplace_back(nodes_[n].page);
  return out;
}

Result<GpuSlotId> SglangLikeCache::path_snapshot(LockId lock) const {
  auto r = find(lock, "path_snapshot");
  if (!r) return r.status();
  const std::uint32_t n = (*r)->resume;
  if (n == 0 || nodes_[n].state == kNone) {
    return Status(ErrorCode::kNotFound, "path_snapshot: no match");
  }
  return GpuSlotId(nodes_[n].state);
}

Result<std::vector<GpuPageId>> SglangLikeCache::alloc_pages(LockId lock, std::size_t n) {
  auto r = find(lock, "alloc_pages");
  if (!r) return r.status();
  if (!room_for_pages(n)) {
    return out_of_memory("sglang-like: " + std::to_string(n) + " KV pages asked for, " +
                         std::to_string(free_pages()) + " free and nothing unlocked to evict");
  }
  std::vector<GpuPageId> out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t p = take_page();
    (*r)->pages.push_back(p);
    out.emplace_back(p);
  }
  return out;
}

Result<GpuSlotId> SglangLikeCache::alloc_snapshot_slot(LockId lock) {
  auto r = find(lock, "alloc_snapshot_slot");
  if (!r) return r.status();
  if (!room_for_state()) {
    return out_of_memory("sglang-like: no state slot free and no unlocked state to evict");
  }
  const std::uint32_t s = take_slot();
  (*r)->states.push_back(s);
  return GpuSlotId(s);
}

namespace {

bool disown(std::vector<std::uint32_t>& owned, std::uint32_t u) {
  auto it = std::find(owned.begin(), owned.end(), u);
  if (it == owned.end()) return false;
  owned.erase(it);
  return true;
}

bool owns(const std::vector<std::uint32_t>& owned, std::uint32_t u) {
  return std::find(owned.begin(), owned.end(), u) != owned.end();
}

}  // namespace

Status SglangLikeCache::free_pages(LockId lock, std::span<const GpuPageId> pages) {
  auto r = find(lock, "free_pages");
  if (!r) return r.status();
  for (GpuPageId p : pages) {
    if (!owns((*r)->pages, p.value())) {
      return invalid_argument("free_pages: page " + std::to_string(p.value()) +
                              " is not this request's");
    }
  }
  for (GpuPageId p : pages) {
    disown((*r)->pages, p.value());
    put_page(p.value());
  }
  return Status::ok();
}

Status SglangLikeCache::free_snapshot_slot(LockId lock, GpuSlotId slot) {
  auto r = find(lock, "free_snapshot_slot");
  if (!r) return r.status();
  if (!disown((*r)->states, slot.value())) {
    return invalid_argument("free_snapshot_slot: slot " + std::to_string(slot.value()) +
                            " is not this request's");
  }
  put_slot(slot.value());
  return Status::ok();
}

Result<InsertResult> SglangLikeCache::insert(LockId lock, std::span<const Token> tokens,
                                             std::span<const GpuPageId> pages,
                                             std::optional<GpuSlotId> snapshot) {
  auto found = find(lock, "insert");
  if (!found) return found.status();
  Request& r = **found;
  const std::size_t n = tokens.size() / o_.page_size;
  if (tokens.size() % o_.page_size != 0 || pages.size() != n || n < r.path.size()) {
    return invalid_argument("insert: " + std::to_string(tokens.size()) + " tokens and " +
                            std::to_string(pages.size()) + " pages: whole pages from the root, " +
                            "at or beyond the " + std::to_string(r.path.size()) +
                            " pages inserted");
  }
  for (std::size_t i = r.path.size(); i < n; ++i) {
    if (!owns(r.pages, pages[i].value())) {
      return invalid_argument("insert: page " + std::to_string(pages[i].value()) +
                              " is not this request's");
    }
  }
  if (snapshot && !owns(r.states, snapshot->value())) {
    return invalid_argument("insert: snapshot slot " + std::to_string(snapshot->value()) +
                            " is not this request's");
  }
  InsertResult out;
  std::uint64_t parent_hash = r.path.empty() ? 0 : nodes_[r.path.back()].hash;
  for (std::size_t i = r.path.size(); i < n; ++i) {
    const std::uint64_t h = block_hash(parent_hash, tokens.subspan(i * o_.page_size, o_.page_size));
    parent_hash = h;
    if (auto e = lookup(h)) {  // cached already: _insert_helper frees the duplicate KV
      r.path.push_back(*e);
      out.not_taken.push_back(pages[i]);
      continue;
    }
    std::uint32_t m;
    if (!free_nodes_.empty()) {
      m = free_nodes_.back();
      free_nodes_.pop_back();
    } else {
      m = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    const std::uint32_t parent = r.path.empty() ? 0 : r.path.back();
    disown(r.pages, pages[i].value());
    Node& x = nodes_[m];
    x.hash = h;
    x.parent = parent;
    x.page = pages[i].value();
    x.live = true;
    index_.emplace(h, m);
    ++nodes_in_tree_;
    ++nodes_[parent].children;
    refile(parent);
    r.path.push_back(m);
  }
  // _insert_helper: every node of the path is refreshed from the root down (reset_node_mru),
  // the new ones inserted most recent.
  for (std::uint32_t m : r.path) touch(m);
  if (snapshot && n > 0 && nodes_[r.path.back()].state == kNone) {
    const std::uint32_t end = r.path.back();
    disown(r.states, snapshot->value());
    nodes_[end].state = snapshot->value();
    ++states_in_tree_;
    ++stats_.snapshots_inserted;
    stats_.bytes_d2d += o_.state_bytes;  // the running state copied into the cached slot
    touch(end);
    out.snapshot_taken = true;
  }
  // The request's lock moves to the end of what it inserted (cache_unfinished_req:
  // dec_lock_ref of the old node, inc_lock_ref of the new one).
  if (n > 0 &&
      (r.path.back() != r.locked || (!r.state_locked && nodes_[r.locked].state != kNone))) {
    const bool state = lock_path(r.path.back());
    unlock_path(r.locked, r.state_locked);
    r.locked = r.path.back();
    r.state_locked = state;
  }
  return out;
}

Status SglangLikeCache::release(LockId lock) {
  auto it = requests_.find(lock.value());
  if (it == requests_.end()) {
    return Status(ErrorCode::kNotFound, "release: unknown lock " + std::to_string(lock.value()));
  }
  Request& r = it->second;
  unlock_path(r.locked, r.state_locked);
  for (std::uint32_t p : r.pages) put_page(p);
  for (std::uint32_t s : r.states) put_slot(s);
  requests_.erase(it);
  return Status::ok();
}

bool SglangLikeCache::has_kv(std::span<const Token> tokens) const {
  if (tokens.empty() || tokens.size() % o_.page_size != 0) return false;
  const auto h = block_hashes(tokens, o_.page_size);
  return lookup(h.back()).has_value();
}

bool SglangLikeCache::has_state(std::span<const Token> tokens) const {
  if (tokens.empty() || tokens.size() % o_.page_size != 0) return false;
  const auto n = lookup(block_hashes(tokens, o_.page_size).back());
  return n && nodes_[*n].state != kNone;
}

std::string SglangLikeCache::check_invariants() const {
  std::size_t pages = 0, states = 0, live = 0;
  std::vector<std::uint32_t> children(nodes_.size(), 0);
  for (std::uint32_t n = 1; n < nodes_.size(); ++n) {
    const Node& x = nodes_[n];
    if (!x.live) continue;
    ++live;
    ++pages;
    if (x.state != kNone) ++states;
    if (x.parent >= nodes_.size() || !nodes_[x.parent].live) {
      return "node " + std::to_string(n) + " has no live parent";
    }
    ++children[x.parent];
    const bool leaf = x.children == 0 && x.full_lock == 0;
    const bool state = x.state != kNone && x.mamba_lock == 0;
    if (x.in_leaves != leaf || leaf != (leaves_.count({x.stamp, n}) > 0)) {
      return "node " + std::to_string(n) + " is misfiled in the KV order";
    }
    if (x.in_states != state || state != (states_.count({x.stamp, n}) > 0)) {
      return "node " + std::to_string(n) + " is misfiled in the state order";
    }
  }
  for (std::uint32_t n = 0; n < nodes_.size(); ++n) {
    if (nodes_[n].live && nodes_[n].children != children[n]) {
      return "node " + std::to_string(n) + " miscounts its children";
    }
  }
  if (live != nodes_in_tree_ || states != states_in_tree_ || index_.size() != live ||
      leaves_.size() + states_.size() > 2 * live) {
    return "the tree's counts disagree";
  }
  for (const auto& [id, r] : requests_) {
    pages += r.pages.size();
    states += r.states.size();
  }
  if (pages != pages_used_ || states != slots_used_) {
    return "pages or slots held (" + std::to_string(pages) + ", " + std::to_string(states) +
           ") != used (" + std::to_string(pages_used_) + ", " + std::to_string(slots_used_) + ")";
  }
  if (o_.pools == Pools::kSplit ? (pages_used_ > o_.kv_pages || slots_used_ > cache_slots_)
                                : used_bytes() > budget_bytes_) {
    return "a pool is over its size";
  }
  return {};
}

}  // namespace radixtier::sim
