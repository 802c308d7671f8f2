// Eviction of PrefixCache: making room (demote / drop), the watermark step, drop_host(),
// flush(), write-through; the transfers themselves are in prefix_cache_transfers.cpp.
#include <algorithm>
#include <cassert>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

// ---------------------------------------------------------------------------------------
// making room

Status PrefixCache::check_gpu_page_room(std::size_t n) const {
  // Hopeless requests fail before evicting anything: a fallback admission or a stalled
  // request must not flush the GPU tier for nothing. Locked: the KV of locked nodes and the
  // snapshots running requests resume from.
  std::size_t locked = gpu_.locked_pages;
  for (const auto& [id, rec] : requests_) {
    if (rec.holds_snapshot()) locked += rec.snap_node->gpu.snapshot.size();
  }
  for (const auto& [id, c] : xfers_.device) {  // fills of released requests hold their source
    if (c.kind == DeviceCopy::Kind::kFill && !c.lock.valid()) locked += c.node->gpu.snapshot.size();
  }
  const std::size_t held = gpu_.pages.count(Holder::kNode) + gpu_.pages.count(Holder::kTransfer);
  const std::size_t reclaimable = held - std::min(held, locked);
  if (gpu_.pages.free_count() + reclaimable < n) {
    return out_of_memory("GPU pool: " + std::to_string(n) + " pages wanted, " +
                         std::to_string(gpu_.pages.free_count()) + " free and " +
                         std::to_string(reclaimable) +
                         " reclaimable (the rest are locked or held by running requests)");
  }
  return Status::ok();
}

Status PrefixCache::make_gpu_page_room(std::size_t n) {
  if (Status s = check_gpu_page_room(n); !s) return s;
  alloc_room_ = true;
  Status s = reclaim_gpu_pages(n);
  alloc_room_ = false;
  return s;
}

Node* PrefixCache::gpu_victim_not_failed(std::uint64_t round, Held& h) const {
  // The pool's order is the merge of its two orders by key; victims marked in this round are
  // skipped (each is skipped once per round, so this walks at most the marked ones).
  auto kv = tier<Tier::kGpu>().order<Held::kKv>().begin();
  auto sn = tier<Tier::kGpu>().order<Held::kSnapshot>().begin();
  const auto kv_end = tier<Tier::kGpu>().order<Held::kKv>().end();
  const auto sn_end = tier<Tier::kGpu>().order<Held::kSnapshot>().end();
  while (kv != kv_end || sn != sn_end) {
    const bool snapshot = sn != sn_end && (kv == kv_end || sn->gpu.snap_key < kv->gpu.kv_key);
    const Node& n = snapshot ? *sn : *kv;
    if ((snapshot ? n.snap_demote_failed : n.kv_demote_failed) != round) {
      h = snapshot ? Held::kSnapshot : Held::kKv;
      return const_cast<Node*>(&n);
    }
    if (snapshot) {
      ++sn;
    } else {
      ++kv;
    }
  }
  return nullptr;
}

Status PrefixCache::reclaim_gpu_pages(std::size_t n) {
  // A victim whose demotion fails keeps its GPU copy and is skipped for the rest of this
  // round; the room comes from the next one. Ends: every pass frees pages, marks a victim
  // (finitely many) or reaps a transfer (no new ones start but the demotions waited here).
  const std::uint64_t round = ++room_round_;
  // A snapshot being materialized is not evictable until its copy lands; eviction for room
  // lets those land first, so it chooses among the same victims as when the copy was done
  // at insert (the watermark step, which never waits, skips them instead).
  if (gpu_.pages.free_count() < n) settle_device_copies(false);
  while (gpu_.pages.free_count() < n) {
    bool any = false;
    if (Node* head = tier<Tier::kGpu>().victim(any)) {
      // One pass takes the current leaves; their parents become leaves once they leave.
      PendingBatch demote = down_batch<Tier::kGpu>();
      std::size_t releasing = 0;
      while (gpu_.pages.free_count() + releasing < n) {
        Held h = Held::kKv;
        Node* victim = gpu_victim_not_failed(round, h);
        if (victim == nullptr) break;
        tier<Tier::kGpu>().aged_by(h, *victim);
        releasing += victim->gpu.held_pages(h);
        (void)evict<Tier::kGpu>(victim, h, demote, false);
      }
      if (releasing == 0) {
        // Every victim left failed to demote in this round: the room wins, drop the first.
        drop_victim<Tier::kGpu>(head, any ? Held::kSnapshot : Held::kKv);
        continue;
      }
      std::optional<std::uint32_t> id;
      if (Status s = submit_link<Tier::kGpu>(std::move(demote), &id); !s) {
        return Status(s.code(), "GPU pool: " + s.message());
      }
      if (id) wait_link<Tier::kGpu>(*id);
      continue;
    }
    if (!wait_any_transfer()) {
      return out_of_memory("GPU pool: " + std::to_string(n) + " pages wanted, " +
                           std::to_string(gpu_.pages.free_count()) +
                           " free and nothing evictable (every page is locked or owned by "
                           "running requests)");
    }
  }
  return Status::ok();
}

