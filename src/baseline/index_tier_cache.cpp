#include "baseline/index_tier_cache.hpp"

#include <algorithm>
#include <cassert>
#include <map>
#include <sstream>
#include <unordered_set>

namespace radixtier::index_tier {

namespace {

std::string id_text(auto id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

}  // namespace

Result<std::unique_ptr<IndexTierCache>> IndexTierCache::create(const CacheConfig& config,
                                                               TransferEngine& engine) {
  if (Status s = config.validate(); !s) return s;
  return std::unique_ptr<IndexTierCache>(new IndexTierCache(config, engine));
}

IndexTierCache::IndexTierCache(const CacheConfig& config, TransferEngine& engine)
    : config_(config),
      engine_(engine),
      host_tier_(config.host_pages > 0 || config.host_snapshot_slots > 0),
      gpu_pages_(config.gpu_pages),
      gpu_slots_(config.gpu_snapshot_slots),
      page_owner_(config.gpu_pages),
      slot_owner_(config.gpu_snapshot_slots),
      host_(config.page_size, config.host_pages, config.host_snapshot_slots, config.page_bytes,
            config.snapshot_bytes),
      tree_(config.page_size, gpu_pages_, gpu_slots_,
            host_tier_ ? static_cast<TreeHooks*>(this) : nullptr) {}

IndexTierCache::~IndexTierCache() = default;

// --- copies ----------------------------------------------------------------------------------

bool IndexTierCache::copy_pages(Direction dir, std::span<const GpuPageId> gpu,
                                std::span<const HostPageId> host) {
  assert(gpu.size() == host.size());
  assert(dir != Direction::kDeviceToDevice);  // GPU <-> host only
  const bool d2h = dir == Direction::kDeviceToHost;
  for (std::size_t first = 0; first < gpu.size(); first += config_.slice_pages) {
    const std::size_t last = std::min<std::size_t>(gpu.size(), first + config_.slice_pages);
    TransferBatch batch;
    batch.direction = dir;
    for (std::size_t i = first; i < last; ++i) batch.pages.push_back({gpu[i], host[i]});
    ++(d2h ? stats_.copies_d2h : stats_.copies_h2d);
    auto ticket = engine_.submit(std::move(batch));
    if (!ticket || ticket->wait() != TransferState::kDone) {
      ++stats_.transfers_failed;
      return false;
    }
    (d2h ? stats_.bytes_d2h : stats_.bytes_h2d) += (last - first) * config_.page_bytes;
  }
  return true;
}

bool IndexTierCache::copy_snapshot(Direction dir, GpuSlotId gpu, HostSlotId host) {
  assert(dir != Direction::kDeviceToDevice);  // GPU <-> host only
  const bool d2h = dir == Direction::kDeviceToHost;
  TransferBatch batch;
  batch.direction = dir;
  batch.snapshots.push_back({gpu, host});
  ++(d2h ? stats_.copies_d2h : stats_.copies_h2d);
  auto ticket = engine_.submit(std::move(batch));
  if (!ticket || ticket->wait() != TransferState::kDone) {
    ++stats_.transfers_failed;
    return false;
  }
  (d2h ? stats_.bytes_d2h : stats_.bytes_h2d) += config_.snapshot_bytes;
  return true;
}

// --- hooks -----------------------------------------------------------------------------------

GpuSlotId IndexTierCache::on_match_dead_snapshot(const TreeNode& node) {
  const std::vector<Token> prefix = tree_.prefix_tokens(&node);
  const HostEntry* e = host_.lookup_exact(prefix);  // never a shorter entry for this node
  if (e == nullptr || !e->snapshot.valid()) return {};
  std::optional<GpuSlotId> slot = take_gpu_slot(Holder::kNode);  // may evict -> host writes
  if (!slot) return {};
  // Making room may have dropped the entry and recycled its host slot: look the key up again.
  e = host_.lookup_exact(prefix);
  if (e == nullptr || !e->snapshot.valid() ||
      !copy_snapshot(Direction::kHostToDevice, *slot, e->snapshot)) {
    gpu_slots_.give_back(*slot);
    return {};
  }
  ++stats_.snapshots_promoted;
  ++extra_.snapshots_revived;
  return *slot;
}

void IndexTierCache::on_evict_kv(const TreeNode& node) {
  const std::vector<GpuPageId> gpu = tree_.prefix_pages(&node);  // the whole root-to-node KV
  std::optional<std::vector<HostPageId>> host = host_.alloc_kv(gpu.size());
  if (!host) {
    ++extra_.kv_writes_too_large;
    return;
  }
  if (!copy_pages(Direction::kDeviceToHost, gpu, *host)) {
    host_.free_kv(*host);
    return;
  }
  host_.put(tree_.prefix_tokens(&node), std::move(host), HostSlotId());
  stats_.kv_pages_demoted += gpu.size();
  kv_pages_kept_on_host_ += node.pages.size();
}

void IndexTierCache::on_evict_node(const TreeNode& node) {
  HostSlotId slot = host_.alloc_snapshot_slot();
  if (!slot.valid()) {
    host_.drop_oldest();  // the caller's policy: drop the oldest entry, retry once
    slot = host_.alloc_snapshot_slot();
  }
  if (!slot.valid()) {
    ++extra_.snapshot_writes_dropped;
    return;
  }
  if (!copy_snapshot(Direction::kDeviceToHost, node.snapshot, slot)) {
    host_.free_snapshot_slot(slot);
    return;
  }
  host_.put(tree_.prefix_tokens(&node), std::nullopt, slot);
  ++stats_.snapshots_demoted;
  ++snapshots_kept_on_host_;
}

// --- admission -------------------------------------------------------------------------------

std::optional<GpuSlotId> IndexTierCache::take_gpu_slot(Holder to) {
  if (gpu_slots_.free_count() == 0) tree_.evict_snapshots(1);
  return gpu_slots_.take(to);
}

std::optional<std::size_t> IndexTierCache::promote(std::span<const Token> prefix) {
  const std::size_t n = prefix.size() / config_.page_size;
  if (gpu_pages_.free_count() < n) tree_.evict_kv(n - gpu_pages_.free_count());
  if (gpu_pages_.free_count() < n) return std::nullopt;
  std::vector<GpuPageId> pages;
  pages.reserve(n);
  for (std::size_t i = 0; i < n; ++i) pages.push_back(*gpu_pages_.take(Holder::kRequest));
  auto give_back_all = [&](std::optional<GpuSlotId> slot) {
    for (GpuPageId p : pages) gpu_pages_.give_back(p);
    if (slot) gpu_slots_.give_back(*slot);
  };
  std::optional<GpuSlotId> slot = take_gpu_slot(Holder::kRequest);
  if (!slot) {
    give_back_all(std::nullopt);
    return std::nullopt;
  }
  // Evictions above wrote to the host index and may have dropped this entry and recycled its
  // host pages or slot for a victim: look the key up again and use only what it names now.
  const HostEntry* e = host_.lookup_exact(prefix);
  if (e == nullptr || !e->complete()) {
    ++extra_.promotions_abandoned;
    give_back_all(slot);
    return std::nullopt;
  }
  if (!copy_snapshot(Direction::kHostToDevice, *slot, e->snapshot) ||
      !copy_pages(Direction::kHostToDevice, pages, *e->kv)) {
    give_back_all(slot);
    return std::nullopt;
  }
  ++stats_.snapshots_promoted;
  stats_.kv_pages_promoted += n;
  ++extra_.promotions;
  const TreeInsert r = tree_.insert(prefix, pages, *slot);
  for (std::size_t i = 0; i < r.existing_pages; ++i) gpu_pages_.give_back(pages[i]);
  if (!r.snapshot_taken) gpu_slots_.give_back(*slot);
  return r.existing_pages;
}

Result<Admission> IndexTierCache::admit(std::span<const Token> prompt) {
  if (prompt.empty()) return invalid_argument("admit: empty prompt");
  const std::size_t want = (prompt.size() - 1) / config_.page_size * config_.page_size;
  const std::span<const Token> tokens = prompt.first(want);
  ++stats_.admissions;
  stats_.requested_tokens += prompt.size() - 1;

  TreeMatch m = tree_.match(tokens);
  std::size_t gpu_tokens = m.cached_tokens;
  std::size_t host_tokens = 0;
  if (host_tier_ && want > 0) {
    const HostEntry* e = host_.lookup(tokens);
    if (e != nullptr && e->complete() && e->tokens.size() > m.cached_tokens) {
      const std::vector<Token> key = e->tokens;
      const std::optional<std::size_t> existing = promote(key);
      m = tree_.match(tokens);  // the tree changed while making room either way
      gpu_tokens = m.cached_tokens;
      if (existing) {
        gpu_tokens = std::min(m.cached_tokens, *existing * config_.page_size);
        host_tokens = m.cached_tokens - gpu_tokens;
      }
    }
  }
  const LockId id(next_lock_++);
  tree_.lock(m.node);
  locks_.emplace(id.value(), LockRecord{m.node});
  stats_.hit_tokens_gpu += gpu_tokens;
  stats_.hit_tokens_host += host_tokens;

  Admission a;
  a.lock = id;
  a.cached_tokens = m.cached_tokens;
  a.gpu_tokens = gpu_tokens;
  a.host_tokens = host_tokens;
  a.snapshot_from_host = m.revived || host_tokens > 0;
  a.promoting = false;  // copies are synchronous
  a.kv_tokens = std::max(m.kv_tokens, m.cached_tokens);
  return a;
}

Result<const IndexTierCache::LockRecord*> IndexTierCache::find_lock(LockId id) const {
  auto it = locks_.find(id.value());
  if (!id.valid() || it == locks_.end()) return not_found("unknown lock " + id_text(id));
  return &it->second;
}

Result<TransferState> IndexTierCache::poll(LockId lock) {
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  return TransferState::kDone;
}

Result<std::size_t> IndexTierCache::wait(LockId lock) {
  // Copies are synchronous: the request resumes where the locked node ends.
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  return (*rec)->node->boundary;
}

Result<std::vector<GpuPageId>> IndexTierCache::path_pages(LockId lock) const {
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  return tree_.prefix_pages((*rec)->node);
}

Result<GpuSlotId> IndexTierCache::path_snapshot(LockId lock) const {
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  const TreeNode* n = (*rec)->node;
  if (n == tree_.root() || !n->snapshot.valid())
    return not_found("no snapshot at the boundary of " + id_text(lock));
  return n->snapshot;
}

// --- request-owned ids -----------------------------------------------------------------------

Result<std::vector<GpuPageId>> IndexTierCache::alloc_pages(LockId lock, std::size_t n) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  if (gpu_pages_.free_count() < n) tree_.evict_kv(n - gpu_pages_.free_count());
  if (gpu_pages_.free_count() < n)
    return out_of_memory("alloc_pages: " + std::to_string(n) + " pages wanted, " +
                         std::to_string(gpu_pages_.free_count()) + " free after eviction");
  std::vector<GpuPageId> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(*gpu_pages_.take(Holder::kRequest));
    page_owner_.add(lock, out.back());
  }
  return out;
}

