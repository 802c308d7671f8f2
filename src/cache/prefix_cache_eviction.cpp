// Eviction (demote / drop) and the transfer bookkeeping of PrefixCache.
#include <algorithm>
#include <cassert>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {
std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
}

/// Tokens a request would recompute if this snapshot were gone: back to the nearest
/// snapshot above it (or the root).
std::size_t recompute_saved(const Node& n) {
  const Node* p = n.parent;
  while (p != nullptr && !p->is_root() && !p->has_snapshot()) p = p->parent;
  return n.boundary - (p ? p->boundary : 0);
}

/// The snapshot to evict from an LRU list. kLru: its head. kUtility (after Marconi): among
/// the kWindow least recent, the lowest recency rank + normalised recompute saved per byte
/// (every snapshot has the same size, so per byte is per snapshot).
template <class List>
Node* snapshot_victim(List& list, SnapshotEviction policy) {
  if (policy == SnapshotEviction::kLru) return &list.front();
  constexpr std::size_t kWindow = 8;
  Node* window[kWindow];
  std::size_t saved[kWindow];
  std::size_t n = 0, most = 1;
  for (auto it = list.begin(); it != list.end() && n < kWindow; ++it, ++n) {
    window[n] = &*it;
    saved[n] = recompute_saved(*it);
    most = std::max(most, saved[n]);
  }
  std::size_t best = 0;
  double best_score = 1e300;
  for (std::size_t i = 0; i < n; ++i) {
    const double recency = n > 1 ? double(i) / double(n - 1) : 0.0;
    const double score = recency + double(saved[i]) / double(most);
    if (score < best_score) {
      best_score = score;
      best = i;
    }
  }
  return window[best];
}
}  // namespace

// ---------------------------------------------------------------------------------------
// making room

Status PrefixCache::check_gpu_page_room(std::size_t n) const {
  // Hopeless requests fail before evicting anything: a fallback admission or a stalled
  // request must not flush the GPU tier for nothing.
  const std::size_t reclaimable =
      gpu_pages_.count(Holder::kNode) + gpu_pages_.count(Holder::kTransfer) - locked_gpu_pages_;
  if (gpu_pages_.free_count() + reclaimable < n) {
    return out_of_memory("GPU KV pool: " + std::to_string(n) + " pages wanted, " +
                         std::to_string(gpu_pages_.free_count()) + " free and " +
                         std::to_string(reclaimable) +
                         " reclaimable (the rest are locked or held by running requests)");
  }
  return Status::ok();
}

Status PrefixCache::make_gpu_page_room(std::size_t n) {
  if (Status s = check_gpu_page_room(n); !s) return s;
  while (gpu_pages_.free_count() < n) {
    if (!gpu_kv_lru_.empty()) {
      // One round takes the current leaves; their parents become leaves once they leave.
      PendingBatch demote;
      demote.batch.direction = Direction::kDeviceToHost;
      std::size_t releasing = 0;
      while (!gpu_kv_lru_.empty() && gpu_pages_.free_count() + releasing < n) {
        Node* victim = &gpu_kv_lru_.front();
        releasing += victim->gpu_pages.size();
        evict_gpu_kv(victim, demote);
      }
      std::optional<std::uint32_t> id;
      if (Status s = submit_batch(std::move(demote), &id); !s) {
        return Status(s.code(), "GPU KV pool: " + s.message());
      }
      if (id) wait_transfer(*id);
      continue;
    }
    if (!wait_any_transfer()) {
      return out_of_memory("GPU KV pool: " + std::to_string(n) + " pages wanted, " +
                           std::to_string(gpu_pages_.free_count()) +
                           " free and nothing evictable (every page is locked or owned by "
                           "running requests)");
    }
  }
  return Status::ok();
}

Status PrefixCache::check_gpu_slot_room() const {
  if (gpu_slots_.free_count() > 0) return Status::ok();
  // As for pages: when every slot is pinned or held by a request, fail before evicting.
  std::unordered_set<const Node*> pinned;
  for (const auto& [id, rec] : locks_) {
    if (rec.snap_node != nullptr && rec.snap_node->gpu_snapshot.valid())
      pinned.insert(rec.snap_node);
  }
  if (gpu_slots_.count(Holder::kNode) + gpu_slots_.count(Holder::kTransfer) <= pinned.size()) {
    return out_of_memory(
        "GPU snapshot slots: none free and every slot is pinned by a running request or held "
        "by one");
  }
  return Status::ok();
}

