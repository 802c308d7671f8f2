// The transfer bookkeeping of PrefixCache: submitting GPU-host batches, reaping and waiting
// for them, and applying a finished copy to its nodes (the state machine of node.hpp).
#include <algorithm>
#include <cassert>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {
std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// transfers

Status PrefixCache::submit_batch(PendingBatch&& pending, std::optional<std::uint32_t>* id_out) {
  if (id_out) id_out->reset();
  if (pending.batch.empty()) return Status::ok();
  const TransferBatch& b = pending.batch;
  // The links move bytes between the GPU and the host only: a device-to-device batch (slot
  // pieces, issue 21) is not submitted through here, and the stats below have no D2D side.
  assert(b.direction != Direction::kDeviceToDevice && b.slot_pieces.empty());
  std::uint64_t bytes = b.pages.size() * config_.page_bytes;
  for (const SnapshotPieceCopy& p : b.pieces)
    bytes += piece_bytes(p, config_.page_bytes, config_.snapshot_bytes);
  const std::uint64_t copies = ceil_div(b.pages.size(), config_.slice_pages) +
                               ceil_div(b.pieces.size(), config_.slice_pages);
  const bool d2h = b.direction == Direction::kDeviceToHost;
  const std::size_t pages = b.pages.size(), snapshots = b.snapshots.size();
  const Direction direction = b.direction;
  pending.batch.stream = call_stream_;  // the request's stream, or the default (none)
  Result<Ticket> ticket = gpu_.link->submit(std::move(pending.batch));
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
  const std::uint32_t id = next_free_id(xfers_.next_copy, xfers_.copies);
  for (const CopyOp& op : pending.ops)
    (op.snapshot ? op.node->snap_xfer_id : op.node->kv_xfer_id) = id;
  InFlight& f =
      xfers_.copies.emplace(id, InFlight{std::move(*ticket), std::move(pending.ops), bytes, copies})
          .first->second;
  if (timing_) {
    f.timing = CopyTiming{d2h, bytes, static_cast<std::size_t>(copies), false, {}};
    f.started = std::chrono::steady_clock::now();
  }
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
        for (GpuPageId id : n->gpu.pages) gpu_.pages.give_back(id);
        set_pages<Tier::kGpu>(n, {});
      } else {
        for (HostPageId id : n->host.pages) host_.pages.give_back(id);
        set_pages<Tier::kHost>(n, {});
      }
      continue;
    }
    n->snap_xfer = Xfer::kNone;
    // Keys are made of the last use, so re-linking puts n back where it was.
    if (op.kind == Xfer::kPromote) {
      release(n->gpu.snapshot);
      set_snapshot<Tier::kGpu>(n, {});
    } else {
      for (HostPageId id : n->host.snapshot) host_.pages.give_back(id);
      set_snapshot<Tier::kHost>(n, {});
    }
  }
}

void PrefixCache::wait_transfer(std::uint32_t id) {
  auto it = xfers_.copies.find(id);
  if (it == xfers_.copies.end()) return;
  if (alloc_room_) {
    ++stats_.alloc_copy_waits;
    stats_.alloc_wait_bytes += it->second.bytes;
    stats_.alloc_wait_copies += it->second.copies;
  }
  ++stats_.host_waits;
  const TransferState state = it->second.ticket.wait();
  finish_transfer(id, state == TransferState::kDone);
}

bool PrefixCache::wait_any_transfer() {
  if (xfers_.copies.empty() && !xfers_.device.empty()) {
    // A materialization frees nothing but holds pages eviction may take once it lands.
    std::uint32_t oldest = xfers_.device.begin()->first;
    for (const auto& [id, c] : xfers_.device) oldest = std::min(oldest, id);
    if (alloc_room_) ++stats_.alloc_copy_waits;
    wait_device_copy(oldest);
    return true;
  }
  if (xfers_.copies.empty()) {
    // A store write in flight keeps its node's GPU copy off the GPU order (one copy at a
    // time): when only those are left, waiting for one makes its node evictable again.
    if (xfers_.store.empty()) {
      // Staged loads last: their chunks are nobody's source of room, but drain() ends them.
      if (xfers_.staged.empty()) return false;
      step_staged(xfers_.staged.begin()->first, true);
      return true;
    }
    std::uint32_t oldest = xfers_.store.begin()->first;
    for (const auto& [id, t] : xfers_.store) oldest = std::min(oldest, id);
    if (alloc_room_) {
      ++stats_.alloc_copy_waits;
      stats_.alloc_wait_bytes += xfers_.store.at(oldest).bytes;
    }
    finish_store_transfer(oldest);
    return true;
  }
  std::uint32_t oldest = xfers_.copies.begin()->first;
  for (const auto& [id, t] : xfers_.copies) oldest = std::min(oldest, id);
  wait_transfer(oldest);
  return true;
}