Result<GpuSlotId> IndexTierCache::alloc_snapshot_slot(LockId lock) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  std::optional<GpuSlotId> slot = take_gpu_slot(Holder::kRequest);
  if (!slot) return out_of_memory("alloc_snapshot_slot: every GPU snapshot slot is locked");
  slot_owner_.add(lock, *slot);
  return *slot;
}

Status IndexTierCache::free_pages(LockId lock, std::span<const GpuPageId> pages) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  std::unordered_set<GpuPageId> seen;
  for (GpuPageId p : pages) {
    if (!gpu_pages_.in_range(p))
      return invalid_argument("free_pages: " + id_text(p) + " out of range");
    if (!seen.insert(p).second) return invalid_argument("free_pages: " + id_text(p) + " twice");
    if (Status s = page_owner_.check_owner(lock, p, "free_pages"); !s) return s;
  }
  for (GpuPageId p : pages) {
    page_owner_.remove(p);
    gpu_pages_.give_back(p);
  }
  return Status::ok();
}

Status IndexTierCache::free_snapshot_slot(LockId lock, GpuSlotId slot) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  if (!gpu_slots_.in_range(slot))
    return invalid_argument("free_snapshot_slot: " + id_text(slot) + " out of range");
  if (Status s = slot_owner_.check_owner(lock, slot, "free_snapshot_slot"); !s) return s;
  slot_owner_.remove(slot);
  gpu_slots_.give_back(slot);
  return Status::ok();
}

