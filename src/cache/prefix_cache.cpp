#include "radixtier/cache/prefix_cache.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <iterator>
#include <new>
#include <sstream>
#include <unordered_set>

#include "vector_clones.hpp"

namespace radixtier {

// ---------------------------------------------------------------------------------------
// construction

namespace {
/// The config must fit in the engine's pools, or a copy would be refused (or, with an
/// engine that does not check, run out of bounds) long after creation.
Status check_against_engine(const CacheConfig& c, const EngineCapacity& e) {
  auto too_big = [](const char* field, std::uint64_t mine, const char* what,
                    std::uint64_t engines) {
    return invalid_argument("CacheConfig." + std::string(field) + " is " + std::to_string(mine) +
                            " but the transfer engine's " + what + " has only " +
                            std::to_string(engines));
  };
  if (c.gpu_pages > e.gpu_pages)
    return too_big("gpu_pages", c.gpu_pages, "GPU KV pool", e.gpu_pages);
  if (c.host_pool_pages() > e.host_pages) {
    return invalid_argument("CacheConfig.host_pages (" + std::to_string(c.host_pages) +
                            ") + host_snapshot_slots (" + std::to_string(c.host_snapshot_slots) +
                            ") x " + std::to_string(c.snapshot_pages()) +
                            " pages = " + std::to_string(c.host_pool_pages()) +
                            " pages of host pool, but the transfer engine's host pool has only " +
                            std::to_string(e.host_pages));
  }
  if (c.gpu_snapshot_slots > e.gpu_snapshot_slots)
    return too_big("gpu_snapshot_slots", c.gpu_snapshot_slots, "GPU snapshot pool",
                   e.gpu_snapshot_slots);
  auto differs = [](const char* field, std::size_t mine, std::size_t engines) {
    return invalid_argument("CacheConfig." + std::string(field) + " is " + std::to_string(mine) +
                            " but the transfer engine copies " + std::to_string(engines) +
                            " bytes per item");
  };
  if (e.page_bytes != 0 && c.page_bytes != e.page_bytes)
    return differs("page_bytes", c.page_bytes, e.page_bytes);
  if (e.snapshot_bytes != 0 && c.snapshot_bytes != e.snapshot_bytes)
    return differs("snapshot_bytes", c.snapshot_bytes, e.snapshot_bytes);
  return Status::ok();
}
}  // namespace

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(const CacheConfig& config,
                                                         TransferEngine& engine) {
  if (Status s = config.validate(); !s) return s;
  if (Status s = check_against_engine(config, engine.capacity()); !s) return s;
  return std::unique_ptr<PrefixCache>(new PrefixCache(config, engine));
}

PrefixCache::PrefixCache(const CacheConfig& config, TransferEngine& engine)
    : config_(config),
      tree_(config.page_size),
      gpu_(config.gpu_pages, config.gpu_snapshot_slots, engine),
      host_(static_cast<std::uint32_t>(config.host_pool_pages())),
      requests_(config.gpu_pages, config.gpu_snapshot_slots) {
  // Values per byte for the GreedyDual keys: a KV page saves page_size tokens of recompute
  // per page_bytes; a snapshot saves its gap per the bytes it holds on that tier.
  kv_value_ = config.page_bytes == 0 ? 0 : double(config.page_size) / double(config.page_bytes);
  // On every tier a snapshot takes whole pages of the pool it shares with KV.
  const double paged_snapshot_bytes = double(config.snapshot_pages() * config.page_bytes);
  tier<Tier::kGpu>().snap_value = paged_snapshot_bytes == 0 ? 0 : 1.0 / paged_snapshot_bytes;
  tier<Tier::kHost>().snap_value = tier<Tier::kGpu>().snap_value;
  tier<Tier::kStore>().snap_value = tier<Tier::kHost>().snap_value;
  cost_aware_ = config.snapshot_eviction != SnapshotEviction::kLru;
  shared_host_ = config.snapshot_eviction == SnapshotEviction::kCostAware;
}

PrefixCache::~PrefixCache() {
  drain();
  for_each_tier([this]<Tier T>() { tier<T>().clear(); });
}

// ---------------------------------------------------------------------------------------
// tree walking

template <class T>
std::vector<PrefixCache::Candidate> PrefixCache::candidates_along(const Node* from,
                                                                  std::span<const T> tokens,
                                                                  std::size_t* kv_tokens) const {
  std::vector<Candidate> out;
  std::size_t host_along = 0;
  tree_.walk_kv_path(from, tokens, [&](const Node* c, std::size_t end) {
    if (kv_tokens) *kv_tokens = end;
    if (end != c->boundary) return;  // partial: no boundary inside a node
    if (!c->gpu.has_kv() || c->kv_to_gpu()) host_along += c->tokens.size();
    if (c->has_snapshot()) {
      const bool snap_on_gpu = c->snap_on_device();
      out.push_back({const_cast<Node*>(c), host_along, snap_on_gpu});
    }
  });
  return out;
}
template std::vector<PrefixCache::Candidate> PrefixCache::candidates_along(const Node*,
                                                                           std::span<const Token>,
                                                                           std::size_t*) const;
template std::vector<PrefixCache::Candidate> PrefixCache::candidates_along(
    const Node*, std::span<const std::int64_t>, std::size_t*) const;

bool PrefixCache::worth_loading(const Candidate& c, std::size_t gpu_usable) const {
  return !c.needs_copy() || c.node->boundary >= gpu_usable + config_.load_back_min_tokens;
}

MatchResult PrefixCache::match(std::span<const Token> tokens, NamespaceId ns) const {
  MatchResult r;
  const std::vector<Candidate> candidates = candidates_along(root_of(ns), tokens, &r.kv_tokens);
  if (candidates.empty()) return r;
  r.usable_tokens = candidates.back().node->boundary;
  r.host_tokens = candidates.back().host_tokens;
  r.snapshot_on_gpu = candidates.back().snapshot_on_gpu;
  for (const Candidate& c : candidates) {
    if (!c.needs_copy()) r.gpu_usable_tokens = c.node->boundary;
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (!worth_loading(*it, r.gpu_usable_tokens)) continue;
    r.resume_tokens = it->node->boundary;
    r.load_back = it->needs_copy();
    break;
  }
  return r;
}

Result<MatchResult> PrefixCache::peek(std::span<const Token> prompt, NamespaceId ns) const {
  if (prompt.empty()) return invalid_argument("peek: the prompt is empty");
  return match(prompt.first(prompt.size() - 1), ns);  // as admit(): the last token is computed
}

// ---------------------------------------------------------------------------------------
// residency bookkeeping

void PrefixCache::note_snapshot_change(Node* n, bool had) {
  if (had == n->has_snapshot()) return;
  refresh_gaps_below(n);
  for (Node* p = n; p != nullptr; p = p->parent) {
    if (had) {
      assert(p->snapshots_below > 0);
      // 0: its KV just died; 1: its own snapshot is no longer spent (node.hpp)
      const std::uint32_t left = --p->snapshots_below;
      if (left == 0 || (left == 1 && p->has_snapshot())) refresh(p);
    } else if (const std::uint32_t was = p->snapshots_below++;
               was == 0 || (was == 1 && p->has_snapshot())) {
      refresh(p);  // its KV is resumable again, or its own snapshot may be spent now
    }
  }
}

// ---------------------------------------------------------------------------------------
// eviction orders (node.hpp, "Eviction orders")

namespace {
// A host copy of what the GPU holds is class kCopy under write-back, where it is a promotion's
// leftover. Under write-through the copy is the policy's point (eviction from GPU is free, and
// a shared tier publishes from host copies): it stays kLive until a shared tier published it.
template <Tier T>
bool host_copy(const Node& n, bool on_gpu, const CacheConfig& config) {
  return T == Tier::kHost && on_gpu &&
         (config.write_policy == WritePolicy::kWriteBack || n.published);
}
}  // namespace

// kLru: time of last use alone (class kLive, priority 0 for every node).
// Every key carries the node's retention level (compared right after the class).
template <Tier T>
OrderKey PrefixCache::kv_key(const Node& n) const {
  if (!cost_aware_) return {KeyClass::kLive, 0, n.last_access, n.kv_priority};
  // On host, a copy of KV the GPU holds too goes right after dead KV (node.hpp, KeyClass).
  const KeyClass cls = !n.kv_live()                               ? KeyClass::kDead
                       : host_copy<T>(n, n.gpu.has_kv(), config_) ? KeyClass::kCopy
                                                                  : KeyClass::kLive;
  return {cls, n.row<T>().kv_age + kv_value<T>(n), n.last_access, n.kv_priority};
}

template <Tier T>
double PrefixCache::kv_value(const Node& n) const {
  // Evicting a node's KV from a tier where its snapshot sits at its end also takes that
  // snapshot (nothing resumes there without the KV): GreedyDual-Size then counts what the
  // eviction loses, the KV's tokens and the snapshot's gap, per byte it frees, the KV's and
  // the snapshot's. Valued alone, a KV leaf holding the deepest snapshot of a path looked
  // cheaper than any snapshot far above it. On host (issue 19), for the last copy (a GPU or
  // store copy keeps the snapshot resumable): its drop cascaded into the dead KV above (the
  // compaction regression, docs/results.md). On GPU (issue 36), while spent snapshots are
  // discounted: a conversation then keeps one snapshot, its last finish, and its last turn's
  // KV left before the whole conversation it makes resumable. Where spent snapshots stay,
  // the snapshot above is near and the KV counts alone (valued with its snapshot there, the
  // shipped trace lost 0.8% and its TTFT p50 went from 0.344 s to 0.359 s).
  if constexpr (T == Tier::kStore) {
    return n.kv_uses * kv_value_;
  } else {
    const Row<T>& row = n.row<T>();
    bool takes_snapshot = row.has_snapshot() && !row.pages.empty();
    if constexpr (T == Tier::kHost) takes_snapshot &= !n.gpu.has_kv() && !n.store.has_kv();
    if constexpr (T == Tier::kGpu) takes_snapshot &= discount_spent_;
    if (!takes_snapshot) return n.kv_uses * kv_value_;
    const double kv_bytes = double(row.pages.size()) * double(config_.page_bytes);
    const double snap_bytes = double(row.snapshot.size()) * double(config_.page_bytes);
    const double lost = double(n.kv_uses) * double(row.pages.size() * config_.page_size) +
                        double(n.snap_uses) * double(n.snap_gap);
    return lost / (kv_bytes + snap_bytes);
  }
}

namespace {
// Resumed where its path ended, and superseded by a snapshot below since (node.hpp).
bool spent(const Node& n) {
  return n.snap_frontier_resumes > 0 && n.snapshots_below > 1;
}
}  // namespace

std::uint32_t PrefixCache::snapshot_uses(const Node& n) const {
  if (!discount_spent_ || !spent(n)) return n.snap_uses;
  // Spent: its insert and its frontier resumes went on deeper; the resumes that found it
  // already superseded (a junction requests leave) still count.
  const std::uint32_t gone = n.snap_frontier_resumes + 1;
  return n.snap_uses > gone ? n.snap_uses - gone : 0;
}

void PrefixCache::note_resume(Node* target) {
  ++resumes_;
  if (spent(*target)) {
    last_spent_resume_ = resumes_;  // a spent snapshot was resumed again: it was worth keeping
    ++stats_.spent_resumes;
  }
  // The end of all its path holds: no snapshot below, no child with KV (a junction's children
  // are only walked while none of them holds a snapshot, and stop at the first with KV).
  const bool frontier = target->snapshots_below == 1 &&
                        std::none_of(target->children.begin(), target->children.end(),
                                     [](const auto& child) { return child.second->has_kv(); });
  if (frontier) {
    ++target->snap_frontier_resumes;  // re-keyed by touch_snapshot
    ++stats_.frontier_resumes;
  }
  set_spent_discount(resumes_ > last_spent_resume_ + kSpentWindow);
}

void PrefixCache::set_spent_discount(bool on) {
  if (on == discount_spent_) return;
  discount_spent_ = on;
  // Every linked snapshot key counts the uses anew, and every GPU KV key its snapshot or not
  // (rare: a resume of a spent snapshot, or kSpentWindow resumes after one).
  std::vector<Node*> linked;
  for_each_tier([&]<Tier T>() {
    for (Node& n : tier<T>().template order<Held::kSnapshot>()) linked.push_back(&n);
  });
  for (Node& n : tier<Tier::kGpu>().order<Held::kKv>()) linked.push_back(&n);
  for (Node* n : linked) refresh(n);
}

template <Tier T>
OrderKey PrefixCache::snap_key(const Node& n) const {
  if (!cost_aware_) return {KeyClass::kLive, 0, n.snap_access, n.snap_priority};
  // A snapshot that cannot be resumed from this tier leaves first: on GPU when its KV left
  // the GPU, below when its KV left the cache. Then, on host, a copy of a GPU snapshot.
  const bool resumable = T == Tier::kGpu ? n.gpu.has_kv() : n.has_kv();
  const KeyClass cls = !resumable                                       ? KeyClass::kDead
                       : host_copy<T>(n, n.gpu.has_snapshot(), config_) ? KeyClass::kCopy
                                                                        : KeyClass::kLive;
  return {
      cls,
      n.row<T>().snap_age + double(snapshot_uses(n)) * double(n.snap_gap) * tier<T>().snap_value,
      n.snap_access, n.snap_priority};
}

// check_invariants() (prefix_cache_invariants.cpp) recomputes the keys of every row.
template OrderKey PrefixCache::kv_key<Tier::kGpu>(const Node&) const;
template OrderKey PrefixCache::kv_key<Tier::kHost>(const Node&) const;
template OrderKey PrefixCache::kv_key<Tier::kStore>(const Node&) const;
template OrderKey PrefixCache::snap_key<Tier::kGpu>(const Node&) const;
template OrderKey PrefixCache::snap_key<Tier::kHost>(const Node&) const;
template OrderKey PrefixCache::snap_key<Tier::kStore>(const Node&) const;

void PrefixCache::refresh(Node* n) {
  for_each_tier([this, n]<Tier T>() {
    const bool kv = n->kv_evictable<T>(), snap = n->snapshot_evictable<T>();
    tier<T>().template sync<Held::kKv>(*n, kv, kv ? kv_key<T>(*n) : OrderKey{});
    tier<T>().template sync<Held::kSnapshot>(*n, snap, snap ? snap_key<T>(*n) : OrderKey{});
  });
  if (!sinks_.empty()) [[unlikely]]
    emit_changes(n);
}

void PrefixCache::touch(Node* n) {
  ++n->kv_uses;
  for_each_tier([this, n]<Tier T>() { n->row<T>().kv_age = tier<T>().age(Held::kKv); });
  n->last_access = ++clock_;
  refresh(n);
}

void PrefixCache::touch_snapshot(Node* n) {
  ++n->snap_uses;
  for_each_tier([this, n]<Tier T>() { n->row<T>().snap_age = tier<T>().age(Held::kSnapshot); });
  n->snap_access = ++clock_;
  n->snap_gap = gap_above(*n);
  refresh(n);
}

void PrefixCache::refresh_gaps_below(Node* n) {
  // A snapshot's value is the recompute back to the snapshot above it: when n gains or loses
  // its snapshot, that gap changes for the nearest snapshot on each branch below n (a stale
  // gap made every snapshot of a long prompt tie, so eviction took them oldest first, from
  // the top of the prompt, instead of thinning them out; docs/results.md).
  std::vector<Node*> stack;
  for (const auto& [key, child] : n->children) stack.push_back(child);
  while (!stack.empty()) {
    Node* c = stack.back();
    stack.pop_back();
    if (c->has_snapshot()) {
      const std::size_t gap = gap_above(*c);
      if (gap != c->snap_gap) {
        c->snap_gap = gap;
        refresh(c);
      }
      continue;
    }
    for (const auto& [key, child] : c->children) stack.push_back(child);
  }
}

std::size_t PrefixCache::gap_above(const Node& n) const {
  const Node* p = n.parent;
  while (p != nullptr && !p->is_root() && !p->has_snapshot()) p = p->parent;
  return n.boundary - (p ? p->boundary : 0);
}

void PrefixCache::lock_path(Node* n) {
  for (Node* p = n; p != nullptr; p = p->parent) {
    if (p->lock_count++ == 0) gpu_.locked_pages += p->gpu.pages.size();
    refresh(p);
  }
}

void PrefixCache::unlock_path(Node* n) {
  for (Node* p = n; p != nullptr; p = p->parent) {
    assert(p->lock_count > 0);
    if (--p->lock_count == 0) gpu_.locked_pages -= p->gpu.pages.size();
    refresh(p);
  }
}

void PrefixCache::remove_if_empty(Node* n, std::vector<const Node*>* removed) {
  while (n != nullptr && !n->is_root() && n->children.empty() && n->lock_count == 0 &&
         n->snapshot_lock == 0 && n->host_pin == 0 && !n->has_kv() && n->kv_xfer == Xfer::kNone &&
         n->snap_xfer == Xfer::kNone) {
    // A snapshot without KV below it can never be used: it leaves with the node.
    for_each_tier([this, n]<Tier T>() {
      if (n->row<T>().has_snapshot()) drop_snapshot<T>(n);
    });
    Node* parent = n->parent;
    parent->children.erase(n->first_page(config_.page_size));
    refresh(n);  // unlinks every hook: nothing is evictable any more
    if (removed) removed->push_back(n);
    if (removal_log_) removal_log_->push_back(n);
    tree_.free_leaf(n);
    n = parent;
  }
  if (n != nullptr && n->is_root()) remove_root_if_empty(n);
}

Node* PrefixCache::split(Node* n, std::size_t pages) {
  assert(n->kv_xfer == Xfer::kNone);
  Node* upper = tree_.split_tokens(n, pages);
  // The upper part takes the first pages of every row's KV (the snapshot stays at n's end)
  // and what describes the KV's uses; it has one child, n, holding KV wherever it does.
  for_each_tier([n, upper, pages]<Tier T>() {
    Row<T>& low = n->row<T>();
    Row<T>& up = upper->row<T>();
    up.kv_age = low.kv_age;
    if (!low.has_kv()) return;
    up.pages.assign(low.pages.begin(), low.pages.begin() + std::ptrdiff_t(pages));
    low.pages.erase(low.pages.begin(), low.pages.begin() + std::ptrdiff_t(pages));
    up.kv_children = 1;
  });
  upper->lock_count = n->lock_count;
  upper->last_access = n->last_access;
  upper->kv_uses = n->kv_uses;
  upper->snapshots_below = n->snapshots_below;
  upper->kv_priority = n->kv_priority;
  upper->host_pin = n->host_pin;        // the pins through n run through its upper part too
  upper->published = n->published;      // so were its pages
  upper->reported_kv = n->reported_kv;  // the same pages, already reported: no event
  refresh(upper);
  refresh(n);
  return upper;
}

void PrefixCache::note_host_usage() {
  const std::uint64_t bytes =
      std::uint64_t{host_.pages.capacity() - host_.pages.free_count()} * config_.page_bytes;
  stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, bytes);
}

