// The device copies of PrefixCache (issue 33): a cached GPU snapshot into a request's live
// slot (the fill, rule 6) and a request's slot into fresh GPU pool pages (materialize, at
// insert). Both are submitted without waiting and reaped by poll() like the GPU-host batches
// (TransfersInFlight::device), so admit() and insert() never wait for them; and
// stream_wait(), which orders a caller's stream after what its lock's prefix has in flight.
#include <algorithm>
#include <cassert>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

// ---------------------------------------------------------------------------------------
// submitting, reaping, waiting

Result<std::uint32_t> PrefixCache::submit_device(TransferBatch batch, DeviceCopy copy) {
  std::uint64_t bytes = 0;
  for (const SlotPieceCopy& p : batch.slot_pieces)
    bytes += piece_bytes(p, config_.page_bytes, config_.snapshot_bytes);
  batch.stream = call_stream_;
  Result<Ticket> ticket = gpu_.link->submit(std::move(batch));
  if (!ticket) {
    ++stats_.transfers_failed;
    return Status(ErrorCode::kTransferFailed,
                  "the transfer engine refused a device copy: " + ticket.status().message());
  }
  stats_.bytes_d2d += bytes;
  const std::uint32_t id = next_free_id(xfers_.next_device, xfers_.device);
  copy.ticket = std::move(*ticket);
  copy.bytes = bytes;
  xfers_.device.emplace(id, std::move(copy));
  return id;
}

void PrefixCache::reap_device_copies() {
  if (xfers_.device.empty()) return;
  std::vector<std::pair<std::uint32_t, bool>> done;
  for (auto& [id, c] : xfers_.device) {
    const TransferState s = c.ticket.poll();
    if (s != TransferState::kPending) done.emplace_back(id, s == TransferState::kDone);
  }
  // Submission order: a materialization before the fills after it, each of which is reaped
  // only once its snapshot's copy was (checked now, after the earlier ones finished).
  std::sort(done.begin(), done.end());
  for (auto [id, ok] : done) {
    auto it = xfers_.device.find(id);
    if (it != xfers_.device.end() && !arrival_pending(it->second)) finish_device_copy(id, ok);
  }
}

bool PrefixCache::arrival_pending(const DeviceCopy& c) const {
  return c.kind == DeviceCopy::Kind::kFill && c.arrival != Xfer::kNone &&
         c.node->snap_xfer == c.arrival && c.node->snap_xfer_id == c.arrival_id;
}

void PrefixCache::fail_fills_after(const Node* n, Xfer arrival, std::uint32_t arrival_id) {
  for (auto& [id, c] : xfers_.device) {
    if (c.kind == DeviceCopy::Kind::kFill && c.node == n && c.arrival == arrival &&
        c.arrival_id == arrival_id)
      c.source_failed = true;
  }
}

void PrefixCache::wait_device_copy(std::uint32_t id, bool write_through_now) {
  auto it = xfers_.device.find(id);
  if (it == xfers_.device.end()) return;
  ++stats_.host_waits;
  const TransferState s = it->second.ticket.wait();
  if (arrival_pending(it->second)) {
    // It landed, so the copy it ran after has too: reap that one first (its outcome decides).
    const DeviceCopy& c = it->second;
    if (c.arrival == Xfer::kPromote) {
      wait_transfer(c.arrival_id);
    } else {
      wait_device_copy(c.arrival_id);
    }
    it = xfers_.device.find(id);
    if (it == xfers_.device.end()) return;
  }
  finish_device_copy(id, s == TransferState::kDone, write_through_now);
}

void PrefixCache::finish_device_copy(std::uint32_t id, bool ok, bool write_through_now) {
  auto handle = xfers_.device.extract(id);
  if (handle.empty()) return;
  DeviceCopy& c = handle.mapped();
  c.ticket.reset();
  if (!ok) ++stats_.transfers_failed;
  Node* n = c.node;
  if (c.kind == DeviceCopy::Kind::kMaterialize) {
    assert(n->snap_xfer == Xfer::kMaterialize && n->snap_xfer_id == id);
    n->snap_xfer = Xfer::kNone;
    gpu_.slots.give_back(c.slot);  // rule 5: the source slot was the copy's until now
    if (ok) {
      for (GpuPageId p : n->gpu.snapshot) gpu_.pages.reassign(p, Holder::kNode);
      refresh(n);
      if (!n->has_kv()) {
        // Its KV left meanwhile (unlocked, evicted): a snapshot without KV is never resumed
        // from; an empty leaf leaves the tree with it.
        remove_if_empty(n);
        return;
      }
      // Write-through: the host copy reads the pages this copy wrote, so it starts now (while
      // its KV is on GPU, as insert would have: a snapshot whose KV left the GPU goes first).
      if (write_through_now && config_.write_policy == WritePolicy::kWriteThrough &&
          n->gpu.has_kv()) {
        write_through({}, n);
        // Making host room for it may have dropped n's own host KV: an empty leaf leaves.
        remove_if_empty(n);
      }
    } else {
      // Rule 7: nothing usable arrived; the node has no GPU snapshot (its fills fail with it).
      fail_fills_after(n, Xfer::kMaterialize, id);
      release(n->gpu.snapshot);
      set_snapshot<Tier::kGpu>(n, {});
      remove_if_empty(n);
    }
    return;
  }
  LockRecord* rec =
      c.lock.valid() && requests_.find(c.lock) != nullptr ? &requests_.at(c.lock) : nullptr;
  if (rec == nullptr || rec->fill_xfer != id) {
    // The request released its lock while its fill was in flight: the slot and the
    // snapshot lock were the copy's; both go now.
    gpu_.slots.give_back(c.slot);
    --n->snapshot_lock;
    refresh(n);
    remove_if_empty(n);
    return;
  }
  rec->fill_xfer = 0;
  ok = ok && !c.source_failed;
  if (ok) {
    // The request has its copy: the cached one need not stay on GPU for it any more.
    rec->filled = n;
    --n->snapshot_lock;
    refresh(n);
  } else {
    rec->fill_failed = true;  // wait() resumes the request (the lock moves there, not here)
  }
}

