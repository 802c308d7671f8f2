// The controls an engine's scheduler calls on PrefixCache besides the request lifecycle:
// explicit eviction, the evictable / locked sizes per tier, and the per-path snapshot cap.
#include <algorithm>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::kGpu:
      return "gpu";
    case Tier::kHost:
      return "host";
    case Tier::kStore:
      return "store";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// evict

Result<EvictResult> PrefixCache::evict(const EvictRequest& request) {
  if (request.tier != Tier::kGpu && request.tier != Tier::kHost && request.tier != Tier::kStore)
    return invalid_argument("evict: unknown tier " + std::to_string(int(request.tier)));
  if (request.tier == Tier::kStore && host_.link == nullptr)
    return invalid_argument("evict: this cache has no store tier");
  poll();
  const std::size_t ps = config_.page_size;
  const std::size_t pages = (request.tokens + ps - 1) / ps;
  EvictResult out;
  if (request.tier == Tier::kGpu) {
    // As making room does (demote, or drop), each kind from its own order, lowest key first;
    // a victim whose demotion fails is not taken again in this call, and when every victim
    // left has failed, the room wins: the first is dropped (reclaim_gpu_pages).
    const std::size_t per = std::max<std::size_t>(1, config_.snapshot_pages());
    const std::size_t kv_before = gpu_.kv_held, snap_before = gpu_.snap_held;
    const std::size_t free_before = gpu_.pages.free_count();
    const std::uint64_t round = ++room_round_;
    auto evict_one = [&](auto& order, std::uint64_t Node::*failed, Held h) -> Status {
      if (order.empty()) {
        // What the watermark step is demoting is on its way out, and a node whose store
        // write is in flight is off the order until it lands: wait, as making room does.
        if (!wait_any_transfer()) return out_of_memory("nothing left to evict");
        return Status::ok();
      }
      Node* victim = nullptr;
      for (Node& n : order) {
        if (n.*failed != round) {
          victim = &n;
          break;
        }
      }
      if (victim == nullptr) {  // every victim left failed this round: the room wins
        drop_victim<Tier::kGpu>(&*order.begin(), h);
        return Status::ok();
      }
      tier<Tier::kGpu>().aged_by(h, *victim);
      PendingBatch demote = down_batch<Tier::kGpu>();
      (void)evict<Tier::kGpu>(victim, h, demote, false);
      std::optional<std::uint32_t> id;
      if (Status s = submit_link<Tier::kGpu>(std::move(demote), &id); !s) return s;
      if (id) wait_link<Tier::kGpu>(*id);
      return Status::ok();
    };
    auto& kv_order = tier<Tier::kGpu>().order<Held::kKv>();
    auto& snap_order = tier<Tier::kGpu>().order<Held::kSnapshot>();
    // Each kind as far as it goes: no KV left to evict does not stop the snapshots.
    Status s = Status::ok();
    while (s && kv_before - std::min(kv_before, gpu_.kv_held) < pages)
      s = evict_one(kv_order, &Node::kv_demote_failed, Held::kKv);
    if (!s && s.code() != ErrorCode::kOutOfMemory) return Status(s.code(), "evict: " + s.message());
    s = Status::ok();
    while (s && (snap_before - std::min(snap_before, gpu_.snap_held)) / per < request.snapshots)
      s = evict_one(snap_order, &Node::snap_demote_failed, Held::kSnapshot);
    if (!s && s.code() != ErrorCode::kOutOfMemory) return Status(s.code(), "evict: " + s.message());
    out.kv_pages = kv_before - std::min(kv_before, gpu_.kv_held);
    out.snapshots =
        static_cast<std::uint32_t>((snap_before - std::min(snap_before, gpu_.snap_held)) / per);
    const std::size_t free_after = gpu_.pages.free_count();
    out.bytes = std::uint64_t{free_after - std::min(free_after, free_before)} * config_.page_bytes;
    return out;
  }
  if (request.tier == Tier::kStore) {  // erases, lowest key first, each kind from its order
    // A snapshot that left with its node's KV counts as freed too.
    const std::size_t snaps_before = store_tier_.snaps_held;
    while (out.kv_pages < pages && !tier<Tier::kStore>().order<Held::kKv>().empty()) {
      Node* victim = tier<Tier::kStore>().head<Held::kKv>();
      out.kv_pages += victim->store.pages.size();
      drop_kv<Tier::kStore>(victim);
    }
    while (snaps_before - store_tier_.snaps_held < request.snapshots &&
           !tier<Tier::kStore>().order<Held::kSnapshot>().empty()) {
      Node* victim = tier<Tier::kStore>().head<Held::kSnapshot>();
      drop_snapshot<Tier::kStore>(victim);
      remove_if_empty(victim);
    }
    out.snapshots = static_cast<std::uint32_t>(snaps_before - store_tier_.snaps_held);
    out.bytes = std::uint64_t{out.kv_pages} * config_.page_bytes +
                std::uint64_t{out.snapshots} * config_.snapshot_bytes;
    return out;
  }
  // Host: drops, lowest key first, each kind from its own order.
  const std::size_t kv_before = host_.kv_held, snap_before = host_.snap_held;
  const std::size_t free_before = host_.pages.free_count();
  while (kv_before - host_.kv_held < pages && !tier<Tier::kHost>().order<Held::kKv>().empty()) {
    Node* victim = tier<Tier::kHost>().head<Held::kKv>();
    tier<Tier::kHost>().aged_by(Held::kKv, *victim);
    if (!victim->kv_live()) stats_.dead_kv_pages_dropped += victim->host.pages.size();
    drop_kv<Tier::kHost>(victim);
  }
  const std::size_t per = config_.snapshot_pages();
  while ((snap_before - host_.snap_held) / per < request.snapshots &&
         !tier<Tier::kHost>().order<Held::kSnapshot>().empty()) {
    Node* victim = tier<Tier::kHost>().head<Held::kSnapshot>();
    tier<Tier::kHost>().aged_by(Held::kSnapshot, *victim);
    drop_snapshot<Tier::kHost>(victim);
    remove_if_empty(victim);
  }
  out.kv_pages = kv_before - host_.kv_held;
  out.snapshots = static_cast<std::uint32_t>((snap_before - host_.snap_held) / per);
  out.bytes = std::uint64_t{host_.pages.free_count() - free_before} * config_.page_bytes;
  return out;
}