const char* to_string(Residency residency) {
  switch (residency) {
    case Residency::kNone:
      return "none";
    case Residency::kGpu:
      return "gpu";
    case Residency::kHost:
      return "host";
    case Residency::kBoth:
      return "both";
  }
  return "unknown";
}

const char* to_string(Xfer copy) {
  switch (copy) {
    case Xfer::kNone:
      return "none";
    case Xfer::kDemote:
      return "demote";
    case Xfer::kWriteThrough:
      return "write-through";
    case Xfer::kPromote:
      return "promote";
    case Xfer::kStore:
      return "store";
    case Xfer::kLoad:
      return "load";
    case Xfer::kStage:
      return "stage";
    case Xfer::kMaterialize:
      return "materialize";
  }
  return "unknown";
}

namespace {
Residency residency(bool gpu, bool host) {
  if (gpu && host) return Residency::kBoth;
  if (gpu) return Residency::kGpu;
  return host ? Residency::kHost : Residency::kNone;
}
}  // namespace

std::vector<NodeInfo> PrefixCache::inspect(std::span<const Token> tokens, NamespaceId ns) const {
  std::vector<NodeInfo> out;
  const Node* n = root_of(ns);
  for (std::size_t pos = 0; n != nullptr;) {
    const Node* c = tree_.find_child(n, tokens, pos);
    if (c == nullptr) break;
    const std::size_t k = tree_.common_pages(c, tokens, pos);
    NodeInfo info;
    info.boundary = c->boundary;
    info.tokens = c->tokens.size();
    info.matched = pos + k * config_.page_size;
    // A copy's destination is not a usable copy yet: report the source side only.
    info.kv = residency(c->gpu.has_kv() && !c->kv_to_gpu(), c->host.has_kv() && !c->kv_to_host());
    info.snapshot = residency(c->gpu.has_snapshot() && !c->snap_to_gpu(),
                              c->host.has_snapshot() && !c->snap_to_host());
    info.kv_on_store = c->store.has_kv();
    info.snapshot_on_store = c->store.snapshot.valid();
    info.kv_copy = c->kv_xfer;
    info.snapshot_copy = c->snap_xfer;
    info.locks = c->lock_count;
    info.snapshot_locks = c->snapshot_lock;
    info.kv_priority = c->kv_priority;
    info.snapshot_priority = c->snap_priority;
    info.pins = c->host_pin;
    out.push_back(info);
    if (k < c->page_count(config_.page_size)) break;
    pos += c->tokens.size();
    n = c;
  }
  return out;
}

std::uint64_t PrefixCache::host_bytes_free() const {
  return std::uint64_t{host_.pages.free_count()} * config_.page_bytes;
}

Occupancy PrefixCache::occupancy() const {
  const std::size_t per = config_.snapshot_pages();
  return {gpu_.pages.free_count(), host_.pages.free_count(), gpu_.slots.free_count(),
          static_cast<std::uint32_t>(per == 0 ? 0 : host_.pages.free_count() / per),
          tree_.node_count()};
}

}  // namespace radixtier