Status PrefixCache::make_gpu_slot_room() {
  // Live slots hold running requests' state, never cached data: nothing to evict. A slot a
  // device copy still holds (a materialization's source, the fill of a released request)
  // is free once it lands: those are waited for.
  if (gpu_.slots.free_count() == 0 && gpu_.slots.count(Holder::kTransfer) > 0) {
    const bool was = alloc_room_;
    alloc_room_ = true;
    settle_device_copies(true);
    alloc_room_ = was;
  }
  if (gpu_.slots.free_count() > 0) return Status::ok();
  ++stats_.snapshot_slot_misses;
  return out_of_memory(
      "GPU live snapshot slots: none free (every slot holds a running request's state); "
      "config.gpu_snapshot_slots bounds the requests that resume or materialize at once");
}

// ---------------------------------------------------------------------------------------
// the watermark step: demoting ahead of need

std::size_t PrefixCache::gpu_pages_demoting() const {
  std::size_t n = 0;
  for (const auto& [id, t] : xfers_.copies) {
    for (const CopyOp& op : t.ops) {
      if (op.kind == Xfer::kDemote)
        n += op.snapshot ? op.node->gpu.snapshot.size() : op.node->gpu.pages.size();
    }
  }
  return n;
}

void PrefixCache::demote_ahead() {
  // No request's: the engine's default stream, whichever call runs it (docs/architecture.md).
  StreamScope scope(this, nullptr);
  // As kswapd: below the low watermark, evict what the order takes next (nothing else, so
  // nothing that would have stayed) until the high watermark is free or on its way; the
  // copies land while the scheduler computes and are reaped by the next entry point.
  // The free room kept is what the running requests may ask for next: each of them one step,
  // its largest allocation seen so far (pages) and a snapshot's pages (insert materializes it
  // into the pool), within the configured shares of the pool. Room kept free beyond that is
  // cache capacity lost: a share of a large pool (2% of a 1M-token pool) pushed a scarce tier's
  // contents out (the compaction regression, docs/results.md). One request's step is kept free
  // even where it is above the share (a snapshot is larger than 2% of a small pool): below it
  // every materialized snapshot would wait for a copy.
  if (config_.gpu_free_low_watermark <= 0) return;
  const std::size_t cap = gpu_.pages.capacity();
  const std::size_t running = std::max<std::size_t>(1, requests_.size());
  const std::size_t step =
      std::max<std::size_t>(1, requests_.alloc_burst()) + config_.snapshot_pages();
  const std::size_t page_need = running * step;
  const std::size_t page_low = std::min(page_need, std::max(config_.low_watermark(cap), step));
  // Free room alone at or above the low watermark is the common case: it returns before
  // walking the copies in flight (poll() runs this on every entry point).
  if (gpu_.pages.free_count() >= page_low) return;
  const std::size_t pages_coming = gpu_.pages.free_count() + gpu_pages_demoting();
  bool snapshot = false;
  if (pages_coming >= page_low || tier<Tier::kGpu>().victim(snapshot) == nullptr) return;
  ++room_round_;  // a victim whose copy fails is marked with this round (node.hpp)
  PendingBatch demote = down_batch<Tier::kGpu>();
  std::uint64_t evicted = 0;
  const std::size_t high =
      std::min(std::max(config_.high_watermark(cap), 2 * step), std::max(page_low, 2 * page_need));
  const std::size_t demoting = pages_coming - gpu_.pages.free_count();
  while (gpu_.pages.free_count() + demoting + demote.batch.pages.size() < high) {
    Node* victim = tier<Tier::kGpu>().victim(snapshot);
    if (victim == nullptr) break;
    const Held h = snapshot ? Held::kSnapshot : Held::kKv;
    tier<Tier::kGpu>().aged_by(h, *victim);
    // Off the order (copy in flight, or dropped as dead), or left: no host room now.
    if (evict<Tier::kGpu>(victim, h, demote, true) == Evicted::kLeft) break;
    ++evicted;
  }
  // Refused: the planned copies are cancelled (their nodes keep their GPU copies) and the
  // allocation that needs the room makes it itself; nothing waits here either way.
  const bool copies = !demote.batch.empty();
  if (!copies || submit_link<Tier::kGpu>(std::move(demote))) stats_.background_evictions += evicted;
}