// ---------------------------------------------------------------------------------------
// sizes

CacheSizes PrefixCache::sizes() const {
  CacheSizes out;
  // The locked part: every node on a running request's path, each once (a walk up stops at
  // a node already seen, whose ancestors were seen with it), and the snapshots resumed from.
  std::unordered_set<const Node*> seen;
  std::size_t host_kv_locked = 0;
  // Host pins protect their prefix's host copies as a lock does (and their snapshot's).
  for (const auto& [id, rec] : requests_) {
    for (const Node* n = rec.node; n != nullptr && seen.insert(n).second; n = n->parent) {
      host_kv_locked += n->host.pages.size();
    }
  }
  for (const auto& [id, pin] : pins_) {
    for (const Node* n = pin.node; n != nullptr && seen.insert(n).second; n = n->parent) {
      host_kv_locked += n->host.pages.size();
    }
  }
  std::unordered_set<const Node*> pinned;
  for (const auto& [id, rec] : requests_) {
    if (rec.holds_snapshot()) pinned.insert(rec.snap_node);
  }
  std::unordered_set<const Node*> host_pinned;
  for (const auto& [id, pin] : pins_) host_pinned.insert(pin.node);
  std::size_t gpu_snaps_locked = 0, host_snaps_locked = 0;
  for (const Node* n : pinned) {
    gpu_snaps_locked += n->gpu.has_snapshot();
    host_snaps_locked += n->host.has_snapshot();
  }
  for (const Node* n : host_pinned) {
    if (!pinned.count(n)) host_snaps_locked += n->host.has_snapshot();
  }
  const std::size_t per = config_.snapshot_pages();
  const std::size_t gpu_kv_held = gpu_.kv_held;
  const std::size_t gpu_snaps_held = per == 0 ? 0 : gpu_.snap_held / per;
  const std::size_t host_snaps_held = per == 0 ? 0 : host_.snap_held / per;

  TierSizes& g = out.gpu;
  g.kv_pages_locked = gpu_.locked_pages;
  g.kv_pages_evictable = gpu_kv_held - gpu_.locked_pages;
  g.snapshots_locked = gpu_snaps_locked;
  g.snapshots_evictable = gpu_snaps_held - gpu_snaps_locked;
  const std::uint64_t paged_snapshot_bytes = std::uint64_t{per} * config_.page_bytes;
  g.bytes_locked = std::uint64_t{g.kv_pages_locked} * config_.page_bytes +
                   std::uint64_t{g.snapshots_locked} * paged_snapshot_bytes;
  g.bytes_evictable = std::uint64_t{g.kv_pages_evictable} * config_.page_bytes +
                      std::uint64_t{g.snapshots_evictable} * paged_snapshot_bytes;

  TierSizes& h = out.host;
  h.kv_pages_locked = host_kv_locked;
  h.kv_pages_evictable = host_.kv_held - host_kv_locked;
  h.snapshots_locked = host_snaps_locked;
  h.snapshots_evictable = host_snaps_held - host_snaps_locked;
  h.bytes_locked = std::uint64_t{h.kv_pages_locked} * config_.page_bytes +
                   std::uint64_t{h.snapshots_locked} * paged_snapshot_bytes;
  h.bytes_evictable = std::uint64_t{h.kv_pages_evictable} * config_.page_bytes +
                      std::uint64_t{h.snapshots_evictable} * paged_snapshot_bytes;

  // The store: what a running request's path holds is locked there too (its records are
  // not erased while it runs); pins are host-only.
  if (host_.link == nullptr) return out;
  TierSizes& st = out.store;
  std::unordered_set<const Node*> on_path;
  for (const auto& [id, rec] : requests_) {
    for (const Node* n = rec.node; n != nullptr && on_path.insert(n).second; n = n->parent) {
      st.kv_pages_locked += n->store.pages.size();
    }
  }
  std::size_t store_kv = 0, store_snaps = 0;
  std::vector<const Node*> stack{tree_.root()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    store_kv += n->store.pages.size();
    store_snaps += n->store.snapshot.valid();
    for (const auto& [key, c] : n->children) stack.push_back(c);
  }
  for (const Node* n : pinned) st.snapshots_locked += n->store.snapshot.valid();
  st.kv_pages_evictable = store_kv - st.kv_pages_locked;
  st.snapshots_evictable = store_snaps - st.snapshots_locked;
  st.bytes_locked = std::uint64_t{st.kv_pages_locked} * config_.page_bytes +
                    std::uint64_t{st.snapshots_locked} * config_.snapshot_bytes;
  st.bytes_evictable = std::uint64_t{st.kv_pages_evictable} * config_.page_bytes +
                       std::uint64_t{st.snapshots_evictable} * config_.snapshot_bytes;
  return out;
}