void PrefixCache::settle_device_copies(bool slot_holders) {
  reap_device_copies();
  std::vector<std::uint32_t> ids;
  for (const auto& [id, c] : xfers_.device) {
    const bool holds_slot = c.kind == DeviceCopy::Kind::kMaterialize || !c.lock.valid();
    if (c.kind == DeviceCopy::Kind::kMaterialize || (slot_holders && holds_slot)) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (std::uint32_t id : ids) {
    if (alloc_room_) ++stats_.alloc_copy_waits;
    wait_device_copy(id);
  }
}

std::optional<TicketId> PrefixCache::snapshot_arrival(const Node* n) const {
  if (n->snap_xfer == Xfer::kPromote) return xfers_.copies.at(n->snap_xfer_id).ticket.id();
  if (n->snap_xfer == Xfer::kMaterialize) return xfers_.device.at(n->snap_xfer_id).ticket.id();
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// the fill (rule 6)

void PrefixCache::submit_fill(LockId id, LockRecord& rec) {
  Node* n = rec.snap_node;
  if (!rec.holds_snapshot() || rec.fill_xfer != 0 || rec.fill_failed) return;
  assert(rec.live.valid());
  const std::optional<TicketId> after = snapshot_arrival(n);
  // Deferred, and tried again at every reap: a snapshot still on its way from the store
  // (kLoad, kStage: its promotion has no ticket yet), or lost for now (a promotion that
  // failed: wait() resumes earlier), which another admission may promote again before this
  // request calls wait() (its fill then orders after that promotion; before, nothing ever
  // filled the slot and wait() never ended).
  if ((n->snap_to_gpu() && !after) || !n->gpu.has_snapshot()) {
    if (std::find(deferred_fills_.begin(), deferred_fills_.end(), id) == deferred_fills_.end())
      deferred_fills_.push_back(id);
    return;
  }
  TransferBatch fill;
  fill.direction = Direction::kDeviceToDevice;
  for (std::size_t i = 0; i < n->gpu.snapshot.size(); ++i)
    fill.slot_pieces.push_back({rec.live, i * config_.page_bytes, n->gpu.snapshot[i], true});
  if (after) fill.after.push_back(*after);
  DeviceCopy copy;
  copy.kind = DeviceCopy::Kind::kFill;
  if (after) {
    copy.arrival = n->snap_xfer;
    copy.arrival_id = n->snap_xfer_id;
  }
  copy.node = n;
  copy.slot = rec.live;
  copy.lock = id;
  StreamScope scope(this, rec.stream);
  Result<std::uint32_t> xid = submit_device(std::move(fill), std::move(copy));
  if (!xid) {
    rec.fill_failed = true;  // refused: nothing moved; wait() resumes from the root
    return;
  }
  rec.fill_xfer = *xid;
  // An engine that finished at submit (the simulator's): reaped now, no wait.
  DeviceCopy& c = xfers_.device.at(*xid);
  if (!arrival_pending(c) && c.ticket.poll() != TransferState::kPending)
    finish_device_copy(*xid, c.ticket.poll() == TransferState::kDone);
}

void PrefixCache::submit_deferred_fills() {
  if (deferred_fills_.empty()) return;
  std::vector<LockId> ids;
  ids.swap(deferred_fills_);
  for (LockId id : ids) {
    if (requests_.find(id) != nullptr) submit_fill(id, requests_.at(id));
  }
}

void PrefixCache::fill_failed_to_root(LockRecord& rec) {
  // The fill failed with its source intact: nothing usable was handed out; the request
  // resumes from the root (rule 7).
  Node* const n = rec.snap_node;
  assert(n != nullptr && rec.fill_xfer == 0 && rec.holds_snapshot());
  rec.fill_failed = false;
  if (rec.live.valid()) give_back_slot(rec, rec.live);
  Node* const old_node = rec.node;
  lock_path(rec.root);
  --n->snapshot_lock;
  refresh(n);
  unlock_path(old_node);
  rec.node = rec.root;
  rec.snap_node = nullptr;
  remove_if_empty(old_node);
}

// ---------------------------------------------------------------------------------------
// materialize (insert)

bool PrefixCache::materialize(Node* n, GpuSlotId slot, StreamHandle stream) {
  assert(!n->gpu.has_snapshot());
  const std::size_t need = config_.snapshot_pages();
  if (need == 0 || !make_gpu_page_room(need)) return false;
  // One copy of a snapshot at a time: a store write of n's host copy (started before, or by
  // the room just made) lands first; it is the only copy a node without a GPU snapshot has.
  if (n->snap_xfer == Xfer::kStore) wait_snapshot_copy(n);
  assert(n->snap_xfer == Xfer::kNone);
  std::vector<GpuPageId> pages = take_gpu_pages(need);  // Holder::kTransfer
  TransferBatch copy;
  copy.direction = Direction::kDeviceToDevice;
  for (std::size_t i = 0; i < need; ++i)
    copy.slot_pieces.push_back({slot, i * config_.page_bytes, pages[i], false});
  DeviceCopy c;
  c.kind = DeviceCopy::Kind::kMaterialize;
  c.node = n;
  c.slot = slot;
  StreamScope scope(this, stream);
  Result<std::uint32_t> id = submit_device(std::move(copy), std::move(c));
  if (!id) {
    release(pages);
    return false;
  }
  // Arriving: not evictable, not usable without the copy's ticket (an admission orders its
  // fill after it); the slot is the copy's until it lands (rule 5).
  n->snap_xfer = Xfer::kMaterialize;
  n->snap_xfer_id = *id;
  set_snapshot<Tier::kGpu>(n, std::move(pages));
  DeviceCopy& d = xfers_.device.at(*id);
  // Landed already: insert's own write-through (apply_insert) takes the snapshot along.
  if (d.ticket.poll() != TransferState::kPending)
    finish_device_copy(*id, d.ticket.poll() == TransferState::kDone, false);
  return true;
}

// ---------------------------------------------------------------------------------------
// stream_wait

Status PrefixCache::stream_wait(LockId lock, StreamHandle stream,
                                std::optional<std::uint32_t> layer) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  LockRecord& rec = requests_.at(lock);
  StreamScope scope(this, rec.stream);
  reap_transfers();
  reap_store_transfers();
  reap_staged();
  submit_deferred_fills();
  if (lock_state(rec) == TransferState::kFailed) {
    return Status(ErrorCode::kTransferFailed,
                  "stream_wait: a copy of the resumed prefix failed; call wait()");
  }
  rec.stream_waited = true;
  if (rec.snap_node == nullptr) return Status::ok();
  // Copies through host first (a store read, a staged load): the device cannot wait for a
  // read the host has not finished, so the host waits for the read; the promotion that
  // follows it is waited for on the stream below.
  bool store_waits = false;
  for (Node* n = rec.snap_node; !n->is_root(); n = n->parent) {
    if (n->kv_xfer == Xfer::kLoad || n->kv_xfer == Xfer::kStage) {
      store_waits = true;
      wait_kv_copy(n);
    }
  }
  const Xfer snap = rec.snap_node->snap_xfer;
  if (snap == Xfer::kLoad || snap == Xfer::kStage) {
    store_waits = true;
    wait_snapshot_copy(rec.snap_node);
  }
  if (store_waits) {
    reap_transfers();
    submit_deferred_fills();
    if (lock_state(rec) == TransferState::kFailed) {
      return Status(ErrorCode::kTransferFailed,
                    "stream_wait: a store read of the resumed prefix failed; call wait()");
    }
  }
  // The engine tickets to order the stream after: the KV promotions (per batch: a batch may
  // hold several nodes), the snapshot's arrival and the fill.
  std::vector<std::pair<TicketId, bool>> tickets;  // (ticket, whole)
  auto add = [&](TicketId t, bool whole) {
    for (auto& [id, w] : tickets) {
      if (id == t) {
        w = w || whole;
        return;
      }
    }
    tickets.emplace_back(t, whole);
  };
  for (const Node* n = rec.snap_node; !n->is_root(); n = n->parent) {
    if (n->kv_xfer == Xfer::kPromote) add(xfers_.copies.at(n->kv_xfer_id).ticket.id(), false);
  }
  if (rec.filled != rec.snap_node) {
    if (rec.fill_xfer != 0) {
      add(xfers_.device.at(rec.fill_xfer).ticket.id(), true);  // ordered after the snapshot
    } else if (std::optional<TicketId> t = snapshot_arrival(rec.snap_node)) {
      add(*t, true);
    }
  }
  for (const auto& [t, whole] : tickets) {
    if (!gpu_.link->waits_on_device()) ++stats_.host_waits;
    Status s = gpu_.link->stream_wait(t, stream, whole ? std::optional<std::uint32_t>() : layer);
    if (!s) return Status(s.code(), "stream_wait: " + s.message() + "; call wait()");
  }
  return Status::ok();
}

}  // namespace radixtier
