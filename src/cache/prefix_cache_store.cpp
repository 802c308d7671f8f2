// The store tier of PrefixCache: the row below host (node.hpp, "The store tier"): host ->
// store demotion when host needs room (on demand: submit and wait; ahead of need: the host
// watermark, never waiting), store -> host -> GPU at admission, the store's eviction order,
// rebuilding the tree from the store's records at create(), and persist().
#include <algorithm>
#include <cassert>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/transfer/store_rebuild.hpp"

namespace radixtier {

// ---------------------------------------------------------------------------------------
// create() with a store: the tree comes back from the records

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(const CacheConfig& config,
                                                         TransferEngine& engine,
                                                         StoreEngine* store) {
  if (store == nullptr) return create(config, engine);
  const StoreGeometry g = store->geometry();
  auto differs = [](const char* what, std::uint64_t mine, std::uint64_t theirs) {
    return invalid_argument(std::string("the store was made for ") + what + " " +
                            std::to_string(theirs) + ", the config has " + std::to_string(mine));
  };
  if (g.page_tokens != config.page_size)
    return differs("page_size", config.page_size, g.page_tokens);
  if (g.page_bytes != config.page_bytes)
    return differs("page_bytes", config.page_bytes, g.page_bytes);
  if (g.snapshot_bytes != config.snapshot_bytes)
    return differs("snapshot_bytes", config.snapshot_bytes, g.snapshot_bytes);
  auto made = create(config, engine);
  if (!made) return made;
  std::unique_ptr<PrefixCache> cache = std::move(made).value();
  cache->host_.link = store;
  if (Status s = cache->restore_from_store(); !s) return s;
  return cache;
}

Status PrefixCache::restore_from_store() {
  const std::vector<StoredRecord> records = host_.link->records();
  const RebuiltPaths paths = rebuild_paths(records, config_.page_size);
  // What can never be part of a usable match goes (rebuild.hpp): orphans and duplicates.
  for (const auto* list : {&paths.orphan_pages, &paths.orphan_snapshots, &paths.duplicate_pages}) {
    for (RecordId id : *list) (void)host_.link->erase(id);
  }
  // Chains of pages without a branch or a snapshot between them become one node, as an
  // insert of those tokens would have made it. Pass 1 groups pages into nodes (parents
  // first: pages come parents first), pass 2 makes the nodes.
  const std::size_t np = paths.pages.size();
  std::vector<std::uint32_t> children(np, 0);
  for (const RebuiltPage& p : paths.pages) {
    if (p.parent >= 0) ++children[static_cast<std::size_t>(p.parent)];
  }
  struct Group {
    std::int64_t parent_group;
    std::vector<Token> tokens;
    std::vector<RecordId> records;
    RecordId snapshot;
    PathHash end;
  };
  std::vector<Group> groups;
  std::vector<std::size_t> group_of(np, 0);
  for (std::size_t i = 0; i < np; ++i) {
    const RebuiltPage& p = paths.pages[i];
    const auto parent = static_cast<std::size_t>(p.parent);
    const bool extends =
        p.parent >= 0 && children[parent] == 1 && paths.pages[parent].snapshots.empty();
    if (extends) {
      group_of[i] = group_of[parent];
    } else {
      group_of[i] = groups.size();
      groups.push_back({p.parent >= 0 ? std::int64_t(group_of[parent]) : -1, {}, {}, {}, {}});
    }
    Group& g = groups[group_of[i]];
    g.tokens.insert(g.tokens.end(), p.tokens.begin(), p.tokens.end());
    g.records.push_back(p.record);
    g.end = p.path;
    for (std::size_t k = 0; k < p.snapshots.size(); ++k) {
      if (k == 0) {
        g.snapshot = p.snapshots[0];
      } else {
        (void)host_.link->erase(p.snapshots[k]);  // a second snapshot of the same boundary
      }
    }
  }
  std::vector<Node*> nodes(groups.size(), nullptr);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    Node* parent =
        g.parent_group < 0 ? tree_.root() : nodes[static_cast<std::size_t>(g.parent_group)];
    Node* n = tree_.new_node(parent, g.tokens);
    n->end_path = g.end;
    n->end_path_known = true;
    stats_.restored_kv_pages += g.records.size();
    set_pages<Tier::kStore>(n, std::move(g.records));
    if (g.snapshot.valid()) {
      set_snapshot<Tier::kStore>(n, g.snapshot);
      ++stats_.restored_snapshots;
    }
    nodes[i] = n;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// path hashes and namespaces

PathHash PrefixCache::end_path(Node* n) {
  if (n->is_root()) return PathHash::root();
  if (n->end_path_known) return n->end_path;
  std::vector<Node*> chain;  // n and its ancestors whose hash is not known yet
  for (Node* p = n; !p->is_root() && !p->end_path_known; p = p->parent) chain.push_back(p);
  PathHash h = chain.back()->parent->is_root() ? PathHash::root() : chain.back()->parent->end_path;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    Node* c = *it;
    for (std::size_t i = 0; i < c->tokens.size(); i += config_.page_size) {
      h = extend_path(h, std::span<const Token>(c->tokens).subspan(i, config_.page_size));
    }
    c->end_path = h;
    c->end_path_known = true;
  }
  return n->end_path;
}

bool PrefixCache::in_default_namespace(const Node* n) const {
  while (n->parent != nullptr) n = n->parent;
  return n == tree_.root();
}

bool PrefixCache::make_store_room(std::uint64_t slots) {
  const StoreGeometry g = host_.link->geometry();
  if (slots > g.capacity_slots) return false;
  while (host_.link->free_slots() < slots) {
    bool snapshot = false;
    Node* victim = tier<Tier::kStore>().victim(snapshot);
    if (victim == nullptr) return false;
    const Held h = snapshot ? Held::kSnapshot : Held::kKv;
    tier<Tier::kStore>().aged_by(h, *victim);
    drop_victim<Tier::kStore>(victim, h);  // the last tier: no copy below to make
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// planning copies

PrefixCache::StoreVerdict PrefixCache::plan_store_write(Node* n, bool snapshot, bool drop_host,
                                                        StoreBatch& batch) {
  if (host_.link == nullptr || !in_default_namespace(n)) return StoreVerdict::kNotStored;
  // Dead data is not worth a write: nothing resumes from it.
  if (snapshot ? !n->has_kv() : (cost_aware_ && !n->kv_live())) return StoreVerdict::kNotStored;
  const std::uint64_t slots =
      snapshot ? host_.link->geometry().snapshot_slots() : std::uint64_t{n->host.pages.size()};
  // Making store room may erase n's own other records: its store snapshot (n keeps the host
  // KV being written) or, for a snapshot write, its store KV, which could leave n without KV
  // and take it out of the tree; the snapshot lock keeps n while room is made.
  ++n->snapshot_lock;
  refresh(n);
  const bool room = make_store_room(batch.slots + slots);
  --n->snapshot_lock;
  refresh(n);
  if (!room || (snapshot && !n->has_kv())) return StoreVerdict::kNotStored;
  if (snapshot) {
    batch.writes.push_back({RecordDesc::snapshot(end_path(n), n->boundary), n->host.snapshot});
    n->snap_xfer = Xfer::kStore;
  } else {
    // One record per page: page i's parent is the path hash at the end of page i - 1.
    PathHash h = end_path(n->parent);
    std::size_t boundary = n->boundary - n->tokens.size();
    for (std::size_t i = 0; i < n->host.pages.size(); ++i) {
      const auto page =
          std::span<const Token>(n->tokens).subspan(i * config_.page_size, config_.page_size);
      boundary += config_.page_size;
      batch.writes.push_back(
          {RecordDesc::kv_page(h, boundary, std::vector<Token>(page.begin(), page.end())),
           {n->host.pages[i]}});
      batch.writes.back().desc.path = extend_path(h, page);
      h = batch.writes.back().desc.path;
    }
    n->kv_xfer = Xfer::kStore;
  }
  batch.slots += slots;
  batch.ops.push_back({n, snapshot, Xfer::kStore, drop_host});
  refresh(n);  // in flight: off the host order
  return StoreVerdict::kPlanned;
}

void PrefixCache::plan_kv_load(Node* n, StoreBatch& batch) {
  const std::size_t np = n->store.pages.size();
  std::vector<HostPageId> host;
  std::vector<GpuPageId> gpu;
  for (std::size_t i = 0; i < np; ++i) {
    host.push_back(*host_.pages.take(Holder::kTransfer));
    gpu.push_back(*gpu_.pages.take(Holder::kTransfer));
    batch.reads.push_back({n->store.pages[i], {host.back()}});
  }
  n->kv_xfer = Xfer::kLoad;
  set_pages<Tier::kHost>(n, std::move(host));
  set_pages<Tier::kGpu>(n, std::move(gpu));
  batch.ops.push_back({n, false, Xfer::kLoad});
}

void PrefixCache::plan_snapshot_load(Node* n, std::vector<HostPageId> host, StoreBatch& batch) {
  batch.reads.push_back({n->store.snapshot, host});
  n->snap_xfer = Xfer::kLoad;
  set_snapshot<Tier::kHost>(n, std::move(host));
  set_snapshot<Tier::kGpu>(n, take_gpu_pages(config_.snapshot_pages()));
  batch.ops.push_back({n, true, Xfer::kLoad});
}

// ---------------------------------------------------------------------------------------
// store transfers

Status PrefixCache::submit_store_batch(StoreBatch&& batch, std::optional<std::uint32_t>* id_out) {
  if (id_out) id_out->reset();
  if (batch.empty()) return Status::ok();
  const bool writes = !batch.writes.empty();
  assert(writes != !batch.reads.empty());
  std::uint64_t bytes = 0;
  for (const StoreOp& op : batch.ops) {
    bytes += op.snapshot
                 ? config_.snapshot_bytes
                 : std::uint64_t{op.node->page_count(config_.page_size)} * config_.page_bytes;
  }
  const std::size_t items = writes ? batch.writes.size() : batch.reads.size();
  Result<std::uint64_t> ticket = writes ? host_.link->submit_writes(std::move(batch.writes))
                                        : host_.link->submit_reads(std::move(batch.reads));
  if (!ticket) {
    ++stats_.store_failures;
    cancel_store_ops(batch.ops);
    return Status(ticket.status().code(),
                  std::string("the store refused ") + (writes ? "writes" : "reads") + " of " +
                      std::to_string(items) + " records: " + ticket.status().message());
  }
  (writes ? stats_.bytes_to_store : stats_.bytes_from_store) += bytes;
  (writes ? stats_.store_writes : stats_.store_reads) += items;
  const std::uint32_t id = next_free_id(xfers_.next_store, xfers_.store);
  for (const StoreOp& op : batch.ops)
    (op.snapshot ? op.node->snap_xfer_id : op.node->kv_xfer_id) = id;
  xfers_.store.emplace(id, StoreInFlight{*ticket, writes, std::move(batch.ops), bytes});
  if (id_out) *id_out = id;
  return Status::ok();
}

void PrefixCache::cancel_store_ops(std::span<const StoreOp> ops) {
  for (const StoreOp& op : ops) {
    Node* n = op.node;
    if (op.kind == Xfer::kStore) {  // nothing was taken: the sources stay the node's
      (op.snapshot ? n->snap_xfer : n->kv_xfer) = Xfer::kNone;
      refresh(n);
      continue;
    }
    if (!op.snapshot) {
      n->kv_xfer = Xfer::kNone;
      for (HostPageId id : n->host.pages) host_.pages.give_back(id);
      for (GpuPageId id : n->gpu.pages) gpu_.pages.give_back(id);
      set_pages<Tier::kHost>(n, {});
      set_pages<Tier::kGpu>(n, {});
    } else {
      n->snap_xfer = Xfer::kNone;
      for (HostPageId id : n->host.snapshot) host_.pages.give_back(id);
      release(n->gpu.snapshot);
      set_snapshot<Tier::kHost>(n, {});
      set_snapshot<Tier::kGpu>(n, {});
    }
  }
}

void PrefixCache::wait_store_transfer(std::uint32_t id) {
  if (xfers_.store.count(id) == 0) return;
  ++stats_.host_waits;
  finish_store_transfer(id);  // finish_* waits
}

void PrefixCache::reap_store_transfers() {
  if (xfers_.store.empty()) return;
  std::vector<std::uint32_t> done;
  for (auto& [id, t] : xfers_.store) {
    if (host_.link->ready(t.ticket)) done.push_back(id);
  }
  std::sort(done.begin(), done.end());
  for (std::uint32_t id : done) finish_store_transfer(id);
}

void PrefixCache::finish_store_transfer(std::uint32_t id) {
  auto handle = xfers_.store.extract(id);
  if (handle.empty()) return;
  StoreInFlight& t = handle.mapped();
  if (t.writes) {
    Result<std::vector<RecordId>> ids = host_.link->finish_writes(t.ticket);
    if (!ids) ++stats_.store_failures;
    std::size_t at = 0;
    for (const StoreOp& op : t.ops) {
      const std::size_t count = op.snapshot ? 1 : op.node->page_count(config_.page_size);
      finish_store_write(op, ids ? ids->data() + at : nullptr, count, ids.is_ok());
      at += count;
    }
  } else {
    const std::vector<Status> items = host_.link->finish_reads(t.ticket);
    PendingBatch promote;
    promote.batch.direction = Direction::kHostToDevice;
    std::size_t at = 0;
    for (const StoreOp& op : t.ops) {
      const std::size_t count = op.snapshot ? 1 : op.node->page_count(config_.page_size);
      std::span<const Status> mine;
      if (items.size() >= at + count) mine = std::span<const Status>(items).subspan(at, count);
      finish_store_read(op, mine, promote);
      at += count;
    }
    // The arrived host copies continue to GPU at once. Refused: cancel_ops() frees the GPU
    // destinations; the nodes keep their host and store copies and the lock's wait() resumes
    // above them (rule 7).
    (void)submit_batch(std::move(promote));
  }
  std::vector<Node*> nodes;
  for (const StoreOp& op : t.ops) nodes.push_back(op.node);
  prune_copied(std::move(nodes));
}

void PrefixCache::finish_store_write(const StoreOp& op, const RecordId* ids, std::size_t count,
                                     bool ok) {
  Node* n = op.node;
  if (!op.snapshot) {
    assert(n->kv_xfer == Xfer::kStore);
    n->kv_xfer = Xfer::kNone;
    if (ok) {
      set_pages<Tier::kStore>(n, std::vector<RecordId>(ids, ids + count));
      stats_.kv_pages_stored += count;
    }
    // Written for room: the host copy goes (it is clean now; a failed write drops it as a
    // drop for room would have), unless a request locked it or a pin took it meanwhile.
    if (op.drop_host && n->kv_evictable<Tier::kHost>()) {
      if (!ok) stats_.kv_pages_dropped_host += n->host.pages.size();
      for (HostPageId id : n->host.pages) host_.pages.give_back(id);
      set_pages<Tier::kHost>(n, {});
    }
    refresh(n);
    return;
  }
  assert(n->snap_xfer == Xfer::kStore);
  n->snap_xfer = Xfer::kNone;
  if (ok) {
    set_snapshot<Tier::kStore>(n, ids[0]);
    ++stats_.snapshots_stored;
  }
  if (op.drop_host && n->snapshot_evictable<Tier::kHost>()) drop_snapshot<Tier::kHost>(n);
  refresh(n);
}

bool PrefixCache::finish_store_read(const StoreOp& op, std::span<const Status> items,
                                    PendingBatch& promote) {
  Node* n = op.node;
  bool ok = !items.empty(), lost = false;
  for (const Status& s : items) {
    ok &= s.is_ok();
    lost |= s.code() == ErrorCode::kDataLoss;
  }
  if (!ok) ++stats_.store_failures;
  if (!op.snapshot) {
    assert(n->kv_xfer == Xfer::kLoad);
    n->kv_xfer = Xfer::kNone;
    if (ok) {
      for (HostPageId id : n->host.pages) host_.pages.reassign(id, Holder::kNode);
      stats_.kv_pages_loaded += n->host.pages.size();
      // On to GPU: the GPU pages taken at admission are the promotion's destinations.
      for (std::size_t i = 0; i < n->gpu.pages.size(); ++i) {
        promote.batch.pages.push_back({n->gpu.pages[i], n->host.pages[i]});
      }
      n->kv_xfer = Xfer::kPromote;
      promote.ops.push_back({n, false, Xfer::kPromote});
      refresh(n);
      return true;
    }
    // Rule 7: nothing arrived; the destinations are freed.
    for (HostPageId id : n->host.pages) host_.pages.give_back(id);
    for (GpuPageId id : n->gpu.pages) gpu_.pages.give_back(id);
    set_pages<Tier::kHost>(n, {});
    set_pages<Tier::kGpu>(n, {});
    if (lost) {  // the store erased what failed its check; the rest of the node goes too
      stats_.store_records_lost += n->store.pages.size();
      for (RecordId id : n->store.pages) (void)host_.link->erase(id);
      set_pages<Tier::kStore>(n, {});
    }
    return false;
  }
  assert(n->snap_xfer == Xfer::kLoad);
  n->snap_xfer = Xfer::kNone;
  if (ok) {
    for (HostPageId id : n->host.snapshot) host_.pages.reassign(id, Holder::kNode);
    ++stats_.snapshots_loaded;
    n->snap_xfer = Xfer::kPromote;
    add_snapshot_pages(promote.batch, n);
    promote.ops.push_back({n, true, Xfer::kPromote});
    refresh(n);
    return true;
  }
  for (HostPageId id : n->host.snapshot) host_.pages.give_back(id);
  release(n->gpu.snapshot);
  set_snapshot<Tier::kHost>(n, {});
  set_snapshot<Tier::kGpu>(n, {});
  if (lost) {
    ++stats_.store_records_lost;
    (void)host_.link->erase(n->store.snapshot);
    set_snapshot<Tier::kStore>(n, RecordId());
  }
  return false;
}

void PrefixCache::wait_kv_copy(Node* n) {
  if (n->kv_xfer == Xfer::kNone) return;
  if (n->kv_xfer == Xfer::kStage) {
    wait_staged(n->kv_xfer_id);
  } else if (Node::store_copy(n->kv_xfer)) {
    wait_store_transfer(n->kv_xfer_id);
  } else {
    wait_transfer(n->kv_xfer_id);
  }
}

void PrefixCache::wait_snapshot_copy(Node* n) {
  if (n->snap_xfer == Xfer::kNone) return;
  if (n->snap_xfer == Xfer::kMaterialize) {
    wait_device_copy(n->snap_xfer_id);
  } else if (n->snap_xfer == Xfer::kStage) {
    wait_staged(n->snap_xfer_id);
  } else if (Node::store_copy(n->snap_xfer)) {
    wait_store_transfer(n->snap_xfer_id);
  } else {
    wait_transfer(n->snap_xfer_id);
  }
}

// ---------------------------------------------------------------------------------------
// the host watermark

std::size_t PrefixCache::host_pages_storing() const {
  std::size_t n = 0;
  for (const auto& [id, t] : xfers_.store) {
    if (!t.writes) continue;
    for (const StoreOp& op : t.ops) {
      if (op.drop_host)
        n += op.snapshot ? op.node->host.snapshot.size() : op.node->host.pages.size();
    }
  }
  return n;
}

void PrefixCache::store_ahead() {
  if (host_.link == nullptr) return;
  const std::size_t cap = host_.pages.capacity();
  const std::size_t low = config_.host_low_watermark(cap);
  if (host_.pages.free_count() >= low) return;
  const std::size_t coming = host_.pages.free_count() + host_pages_storing();
  if (coming >= low) return;
  const std::size_t high = config_.host_high_watermark(cap);
  StoreBatch batch;
  std::size_t planned = 0;
  std::uint64_t evicted = 0;
  while (coming + planned < high) {
    bool snapshot = false;
    Node* victim = tier<Tier::kHost>().victim(snapshot);
    if (victim == nullptr) break;
    const Held h = snapshot ? Held::kSnapshot : Held::kKv;
    tier<Tier::kHost>().aged_by(h, *victim);
    const std::size_t pages = victim->host.held_pages(h);
    ++evicted;
    // A clean store copy, dead data, another namespace or no store room: as a drop for room.
    if (evict<Tier::kHost>(victim, h, batch, false) == Evicted::kCopying) planned += pages;
  }
  if (batch.empty() || submit_link<Tier::kHost>(std::move(batch)))
    stats_.background_evictions += evicted;
}

// ---------------------------------------------------------------------------------------
// persist(): a graceful shutdown's checkpoint

Status PrefixCache::persist() {
  if (host_.link == nullptr) {
    return Status(ErrorCode::kFailedPrecondition, "persist: this cache has no store tier");
  }
  drain();
  const CacheStats at_start = stats_;
  // Parents first, so a child's record always finds its parent's on the store after a
  // restart (when the store has room for both).
  std::vector<Node*> order;
  for (std::vector<Node*> stack{tree_.root()}; !stack.empty();) {
    Node* n = stack.back();
    stack.pop_back();
    if (!n->is_root()) order.push_back(n);
    for (auto& [key, c] : n->children) stack.push_back(c);
  }
  std::sort(order.begin(), order.end(),
            [](const Node* a, const Node* b) { return a->boundary < b->boundary; });
  Status first_error;
  auto note = [&](Status s) {
    if (!s && first_error.is_ok()) first_error = s;
  };
  // Making room may free nodes still listed (a dropped dead leaf, an erased store-only one):
  // they are logged and skipped.
  std::vector<const Node*> removed;
  std::unordered_set<const Node*> gone;
  removal_log_ = &removed;
  auto freed = [&](const Node* n) {
    gone.insert(removed.begin(), removed.end());
    removed.clear();
    return gone.count(n) != 0;
  };
  for (Node* n : order) {
    if (freed(n)) continue;
    // GPU-only data goes through host first (making host room may demote other nodes to
    // the store: they are persisted that way). Dead KV is not worth it.
    PendingBatch stage = down_batch<Tier::kGpu>();
    const bool live = !cost_aware_ || n->kv_live();
    if (live && n->gpu.has_kv() && !n->host.has_kv() && !n->store.has_kv())
      (void)plan_down<Tier::kGpu>(n, Held::kKv, Xfer::kWriteThrough, stage);
    if (n->gpu.has_snapshot() && !n->host.has_snapshot() && !n->store.snapshot.valid())
      (void)plan_down<Tier::kGpu>(n, Held::kSnapshot, Xfer::kWriteThrough, stage);
    std::optional<std::uint32_t> id;
    note(submit_link<Tier::kGpu>(std::move(stage), &id));
    if (id) wait_link<Tier::kGpu>(*id);
    if (freed(n)) continue;
    StoreBatch batch = down_batch<Tier::kHost>();
    if (n->host.has_kv() && !n->store.has_kv() && n->kv_xfer == Xfer::kNone)
      (void)plan_down<Tier::kHost>(n, Held::kKv, Xfer::kWriteThrough, batch);
    if (n->host.has_snapshot() && !n->store.snapshot.valid() && n->snap_xfer == Xfer::kNone)
      (void)plan_down<Tier::kHost>(n, Held::kSnapshot, Xfer::kWriteThrough, batch);
    if (!n->has_kv()) {
      // Making store room for n's snapshot erased n's own store KV (its only copy): nothing
      // was planned for n (a KV write needs host KV), and n, empty now, leaves the tree.
      remove_if_empty(n);
      continue;
    }
    note(submit_link<Tier::kHost>(std::move(batch), &id));
    if (id) wait_link<Tier::kHost>(*id);
  }
  removal_log_ = nullptr;
  note(host_.link->sync());
  if (!first_error.is_ok()) return first_error;
  // A copy that failed on the way (a store write, or a GPU -> host staging copy) lost what it
  // carried, or the victim a failed write was making room with.
  const std::uint64_t failed = (stats_.store_failures - at_start.store_failures) +
                               (stats_.transfers_failed - at_start.transfers_failed);
  if (failed > 0) {
    return Status(ErrorCode::kTransferFailed,
                  "persist: " + std::to_string(failed) +
                      " copies failed; what was written before and after them is durable");
  }
  // What is left without a store copy: a copy that failed (the stats count it), or no room to
  // stage it on host (a split host pool without a snapshot share) or to keep it on the store.
  std::size_t kv_left = 0, snaps_left = 0;
  for (std::vector<const Node*> stack{tree_.root()}; !stack.empty();) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [key, c] : n->children) stack.push_back(c);
    if (n->is_root() || !n->has_kv()) continue;
    kv_left += !n->store.has_kv() && (!cost_aware_ || n->kv_live());
    snaps_left += n->has_snapshot() && !n->store.snapshot.valid();
  }
  if (kv_left + snaps_left > 0) {
    return out_of_memory("persist: " + std::to_string(kv_left) + " KV nodes and " +
                         std::to_string(snaps_left) +
                         " snapshots have no store copy (a copy failed, or no host room to "
                         "stage them or no store room to keep them); the rest is durable");
  }
  return Status::ok();
}

}  // namespace radixtier