// ---------------------------------------------------------------------------------------
// the per-path snapshot cap

namespace {
/// The downward path from n (exclusive) holding the most snapshots, deepest node last.
std::vector<Node*> most_snapshots_below(Node* n) {
  std::vector<Node*> best;
  std::size_t best_count = 0;
  for (const auto& [key, c] : n->children) {
    std::vector<Node*> path = most_snapshots_below(c);
    path.insert(path.begin(), c);
    std::size_t count = 0;
    for (const Node* p : path) count += p->has_snapshot();
    if (count > best_count) {
      best_count = count;
      best = std::move(path);
    }
  }
  return best;
}
}  // namespace

void PrefixCache::cap_path_snapshots(Node* n) {
  const std::size_t cap = config_.max_snapshots_per_path;
  if (cap == 0) return;
  // Before this attach every path held at most `cap`, so only paths through n can exceed it:
  // take the fullest (n's root path and the fullest way down from n) and drop its least
  // useful snapshot, until it fits. n's own snapshot is on every such path and can always
  // go, so this ends.
  for (;;) {
    std::vector<Node*> path = most_snapshots_below(n);
    for (Node* p = n; p != nullptr && !p->is_root(); p = p->parent) path.push_back(p);
    Node* victim = nullptr;
    Node* arriving = nullptr;  // n's own snapshot, still being materialized
    double victim_cost = 0;
    std::size_t on_path = 0;
    for (Node* p : path) {
      if (!p->has_snapshot()) continue;
      ++on_path;
      if (p == n && p->snap_xfer == Xfer::kMaterialize && p->snapshot_lock == 0 && p->snap_pin == 0)
        arriving = p;
      // Never the snapshot a running request resumes from, a pinned one, nor one with a copy
      // in flight.
      if (p->snapshot_lock > 0 || p->snap_pin > 0 || p->snap_xfer != Xfer::kNone) continue;
      // Lower retention priority goes first (as in the eviction orders); then the loss:
      // its users resume at the snapshot above, uses x tokens recomputed.
      const double cost = double(std::max<std::uint32_t>(p->snap_uses, 1)) * double(gap_above(*p));
      if (victim == nullptr || p->snap_priority < victim->snap_priority ||
          (p->snap_priority == victim->snap_priority &&
           (cost < victim_cost || (cost == victim_cost && p->snap_access < victim->snap_access)))) {
        victim = p;
        victim_cost = cost;
      }
    }
    if (on_path > cap && victim == nullptr && arriving != nullptr) {
      // Only the snapshot just attached could go, and its copy is still landing: let it land
      // (a host wait, only when the cap is exceeded and nothing else can leave; insert's own
      // write-through follows), then choose again.
      wait_device_copy(arriving->snap_xfer_id, false);
      continue;
    }
    if (on_path <= cap || victim == nullptr) return;
    // Counted as a drop (CacheStats::snapshots_dropped), once for all its copies.
    if (victim->store.snapshot.valid()) drop_snapshot<Tier::kStore>(victim);
    if (victim->gpu.has_snapshot()) drop_snapshot<Tier::kGpu>(victim);
    if (victim->host.has_snapshot()) drop_snapshot<Tier::kHost>(victim);
  }
}

}  // namespace radixtier