Status PrefixCache::make_gpu_slot_room() {
  if (Status s = check_gpu_slot_room(); !s) return s;
  while (gpu_slots_.free_count() == 0) {
    if (!gpu_snap_lru_.empty()) {
      PendingBatch demote;
      demote.batch.direction = Direction::kDeviceToHost;
      evict_gpu_snapshot(snapshot_victim(gpu_snap_lru_, config_.snapshot_eviction), demote);
      std::optional<std::uint32_t> id;
      if (Status s = submit_batch(std::move(demote), &id); !s) {
        return Status(s.code(), "GPU snapshot slots: " + s.message());
      }
      if (id) wait_transfer(*id);
      continue;
    }
    if (!wait_any_transfer()) {
      return out_of_memory(
          "GPU snapshot slots: none free and nothing evictable (every slot is pinned by a "
          "running request)");
    }
  }
  return Status::ok();
}

bool PrefixCache::make_host_page_room(std::size_t n) {
  if (n > host_pages_.capacity()) return false;
  while (host_pages_.free_count() < n) {
    if (host_kv_lru_.empty()) return false;
    drop_host_kv(&host_kv_lru_.front());
  }
  return true;
}

bool PrefixCache::make_host_slot_room() {
  if (host_slots_.capacity() == 0) return false;
  while (host_slots_.free_count() == 0) {
    if (host_snap_lru_.empty()) return false;
    drop_host_snapshot(snapshot_victim(host_snap_lru_, config_.snapshot_eviction));
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// evicting one node's resource

void PrefixCache::evict_gpu_kv(Node* n, PendingBatch& demote) {
  assert(n->gpu_kv_evictable());
  const std::size_t np = n->gpu_pages.size();
  if (n->has_host_kv()) {  // clean host copy: eviction is free
    stats_.kv_pages_demoted += np;
    drop_gpu_kv(n);
    return;
  }
  if (make_host_page_room(np)) {
    std::vector<HostPageId> dst;
    dst.reserve(np);
    for (std::size_t i = 0; i < np; ++i) {
      dst.push_back(*host_pages_.take(Holder::kTransfer));
      demote.batch.pages.push_back({n->gpu_pages[i], dst.back()});
    }
    n->kv_xfer = Xfer::kDemote;
    set_host_pages(n, std::move(dst));
    demote.ops.push_back({n, false, Xfer::kDemote});
    return;
  }
  stats_.kv_pages_dropped_gpu += np;
  drop_gpu_kv(n);
  remove_if_empty(n);
}

void PrefixCache::evict_gpu_snapshot(Node* n, PendingBatch& demote) {
  assert(n->gpu_snapshot_evictable());
  // Keep a host copy only when it can be used again: a clean one exists, or KV is there.
  if (n->host_snapshot.valid() || !n->has_kv() || !make_host_slot_room()) {
    drop_gpu_snapshot(n);
    return;
  }
  n->host_snapshot = *host_slots_.take(Holder::kTransfer);
  n->snap_xfer = Xfer::kDemote;
  demote.batch.snapshots.push_back({n->gpu_snapshot, n->host_snapshot});
  demote.ops.push_back({n, true, Xfer::kDemote});
  refresh(n);
  note_host_usage();
}

void PrefixCache::drop_gpu_kv(Node* n) {
  for (GpuPageId id : n->gpu_pages) gpu_pages_.give_back(id);
  set_gpu_pages(n, {});
}

void PrefixCache::drop_host_kv(Node* n) {
  stats_.kv_pages_dropped_host += n->host_pages.size();
  for (HostPageId id : n->host_pages) host_pages_.give_back(id);
  set_host_pages(n, {});
  remove_if_empty(n);
}

void PrefixCache::drop_gpu_snapshot(Node* n) {
  gpu_slots_.give_back(n->gpu_snapshot);
  n->gpu_snapshot = GpuSlotId();
  if (!n->host_snapshot.valid()) ++stats_.snapshots_dropped;
  refresh(n);
}

void PrefixCache::drop_host_snapshot(Node* n) {
  host_slots_.give_back(n->host_snapshot);
  n->host_snapshot = HostSlotId();
  if (!n->gpu_snapshot.valid()) ++stats_.snapshots_dropped;
  refresh(n);
}

void PrefixCache::drop_host() {
  poll();
  while (!host_kv_lru_.empty()) drop_host_kv(&host_kv_lru_.front());
  while (!host_snap_lru_.empty()) drop_host_snapshot(&host_snap_lru_.front());
}

void PrefixCache::flush() {
  // Copies in flight pin their nodes; let them land (or fail) first.
  drain();
  // Leaf-first: dropping a leaf's last copy removes it, which makes its parent a leaf.
  while (!gpu_kv_lru_.empty()) {
    Node* n = &gpu_kv_lru_.front();
    stats_.kv_pages_dropped_gpu += n->gpu_pages.size();
    drop_gpu_kv(n);
    remove_if_empty(n);
  }
  while (!host_kv_lru_.empty()) drop_host_kv(&host_kv_lru_.front());
  while (!gpu_snap_lru_.empty()) drop_gpu_snapshot(&gpu_snap_lru_.front());
  while (!host_snap_lru_.empty()) drop_host_snapshot(&host_snap_lru_.front());
}

// Write-through: give freshly inserted GPU data a host copy in the background, so a later
// eviction is free. Host room is made by dropping host LRU victims; no room, no copy.
void PrefixCache::write_through(std::span<Node* const> nodes, Node* snapshot_node) {
  PendingBatch copy;
  copy.batch.direction = Direction::kDeviceToHost;
  for (Node* n : nodes) {
    if (!n->has_gpu_kv() || n->has_host_kv() || n->kv_xfer != Xfer::kNone) continue;
    const std::size_t np = n->gpu_pages.size();
    if (!make_host_page_room(np)) continue;
    std::vector<HostPageId> dst;
    for (std::size_t i = 0; i < np; ++i) {
      dst.push_back(*host_pages_.take(Holder::kTransfer));
      copy.batch.pages.push_back({n->gpu_pages[i], dst.back()});
    }
    n->kv_xfer = Xfer::kWriteThrough;
    set_host_pages(n, std::move(dst));
    copy.ops.push_back({n, false, Xfer::kWriteThrough});
  }
  Node* s = snapshot_node;
  if (s && s->gpu_snapshot.valid() && !s->host_snapshot.valid() && s->snap_xfer == Xfer::kNone &&
      make_host_slot_room()) {
    s->host_snapshot = *host_slots_.take(Holder::kTransfer);
    s->snap_xfer = Xfer::kWriteThrough;
    copy.batch.snapshots.push_back({s->gpu_snapshot, s->host_snapshot});
    copy.ops.push_back({s, true, Xfer::kWriteThrough});
    refresh(s);
    note_host_usage();
  }
  // Refused: the nodes stay GPU-only (cancel_ops), the insert that asked for the copy has
  // already succeeded; the demotion that evicts them later reports a refusal then.
  (void)submit_batch(std::move(copy));
}

// ---------------------------------------------------------------------------------------
// transfers

Status PrefixCache::submit_batch(PendingBatch&& pending, std::optional<std::uint32_t>* id_out) {
  if (id_out) id_out->reset();
  if (pending.batch.empty()) return Status::ok();
  const TransferBatch& b = pending.batch;
  const std::uint64_t bytes =
      b.pages.size() * config_.page_bytes + b.snapshots.size() * config_.snapshot_bytes;
  const std::uint64_t copies =
      ceil_div(b.pages.size(), config_.slice_pages) +
      b.snapshots.size() * ceil_div(config_.snapshot_bytes, config_.slice_bytes());
  const bool d2h = b.direction == Direction::kDeviceToHost;
  const std::size_t pages = b.pages.size(), snapshots = b.snapshots.size();
  const Direction direction = b.direction;
  Result<Ticket> ticket = engine_.submit(std::move(pending.batch));
  if (!ticket) {
    // The engine refused the batch: nothing moved, so nothing is lost either.
    ++stats_.transfers_failed;
    cancel_ops(pending.ops);
    return Status(ErrorCode::kTransferFailed,
                  std::string("the transfer engine refused a ") + to_string(direction) +
                      " batch of " + std::to_string(pages) + " pages and " +
                      std::to_string(snapshots) + " snapshots: " + ticket.status().message());
  }
  (d2h ? stats_.bytes_d2h : stats_.bytes_h2d) += bytes;
  (d2h ? stats_.copies_d2h : stats_.copies_h2d) += copies;
  const std::uint32_t id = next_free_id(next_transfer_, transfers_);
  for (const CopyOp& op : pending.ops)
    (op.snapshot ? op.node->snap_xfer_id : op.node->kv_xfer_id) = id;
  transfers_.emplace(id, InFlight{std::move(*ticket), std::move(pending.ops)});
  if (id_out) *id_out = id;
  return Status::ok();
}

void PrefixCache::cancel_ops(std::span<const CopyOp> ops) {
  // Every copy was planned from a node without a copy on its destination tier: give the
  // destinations back and the node is where it was.
  for (const CopyOp& op : ops) {
    Node* n = op.node;
    if (!op.snapshot) {
      n->kv_xfer = Xfer::kNone;
      if (op.kind == Xfer::kPromote) {
        for (GpuPageId id : n->gpu_pages) gpu_pages_.give_back(id);
        set_gpu_pages(n, {});
      } else {
        for (HostPageId id : n->host_pages) host_pages_.give_back(id);
        set_host_pages(n, {});
      }
      place_by_use(n, false);
      continue;
    }
    n->snap_xfer = Xfer::kNone;
    if (op.kind == Xfer::kPromote) {
      gpu_slots_.give_back(n->gpu_snapshot);
      n->gpu_snapshot = GpuSlotId();
    } else {
      host_slots_.give_back(n->host_snapshot);
      n->host_snapshot = HostSlotId();
    }
    refresh(n);
    place_by_use(n, true);
  }
}

void PrefixCache::wait_transfer(std::uint32_t id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  const TransferState state = it->second.ticket.wait();
  finish_transfer(id, state == TransferState::kDone);
}

bool PrefixCache::wait_any_transfer() {
  if (transfers_.empty()) return false;
  std::uint32_t oldest = transfers_.begin()->first;
  for (const auto& [id, t] : transfers_) oldest = std::min(oldest, id);
  wait_transfer(oldest);
  return true;
}

void PrefixCache::poll() {
  if (transfers_.empty()) return;
  std::vector<std::pair<std::uint32_t, bool>> done;
  for (auto& [id, t] : transfers_) {
    const TransferState s = t.ticket.poll();
    if (s != TransferState::kPending) done.emplace_back(id, s == TransferState::kDone);
  }
  std::sort(done.begin(), done.end());
  for (auto [id, ok] : done) finish_transfer(id, ok);
}

void PrefixCache::drain() {
  while (wait_any_transfer()) {
  }
}

void PrefixCache::finish_transfer(std::uint32_t id, bool ok) {
  auto handle = transfers_.extract(id);
  if (handle.empty()) return;
  InFlight& t = handle.mapped();
  t.ticket.reset();
  if (!ok) ++stats_.transfers_failed;
  finish_ops(t.ops, ok);
}

void PrefixCache::finish_ops(std::span<const CopyOp> ops, bool ok) {
  for (const CopyOp& op : ops) {
    finish_op(op, ok);
    place_by_use(op.node, op.snapshot);
  }
  // Failed copies may leave empty leaves; prune them deepest first, skipping any node an
  // earlier prune already removed (a parent listed after its child).
  std::vector<Node*> nodes;
  for (const CopyOp& op : ops) nodes.push_back(op.node);
  std::sort(nodes.begin(), nodes.end(),
            [](const Node* a, const Node* b) { return a->boundary > b->boundary; });
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::vector<const Node*> removed;
  for (Node* n : nodes) {
    if (std::find(removed.begin(), removed.end(), n) == removed.end()) remove_if_empty(n, &removed);
  }
}

void PrefixCache::finish_op(const CopyOp& op, bool ok) {
  Node* n = op.node;
  if (!op.snapshot) {
    assert(n->kv_xfer == op.kind);
    n->kv_xfer = Xfer::kNone;
    const std::size_t np = n->gpu_pages.size();
    if (op.kind == Xfer::kPromote) {
      if (ok) {
        for (GpuPageId id : n->gpu_pages) gpu_pages_.reassign(id, Holder::kNode);
        stats_.kv_pages_promoted += np;
        refresh(n);
      } else {  // rule 7: the node becomes a tombstone
        for (GpuPageId id : n->gpu_pages) gpu_pages_.give_back(id);
        set_gpu_pages(n, {});
        stats_.kv_pages_dropped_host += n->host_pages.size();
        for (HostPageId id : n->host_pages) host_pages_.give_back(id);
        set_host_pages(n, {});
      }
      return;
    }
    if (ok) {
      for (HostPageId id : n->host_pages) host_pages_.reassign(id, Holder::kNode);
    } else {
      for (HostPageId id : n->host_pages) host_pages_.give_back(id);
      set_host_pages(n, {});
    }
    if (op.kind == Xfer::kDemote && n->lock_count == 0) {
      // Done: the GPU copy is freed. Failed: it is dropped too (rule 7), which still makes
      // the room the demotion was for. A node locked meanwhile keeps its GPU copy.
      if (ok) {
        stats_.kv_pages_demoted += np;
      } else {
        stats_.kv_pages_dropped_gpu += np;
      }
      drop_gpu_kv(n);
    }
    refresh(n);
    return;
  }
  assert(n->snap_xfer == op.kind);
  n->snap_xfer = Xfer::kNone;
  if (op.kind == Xfer::kPromote) {
    if (ok) {
      gpu_slots_.reassign(n->gpu_snapshot, Holder::kNode);
      ++stats_.snapshots_promoted;
      refresh(n);
    } else {
      gpu_slots_.give_back(n->gpu_snapshot);
      n->gpu_snapshot = GpuSlotId();
      drop_host_snapshot(n);
    }
    return;
  }
  if (ok) {
    host_slots_.reassign(n->host_snapshot, Holder::kNode);
    if (op.kind == Xfer::kDemote) ++stats_.snapshots_demoted;
  } else {
    host_slots_.give_back(n->host_snapshot);
    n->host_snapshot = HostSlotId();
  }
  if (op.kind == Xfer::kDemote && n->snapshot_lock == 0) drop_gpu_snapshot(n);
  refresh(n);
}

}  // namespace radixtier