bool PrefixCache::make_host_page_room(std::size_t n, bool for_snapshot) {
  if (n > host_.pages.capacity()) return false;
  // Split pool: each kind within its share, making room among its own kind only.
  const std::size_t share =
      for_snapshot ? std::size_t{config_.host_snapshot_slots} * config_.snapshot_pages()
                   : config_.host_pages;
  if (!shared_host_ && n > share) return false;
  // `releasing`: host pages the store writes planned in this pass free when they land.
  auto short_of_room = [&](std::size_t releasing) {
    if (host_.pages.free_count() + releasing < n) return true;
    return !shared_host_ &&
           (for_snapshot ? host_.snap_held : host_.kv_held + xfers_.staging_pages) + n >
               share + releasing;
  };
  while (short_of_room(0)) {
    // With a store, a victim is written there (host -> store demotion) and its host copy
    // freed once written; this waits for the writes (the host watermark, store_ahead(),
    // keeps that rare). Without one, or for dead data, it is dropped as before.
    StoreBatch writes;
    std::size_t releasing = 0;
    bool victims = false;
    while (short_of_room(releasing)) {
      bool snapshot = false;
      Node* victim = nullptr;
      if (shared_host_) {
        victim = tier<Tier::kHost>().victim(snapshot);
      } else if (for_snapshot) {
        snapshot = true;
        victim = tier<Tier::kHost>().order<Held::kSnapshot>().empty()
                     ? nullptr
                     : tier<Tier::kHost>().head<Held::kSnapshot>();
      } else {
        victim = tier<Tier::kHost>().order<Held::kKv>().empty()
                     ? nullptr
                     : tier<Tier::kHost>().head<Held::kKv>();
      }
      if (victim == nullptr) break;
      victims = true;
      const Held h = snapshot ? Held::kSnapshot : Held::kKv;
      tier<Tier::kHost>().aged_by(h, *victim);
      const std::size_t pages = victim->host.held_pages(h);
      if (evict<Tier::kHost>(victim, h, writes, false) == Evicted::kCopying) releasing += pages;
    }
    if (writes.empty()) {
      if (!victims) return false;
      continue;
    }
    const std::vector<StoreOp> ops = writes.ops;
    std::optional<std::uint32_t> id;
    if (Status s = submit_link<Tier::kHost>(std::move(writes), &id); !s) {
      // Refused (the ops are cancelled): the room is still needed, so they are dropped, as
      // without a store. Snapshots first: dropping a node's KV may take the node out of the
      // tree, and its snapshot with it.
      for (const StoreOp& op : ops) {
        if (op.snapshot) drop_snapshot<Tier::kHost>(op.node);
      }
      for (const StoreOp& op : ops) {
        if (!op.snapshot) drop_kv<Tier::kHost>(op.node);
      }
      continue;
    }
    ++stats_.store_copy_waits;
    stats_.store_wait_bytes += xfers_.store.at(*id).bytes;
    wait_link<Tier::kHost>(*id);
  }
  return true;
}