void PrefixCache::poll() {
  reap_store_transfers();  // first: a store read that arrived goes on to GPU
  reap_transfers();
  reap_staged();
  demote_ahead();  // made by no request: the engine's default stream
  store_ahead();
  restart_lossy_sinks();
}

void PrefixCache::reap_transfers() {
  // Device copies first: a materialization lands before the fills ordered after it, so a fill
  // reaped in the same pass finds its snapshot usable.
  reap_device_copies();
  if (!xfers_.copies.empty()) reap_gpu_host();
  submit_deferred_fills();  // a promotion a store read started may now order a fill
}

void PrefixCache::reap_gpu_host() {
  std::vector<std::pair<std::uint32_t, bool>> done;
  for (auto& [id, t] : xfers_.copies) {
    const TransferState s = t.ticket.poll();
    if (s != TransferState::kPending) done.emplace_back(id, s == TransferState::kDone);
  }
  std::sort(done.begin(), done.end());
  for (auto [id, ok] : done) finish_transfer(id, ok);
}

void PrefixCache::drain() {
  // GPU-host transfers, store transfers and staged loads alike (a store read that lands
  // starts a promotion).
  while (wait_any_transfer()) {
  }
}

void PrefixCache::finish_transfer(std::uint32_t id, bool ok) {
  auto handle = xfers_.copies.extract(id);
  if (handle.empty()) return;
  InFlight& t = handle.mapped();
  t.ticket.reset();
  if (!ok) ++stats_.transfers_failed;
  if (timing_ && t.started != std::chrono::steady_clock::time_point{}) {
    t.timing.ok = ok;
    t.timing.elapsed = std::chrono::steady_clock::now() - t.started;
    timing_->on_copy(t.timing);
  }
  finish_ops(t.ops, ok);
}

void PrefixCache::finish_ops(std::span<const CopyOp> ops, bool ok) {
  // A finished copy is not a use: the keys (made of the last use) put each node back in
  // its place.
  for (const CopyOp& op : ops) finish_op(op, ok);
  std::vector<Node*> nodes;
  for (const CopyOp& op : ops) nodes.push_back(op.node);
  prune_copied(std::move(nodes));
}

void PrefixCache::prune_copied(std::vector<Node*> nodes) {
  // Failed copies may leave empty leaves; prune them deepest first, skipping any node an
  // earlier prune already removed (a parent listed after its child).
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
    const std::size_t np = n->gpu.pages.size();
    if (op.kind == Xfer::kPromote) {
      if (ok) {
        for (GpuPageId id : n->gpu.pages) gpu_.pages.reassign(id, Holder::kNode);
        stats_.kv_pages_promoted += np;
        refresh(n);
      } else {
        // Rule 7: the destination is freed, nothing arrived; the intact host copy stays
        // (Host), so the request recomputes and the next admission can promote it again.
        for (GpuPageId id : n->gpu.pages) gpu_.pages.give_back(id);
        set_pages<Tier::kGpu>(n, {});
      }
      return;
    }
    if (ok) {
      for (HostPageId id : n->host.pages) host_.pages.reassign(id, Holder::kNode);
    } else {
      for (HostPageId id : n->host.pages) host_.pages.give_back(id);
      set_pages<Tier::kHost>(n, {});
      // The GPU copy is intact and stays; the round that evicts skips it (node.hpp).
      if (op.kind == Xfer::kDemote) n->kv_demote_failed = room_round_;
    }
    if (ok && op.kind == Xfer::kDemote && n->lock_count == 0) {
      // Done: the GPU copy is freed. A node locked meanwhile keeps its GPU copy.
      stats_.kv_pages_demoted += np;
      free_kv<Tier::kGpu>(n);
    }
    refresh(n);
    return;
  }
  assert(n->snap_xfer == op.kind);
  n->snap_xfer = Xfer::kNone;
  if (op.kind == Xfer::kPromote) {
    if (ok) {
      for (GpuPageId id : n->gpu.snapshot) gpu_.pages.reassign(id, Holder::kNode);
      ++stats_.snapshots_promoted;
      refresh(n);
    } else {  // as for KV: the host copy stays, the GPU slot is freed
      release(n->gpu.snapshot);
      set_snapshot<Tier::kGpu>(n, {});
    }
    return;
  }
  if (ok) {
    for (HostPageId id : n->host.snapshot) host_.pages.reassign(id, Holder::kNode);
    if (op.kind == Xfer::kDemote) ++stats_.snapshots_demoted;
  } else {
    for (HostPageId id : n->host.snapshot) host_.pages.give_back(id);
    set_snapshot<Tier::kHost>(n, {});
    if (op.kind == Xfer::kDemote) n->snap_demote_failed = room_round_;
  }
  if (ok && op.kind == Xfer::kDemote && n->snapshot_lock == 0) drop_snapshot<Tier::kGpu>(n);
  refresh(n);
}

}  // namespace radixtier