Result<InsertResult> IndexTierCache::insert(LockId lock, std::span<const Token> tokens,
                                            std::span<const GpuPageId> pages,
                                            std::optional<GpuSlotId> snapshot) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  TreeNode* const locked = (*found)->node;
  const std::size_t ps = config_.page_size;
  if (tokens.size() % ps != 0)
    return invalid_argument("insert: " + std::to_string(tokens.size()) +
                            " tokens is not a multiple of the page size");
  if (pages.size() * ps != tokens.size())
    return invalid_argument("insert: " + std::to_string(pages.size()) + " pages for " +
                            std::to_string(tokens.size()) + " tokens");
  if (snapshot && !gpu_slots_.in_range(*snapshot))
    return invalid_argument("insert: snapshot " + id_text(*snapshot) + " is out of range");
  if (snapshot) {
    if (Status s = slot_owner_.check_owner(lock, *snapshot, "insert"); !s) return s;
  }
  const std::vector<Token> locked_tokens = tree_.prefix_tokens(locked);
  if (tokens.size() < locked_tokens.size() ||
      !std::equal(locked_tokens.begin(), locked_tokens.end(), tokens.begin()))
    return invalid_argument("insert: tokens do not extend the prefix locked by " + id_text(lock));
  const std::vector<GpuPageId> tree_pages = tree_.pages_along(tokens);
  std::unordered_set<GpuPageId> seen;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const GpuPageId p = pages[i];
    if (!gpu_pages_.in_range(p)) return invalid_argument("insert: " + id_text(p) + " out of range");
    if (!seen.insert(p).second) return invalid_argument("insert: " + id_text(p) + " twice");
    if (i < tree_pages.size() && tree_pages[i] == p) continue;  // the tree's own page
    if (page_owner_.owner(p) != lock)
      return invalid_argument("insert: " + id_text(p) + " at page " + std::to_string(i) +
                              " is neither the tree's page there nor the caller's");
  }

  const TreeInsert r = tree_.insert(tokens, pages, snapshot.value_or(GpuSlotId()));
  assert(r.existing_pages == tree_pages.size());
  InsertResult out;
  for (std::size_t i = 0; i < r.existing_pages; ++i) {
    if (gpu_pages_.holder(pages[i]) == Holder::kRequest) out.not_taken.push_back(pages[i]);
  }
  for (std::size_t i = r.existing_pages; i < pages.size(); ++i) page_owner_.remove(pages[i]);
  if (r.snapshot_taken) slot_owner_.remove(*snapshot);
  out.snapshot_taken = r.snapshot_taken;
  if (r.snapshot_taken) ++stats_.snapshots_inserted;
  tree_.lock(r.end);
  tree_.unlock(locked);
  locks_.at(lock.value()).node = r.end;
  return out;
}

