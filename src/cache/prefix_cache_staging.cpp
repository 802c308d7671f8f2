// Loading a store match at admission (node.hpp, "The store tier"; docs/architecture.md,
// "Staged loads"): whole through host when host has room for all of it (the host copy
// stays), else staged: store -> a window of a few host staging pages -> the GPU pages taken
// at admission, a chunk at a time, so any host pool that holds a few chunks (and one
// snapshot) serves any match. poll() advances a staged load without blocking; wait() of its
// lock finishes it. A chunk that fails ends the load shallower, as a failed copy does
// (rule 7): what landed is kept, the rest is freed, nothing deeper is read.
#include <algorithm>
#include <cassert>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {

/// KV chunks a staged load keeps in flight when the host has room for them: reads of some
/// overlap the copies to GPU of others.
constexpr std::size_t kStageChunks = 4;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

/// The node of the load's flat KV page p.
std::size_t node_of(const std::vector<std::size_t>& first_page, std::size_t p) {
  return static_cast<std::size_t>(std::upper_bound(first_page.begin(), first_page.end(), p) -
                                  first_page.begin() - 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// admission: whole or staged

Status PrefixCache::load_from_store(Node* target, std::span<Node* const> path,
                                    std::size_t* store_tokens) {
  *store_tokens = 0;
  std::size_t load_pages = 0;
  for (Node* n : path) {
    if (n->gpu.has_kv() || n->host.has_kv()) continue;
    load_pages += n->page_count(config_.page_size);
    *store_tokens += n->tokens.size();
  }
  const bool load_snapshot = !target->gpu.has_snapshot() && !target->host.has_snapshot();
  if (load_pages == 0 && !load_snapshot) return Status::ok();
  // Whole: host pages for all of it are taken now, as the reads' destinations and the
  // promotions' sources (the GPU pages were made room for by the caller).
  StoreBatch load = up_batch<Tier::kHost>();
  bool whole = load_pages == 0 || make_host_page_room(load_pages);
  if (whole) {
    for (Node* n : path) {
      if (!n->gpu.has_kv() && !n->host.has_kv()) (void)plan_up<Tier::kHost>(n, Held::kKv, load);
    }
  }
  if (whole && load_snapshot && !plan_up<Tier::kHost>(target, Held::kSnapshot, load)) {
    cancel_store_ops(load.ops);  // the nodes are store-only again
    load = StoreBatch();
    whole = false;
  }
  if (!whole) return start_staged_load(target, path);
  // Refused: the loads are cancelled (the nodes are store-only again).
  if (Status s = submit_link<Tier::kHost>(std::move(load)); !s) {
    return Status(ErrorCode::kFailedPrecondition, "admit: " + s.message());
  }
  return Status::ok();
}

std::size_t PrefixCache::staging_room() const {
  const std::size_t free = host_.pages.free_count();
  if (shared_host_) return free;
  const std::size_t held = host_.kv_held + xfers_.staging_pages;
  return std::min(free, config_.host_pages - std::min<std::size_t>(config_.host_pages, held));
}

Status PrefixCache::start_staged_load(Node* target, std::span<Node* const> path) {
  StagedLoad load;
  std::size_t total = 0;
  for (Node* n : path) {
    if (n->gpu.has_kv() || n->host.has_kv()) continue;
    load.nodes.push_back(n);
    load.first_page.push_back(total);
    total += n->page_count(config_.page_size);
  }
  load.first_page.push_back(total);
  load.cut = total;
  const bool snapshot = !target->gpu.has_snapshot() && !target->host.has_snapshot();
  // The window: kStageChunks slices of KV (all of it when less) and the snapshot, which is one
  // record read whole; else what host can give, at least one page and the snapshot.
  const std::size_t snap = snapshot ? config_.snapshot_pages() : 0;
  const std::size_t least = std::max<std::size_t>(total > 0 ? 1 : 0, snap);
  const std::size_t share = shared_host_ ? host_.pages.capacity() : config_.host_pages;
  std::size_t window =
      std::min(std::min<std::size_t>(total, kStageChunks * config_.slice_pages) + snap, share);
  // Evicting everything evictable did not make the room: what is free now is the most.
  if (!make_host_page_room(window)) window = std::min(window, staging_room());
  if (window < least || !make_host_page_room(window)) {
    ++stats_.store_load_misses;
    return out_of_memory("admit: no host room to stage the store match through (" +
                         std::to_string(least) + " pages needed, " + std::to_string(window) +
                         " to be had)");
  }
  // Two chunks at least, so that one is read while the other is copied to GPU.
  load.chunk_pages =
      std::max<std::size_t>(1, std::min<std::size_t>(config_.slice_pages, window / 2));
  load.window = window;
  for (std::size_t i = 0; i < window; ++i)
    load.idle.push_back(*host_.pages.take(Holder::kTransfer));
  xfers_.staging_pages += window;
  note_host_usage();
  const std::uint32_t id = next_free_id(xfers_.next_staged, xfers_.staged);
  // The GPU destinations (made room for by the caller) are the load's until their pages land.
  load.landed.assign(load.nodes.size(), 0);
  for (Node* n : load.nodes) {
    std::vector<GpuPageId> gpu;
    for (std::size_t i = 0; i < n->page_count(config_.page_size); ++i)
      gpu.push_back(*gpu_.pages.take(Holder::kTransfer));
    n->kv_xfer = Xfer::kStage;
    n->kv_xfer_id = id;
    set_pages<Tier::kGpu>(n, std::move(gpu));
  }
  if (snapshot) {
    load.target = target;
    target->snap_xfer = Xfer::kStage;
    target->snap_xfer_id = id;
    set_snapshot<Tier::kGpu>(target, take_gpu_pages(config_.snapshot_pages()));
  }
  StagedLoad& l = xfers_.staged.emplace(id, std::move(load)).first->second;
  const Status refused = pump_staged(l);
  if (l.chunks.empty()) {
    // The store refused the first reads: nothing started, the path is as it was.
    end_staged_load(id);
    return Status(ErrorCode::kFailedPrecondition, "admit: " + refused.message());
  }
  ++stats_.staged_loads;
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// chunks

Status PrefixCache::pump_staged(StagedLoad& l) {
  Status refused;
  auto take_idle = [&](std::size_t n) {
    const auto from = l.idle.end() - static_cast<std::ptrdiff_t>(n);
    std::vector<HostPageId> pages(from, l.idle.end());
    l.idle.erase(from, l.idle.end());
    return pages;
  };
  // The snapshot first: it needs snapshot_pages() staging pages at once.
  const std::size_t snap = config_.snapshot_pages();
  if (l.target != nullptr && !l.snapshot_read && l.idle.size() >= snap) {
    l.snapshot_read = true;
    StagedChunk c;
    c.staging = take_idle(snap);
    c.records = {l.target->store.snapshot};
    // Refused: no KV is read either, so that an admission whose first reads the store refuses
    // starts nothing and falls back (start_staged_load).
    if (Status s = submit_staged_read(l, std::move(c)); !s) return s;
  }
  // Then the KV, root first, down to the first node that failed.
  while (l.next < l.cut) {
    const std::size_t n = std::min(l.chunk_pages, l.cut - l.next);
    if (l.idle.size() < n) break;
    StagedChunk c;
    c.first = l.next;
    c.count = n;
    c.staging = take_idle(n);
    for (std::size_t p = c.first; p < c.first + n; ++p) {
      const std::size_t k = node_of(l.first_page, p);
      c.records.push_back(l.nodes[k]->store.pages[p - l.first_page[k]]);
    }
    l.next += n;
    if (Status s = submit_staged_read(l, std::move(c)); !s) refused = s;
  }
  return refused;
}

Status PrefixCache::submit_staged_read(StagedLoad& l, StagedChunk c) {
  std::vector<StoreRead> reads;
  if (c.count == 0) {
    reads.push_back({c.records[0], c.staging});
  } else {
    for (std::size_t i = 0; i < c.count; ++i) reads.push_back({c.records[i], {c.staging[i]}});
  }
  const std::size_t items = reads.size();
  Result<std::uint64_t> ticket = host_.link->submit_reads(std::move(reads));
  if (!ticket) {
    // Nothing was read: the chunk fails as a whole (the records stay).
    ++stats_.store_failures;
    l.idle.insert(l.idle.end(), c.staging.begin(), c.staging.end());
    if (c.count == 0) {
      Node* t = l.target;
      l.target = nullptr;
      release(t->gpu.snapshot);
      t->snap_xfer = Xfer::kNone;
      set_snapshot<Tier::kGpu>(t, {});
      prune_copied({t});
    } else {
      l.cut = std::min(l.cut, l.first_page[node_of(l.first_page, c.first)]);
    }
    return Status(ticket.status().code(), "the store refused reads of " + std::to_string(items) +
                                              " records: " + ticket.status().message());
  }
  stats_.bytes_from_store +=
      c.count == 0 ? config_.snapshot_bytes : std::uint64_t{c.count} * config_.page_bytes;
  stats_.store_reads += items;
  c.read = *ticket;
  l.chunks.push_back(std::move(c));
  return Status::ok();
}

bool PrefixCache::finish_staged_read(StagedLoad& l, StagedChunk& c) {
  const std::vector<Status> items = host_.link->finish_reads(c.read);
  c.reading = false;
  const std::size_t n = c.records.size();
  std::size_t arrived = 0;  // the items before the first that failed
  while (arrived < n && arrived < items.size() && items[arrived].is_ok()) ++arrived;
  if (arrived < n) ++stats_.store_failures;
  TransferBatch batch;
  batch.direction = Direction::kHostToDevice;
  if (c.count == 0) {
    Node* t = l.target;
    if (arrived == 1) {
      ++stats_.snapshots_loaded;
      for (std::size_t i = 0; i < c.staging.size(); ++i) {
        batch.pages.push_back({t->gpu.snapshot[i], c.staging[i]});
      }
      return submit_staged_copy(l, c, std::move(batch));
    }
    // Rule 7: nothing arrived; the slot is freed. kDataLoss: the store erased the record.
    if (!items.empty() && items[0].code() == ErrorCode::kDataLoss) {
      ++stats_.store_records_lost;
      set_snapshot<Tier::kStore>(t, RecordId());
    }
    l.target = nullptr;
    release(t->gpu.snapshot);
    t->snap_xfer = Xfer::kNone;
    set_snapshot<Tier::kGpu>(t, {});
    l.idle.insert(l.idle.end(), c.staging.begin(), c.staging.end());
    c.staging.clear();
    prune_copied({t});
    return false;
  }
  // A record that failed its check was erased by the store; the rest of its node goes too
  // (as a whole load does), once no chunk reads them any more (end_staged_load).
  std::vector<RecordId> lost;
  for (std::size_t i = 0; i < std::min(n, items.size()); ++i) {
    if (items[i].code() != ErrorCode::kDataLoss) continue;
    lost.push_back(c.records[i]);
    Node* m = l.nodes[node_of(l.first_page, c.first + i)];
    if (!m->store.has_kv()) continue;
    stats_.store_records_lost += m->store.pages.size();
    l.to_erase.insert(l.to_erase.end(), m->store.pages.begin(), m->store.pages.end());
    set_pages<Tier::kStore>(m, {});
  }
  std::erase_if(l.to_erase,
                [&](RecordId r) { return std::find(lost.begin(), lost.end(), r) != lost.end(); });
  if (arrived < n) l.cut = std::min(l.cut, l.first_page[node_of(l.first_page, c.first + arrived)]);
  // What arrived above the first node that failed goes on to GPU.
  c.copied = l.cut > c.first ? std::min(c.count, l.cut - c.first) : 0;
  stats_.kv_pages_loaded += c.copied;
  for (std::size_t i = 0; i < c.copied; ++i) {
    const std::size_t p = c.first + i;
    const std::size_t k = node_of(l.first_page, p);
    batch.pages.push_back({l.nodes[k]->gpu.pages[p - l.first_page[k]], c.staging[i]});
  }
  if (c.copied == 0) {
    l.idle.insert(l.idle.end(), c.staging.begin(), c.staging.end());
    c.staging.clear();
    return false;
  }
  return submit_staged_copy(l, c, std::move(batch));
}

bool PrefixCache::submit_staged_copy(StagedLoad& l, StagedChunk& c, TransferBatch batch) {
  std::uint64_t bytes = std::uint64_t{batch.pages.size()} * config_.page_bytes;
  for (const SnapshotPieceCopy& p : batch.pieces)
    bytes += piece_bytes(p, config_.page_bytes, config_.snapshot_bytes);
  const std::uint64_t slices = ceil_div(batch.pages.size(), config_.slice_pages) +
                               ceil_div(batch.pieces.size(), config_.slice_pages);
  Result<Ticket> ticket = gpu_.link->submit(std::move(batch));
  if (!ticket) {
    // Refused: nothing moved; as a copy that failed.
    finish_staged_copy(l, c, false);
    return false;
  }
  stats_.bytes_h2d += bytes;
  stats_.copies_h2d += slices;
  c.copy = std::move(*ticket);
  c.copy_bytes = bytes;
  c.copy_slices = slices;
  if (timing_) c.started = std::chrono::steady_clock::now();
  return true;
}

void PrefixCache::finish_staged_copy(StagedLoad& l, StagedChunk& c, bool ok) {
  c.copy.reset();
  if (!ok) ++stats_.transfers_failed;
  if (timing_ && c.started != std::chrono::steady_clock::time_point{}) {
    timing_->on_copy(CopyTiming{false, c.copy_bytes, static_cast<std::size_t>(c.copy_slices), ok,
                                std::chrono::steady_clock::now() - c.started});
  }
  l.idle.insert(l.idle.end(), c.staging.begin(), c.staging.end());
  c.staging.clear();
  if (c.count == 0) {
    Node* t = l.target;
    l.target = nullptr;
    t->snap_xfer = Xfer::kNone;
    if (ok) {
      for (GpuPageId id : t->gpu.snapshot) gpu_.pages.reassign(id, Holder::kNode);
      ++stats_.snapshots_promoted;
      refresh(t);
    } else {  // the store copy stays, the slot is freed (rule 7)
      release(t->gpu.snapshot);
      set_snapshot<Tier::kGpu>(t, {});
      prune_copied({t});
    }
    return;
  }
  if (!ok) {
    // The destinations hold garbage: the nodes from the chunk's first on do not land.
    l.cut = std::min(l.cut, l.first_page[node_of(l.first_page, c.first)]);
    return;
  }
  stats_.kv_pages_promoted += c.copied;
  for (std::size_t i = 0; i < c.copied; ++i) {
    const std::size_t k = node_of(l.first_page, c.first + i);
    if (++l.landed[k] < l.first_page[k + 1] - l.first_page[k]) continue;
    // Every page of the node is on GPU: Gpu + Store (no host copy was kept).
    Node* m = l.nodes[k];
    l.nodes[k] = nullptr;  // it may leave the tree from now on: the load forgets it
    for (GpuPageId id : m->gpu.pages) gpu_.pages.reassign(id, Holder::kNode);
    m->kv_xfer = Xfer::kNone;
    refresh(m);
  }
}

// ---------------------------------------------------------------------------------------
// progress: poll(), wait()

bool PrefixCache::advance_staged_chunk(StagedLoad& l, StagedChunk& c, bool block) {
  if (c.reading) {
    if (!block && !host_.link->ready(c.read)) return false;
    if (!finish_staged_read(l, c)) return true;  // nothing to copy
  }
  const TransferState s = block ? c.copy.wait() : c.copy.poll();
  if (s == TransferState::kPending) return false;
  finish_staged_copy(l, c, s == TransferState::kDone);
  return true;
}

void PrefixCache::step_staged(std::uint32_t id, bool block) {
  auto it = xfers_.staged.find(id);
  if (it == xfers_.staged.end()) return;
  StagedLoad& l = it->second;
  if (block && !l.chunks.empty() && advance_staged_chunk(l, l.chunks.front(), true)) {
    l.chunks.pop_front();
  }
  // Reap what finished and start what the freed staging pages allow, until nothing moves
  // (an engine that finishes at submit runs the whole load here).
  for (bool moved = true; moved;) {
    moved = false;
    for (auto c = l.chunks.begin(); c != l.chunks.end();) {
      if (advance_staged_chunk(l, *c, false)) {
        c = l.chunks.erase(c);
        moved = true;
      } else {
        ++c;
      }
    }
    const std::size_t before = l.chunks.size();
    (void)pump_staged(l);  // a refusal ends the load shallower, as a failed read
    moved |= l.chunks.size() != before;
  }
  if (l.chunks.empty()) end_staged_load(id);
}

void PrefixCache::end_staged_load(std::uint32_t id) {
  auto handle = xfers_.staged.extract(id);
  if (handle.empty()) return;
  StagedLoad& l = handle.mapped();
  assert(l.chunks.empty() && l.idle.size() == l.window);
  // What did not land (a chunk failed, or nothing below it was read): the destinations are
  // freed and the store copy stays, unless its read failed its check (rule 7).
  std::vector<Node*> left;
  for (Node* n : l.nodes) {
    if (n == nullptr) continue;
    assert(n->kv_xfer == Xfer::kStage);
    n->kv_xfer = Xfer::kNone;
    for (GpuPageId p : n->gpu.pages) gpu_.pages.give_back(p);
    set_pages<Tier::kGpu>(n, {});
    left.push_back(n);
  }
  if (Node* t = l.target) {  // its read never started (not expected: it goes first)
    t->snap_xfer = Xfer::kNone;
    release(t->gpu.snapshot);
    set_snapshot<Tier::kGpu>(t, {});
    left.push_back(t);
  }
  for (HostPageId p : l.idle) host_.pages.give_back(p);
  xfers_.staging_pages -= l.window;
  for (RecordId r : l.to_erase) (void)host_.link->erase(r);
  prune_copied(std::move(left));
}

void PrefixCache::reap_staged() {
  if (xfers_.staged.empty()) return;
  std::vector<std::uint32_t> ids;
  for (const auto& [id, l] : xfers_.staged) ids.push_back(id);
  for (std::uint32_t id : ids) step_staged(id, false);
}

void PrefixCache::wait_staged(std::uint32_t id) {
  // Each blocking step finishes the load's oldest chunk at least.
  while (xfers_.staged.count(id) != 0) step_staged(id, true);
}

std::size_t PrefixCache::staged_chunks() const {
  std::size_t n = 0;
  for (const auto& [id, l] : xfers_.staged) n += l.chunks.size();
  return n;
}

}  // namespace radixtier