std::vector<HostPageId> PrefixCache::take_host_snapshot_pages(Node* n) {
  const std::size_t need = config_.snapshot_pages();
  if (need == 0 || need > host_.pages.capacity()) return {};
  ++n->snapshot_lock;  // pinned: making room must not take n itself out of the tree
  refresh(n);
  const bool room = make_host_page_room(need, true);
  --n->snapshot_lock;
  refresh(n);
  if (!room) return {};
  std::vector<HostPageId> pages;
  pages.reserve(need);
  for (std::size_t i = 0; i < need; ++i) pages.push_back(*host_.pages.take(Holder::kTransfer));
  return pages;
}

void PrefixCache::add_snapshot_pages(TransferBatch& batch, const Node* n) const {
  // Page i of the snapshot on GPU <-> page i on host: the same bytes [i * page_bytes, ...).
  for (std::size_t i = 0; i < n->host.snapshot.size(); ++i)
    batch.pages.push_back({n->gpu.snapshot[i], n->host.snapshot[i]});
}

// ---------------------------------------------------------------------------------------
// evicting one node's resource

void PrefixCache::plan_kv_to_host(Node* n, Xfer kind, PendingBatch& batch) {
  const std::size_t np = n->gpu.pages.size();
  std::vector<HostPageId> dst;
  dst.reserve(np);
  for (std::size_t i = 0; i < np; ++i) {
    dst.push_back(*host_.pages.take(Holder::kTransfer));
    batch.batch.pages.push_back({n->gpu.pages[i], dst.back()});
  }
  n->kv_xfer = kind;
  set_pages<Tier::kHost>(n, std::move(dst));
  batch.ops.push_back({n, false, kind});
}

void PrefixCache::plan_snapshot_to_host(Node* n, std::vector<HostPageId> dst, Xfer kind,
                                        PendingBatch& batch) {
  n->snap_xfer = kind;
  set_snapshot<Tier::kHost>(n, std::move(dst));
  add_snapshot_pages(batch.batch, n);
  batch.ops.push_back({n, true, kind});
}

void PrefixCache::drop_host() {
  poll();
  while (!tier<Tier::kHost>().order<Held::kKv>().empty())
    drop_kv<Tier::kHost>(tier<Tier::kHost>().head<Held::kKv>());
  while (!tier<Tier::kHost>().order<Held::kSnapshot>().empty())
    drop_snapshot<Tier::kHost>(tier<Tier::kHost>().head<Held::kSnapshot>());
  if (sinks_.quiet) emit_contents();
}

void PrefixCache::flush() {
  // Copies in flight pin their nodes; let them land (or fail) first.
  drain();
  // One AllBlocksCleared (and what survives) instead of an event per node dropped.
  sinks_.quiet = !sinks_.empty();
  // Leaf-first: dropping a leaf's last copy removes it, which makes its parent a leaf.
  for_each_tier([this]<Tier T>() {
    while (Node* n = tier<T>().template head<Held::kKv>()) drop_kv<T>(n);
  });
  for_each_tier([this]<Tier T>() {
    while (Node* n = tier<T>().template head<Held::kSnapshot>()) drop_snapshot<T>(n);
  });
  if (host_.link != nullptr)
    (void)host_.link->sync();  // the erases are durable: a restart finds none
  if (sinks_.quiet) emit_contents();
}

// Write-through: give freshly inserted GPU data a host copy in the background, so a later
// eviction is free. Host room is made by dropping host LRU victims; no room, no copy.
void PrefixCache::write_through(std::span<Node* const> nodes, Node* snapshot_node) {
  PendingBatch copy = down_batch<Tier::kGpu>();
  for (Node* n : nodes) {
    if (!n->gpu.has_kv() || n->host.has_kv() || n->kv_xfer != Xfer::kNone) continue;
    (void)plan_down<Tier::kGpu>(n, Held::kKv, Xfer::kWriteThrough, copy);
  }
  Node* s = snapshot_node;
  if (s && s->gpu.has_snapshot() && !s->host.has_snapshot() && s->snap_xfer == Xfer::kNone)
    (void)plan_down<Tier::kGpu>(s, Held::kSnapshot, Xfer::kWriteThrough, copy);
  // Refused: the nodes stay GPU-only (cancel_ops), the insert that asked for the copy has
  // already succeeded; the demotion that evicts them later reports a refusal then.
  (void)submit_link<Tier::kGpu>(std::move(copy));
}

}  // namespace radixtier