Status IndexTierCache::release(LockId lock) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  tree_.unlock((*found)->node);
  locks_.erase(lock.value());
  for (GpuPageId p : page_owner_.take_all(lock)) gpu_pages_.give_back(p);
  for (GpuSlotId s : slot_owner_.take_all(lock)) gpu_slots_.give_back(s);
  return Status::ok();
}

// --- observation -----------------------------------------------------------------------------

CacheStats IndexTierCache::stats() const {
  CacheStats s = stats_;
  const HostIndexStats& h = host_.stats();
  s.kv_pages_dropped_gpu = tree_.kv_pages_evicted() - kv_pages_kept_on_host_;
  s.kv_pages_dropped_host = h.pages_freed;
  s.snapshots_dropped = tree_.snapshots_evicted() - snapshots_kept_on_host_ + h.slots_dropped;
  s.host_bytes_peak = h.bytes_peak;
  return s;
}

IndexTierStats IndexTierCache::index_stats() const {
  IndexTierStats s = extra_;
  s.tree_walk_nodes = tree_.walk_nodes();
  s.lookup_hashed_tokens = host_.stats().hashed_tokens;
  s.host_lookups = host_.stats().lookups;
  s.host_entries = host_.entries();
  s.host_entries_dropped = host_.stats().entries_dropped;
  s.host_bytes_in_use = host_.bytes_in_use();
  s.tree_nodes = tree_.node_count();
  return s;
}

std::string IndexTierCache::check_invariants() const {
  if (std::string e = gpu_pages_.check("gpu pages"); !e.empty()) return e;
  if (std::string e = gpu_slots_.check("gpu snapshot slots"); !e.empty()) return e;
  if (std::string e = host_.check(); !e.empty()) return e;
  std::size_t pages_held = 0, slots_held = 0;
  if (std::string e = tree_.check(pages_held, slots_held); !e.empty()) return e;
  if (pages_held != gpu_pages_.count(Holder::kNode))
    return "gpu pages: held by nodes per pool != pages found in the tree";
  if (slots_held != gpu_slots_.count(Holder::kNode))
    return "gpu snapshot slots: held by nodes per pool != slots found in the tree";
  if (gpu_pages_.count(Holder::kTransfer) + gpu_slots_.count(Holder::kTransfer) != 0)
    return "an id is held by a transfer between calls";
  if (std::string e = page_owner_.check("gpu pages"); !e.empty()) return e;
  if (std::string e = slot_owner_.check("gpu snapshot slots"); !e.empty()) return e;
  if (page_owner_.owned_count() != gpu_pages_.count(Holder::kRequest) ||
      slot_owner_.owned_count() != gpu_slots_.count(Holder::kRequest))
    return "request-held ids and request owners differ";
  if (!host_tier_ && host_.entries() != 0) return "gpu-only cache has host entries";

  // Rule 3: lock counts equal what the lock records imply.
  std::map<const TreeNode*, std::pair<std::uint32_t, std::uint32_t>> want;  // full, snapshot
  for (const auto& [id, rec] : locks_) {
    if (rec.node == tree_.root()) continue;
    ++want[rec.node].second;
    for (const TreeNode* n = rec.node; n != tree_.root(); n = n->parent) ++want[n].first;
  }
  std::size_t seen_locked = 0;
  std::vector<const TreeNode*> stack{tree_.root()};
  while (!stack.empty()) {
    const TreeNode* n = stack.back();
    stack.pop_back();
    for (const auto& [k, c] : n->children) stack.push_back(c.get());
    if (n == tree_.root()) continue;
    auto it = want.find(n);
    const auto expect =
        it == want.end() ? std::pair<std::uint32_t, std::uint32_t>{0, 0} : it->second;
    if (it != want.end()) ++seen_locked;
    if (n->full_lock != expect.first || n->snapshot_lock != expect.second)
      return "locks: node at boundary " + std::to_string(n->boundary) +
             " has lock counts that differ from the lock records";
  }
  if (seen_locked != want.size()) return "locks: a lock record names a node not in the tree";
  return {};
}

}  // namespace radixtier::index_tier
