// PrefixCache::check_invariants(): rebuilds every count from the tree and compares, in the
// spirit of an idle-time sanity check. Returns the first violation, or "" when all hold.
#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {

/// Counts references to each id of one space and checks each id's recorded holder.
template <class Id>
class RefCounter {
 public:
  RefCounter(const IdPool<Id>& pool, const char* name)
      : pool_(pool), name_(name), refs_(pool.capacity(), 0) {}

  std::string add(Id id, Holder expected) {
    if (!pool_.in_range(id)) return std::string(name_) + ": a node holds an out-of-range id";
    if (++refs_[id.value()] > 1) {
      std::ostringstream os;
      os << name_ << ": " << id << " is held by two nodes";
      return os.str();
    }
    if (pool_.holder(id) != expected) {
      std::ostringstream os;
      os << name_ << ": " << id << " is on a node but recorded as held by holder #"
         << static_cast<int>(pool_.holder(id));
      return os.str();
    }
    return {};
  }

  /// Every id recorded as held by a node or a transfer is referenced by exactly one node.
  std::string finish() const {
    if (std::string e = pool_.check(name_); !e.empty()) return e;
    for (std::uint32_t i = 0; i < refs_.size(); ++i) {
      const Holder h = pool_.holder(Id(i));
      const bool tree_held = h == Holder::kNode || h == Holder::kTransfer;
      if (tree_held != (refs_[i] == 1)) {
        std::ostringstream os;
        os << name_ << ": " << Id(i) << " is recorded as held by holder #" << static_cast<int>(h)
           << " but " << refs_[i] << " nodes reference it";
        return os.str();
      }
    }
    return {};
  }

 private:
  const IdPool<Id>& pool_;
  const char* name_;
  std::vector<std::uint32_t> refs_;
};

}  // namespace

template <class Id>
std::string PrefixCache::check_ownership(const IdPool<Id>& pool, const RequestOwnership<Id>& owners,
                                         const char* name) const {
  if (std::string e = owners.check(name); !e.empty()) return e;
  if (owners.owned_count() != pool.count(Holder::kRequest))
    return std::string(name) + ": request-held count differs from the owned count";
  for (std::uint32_t i = 0; i < pool.capacity(); ++i) {
    const LockId o = owners.owner(Id(i));
    if (o.valid() != (pool.holder(Id(i)) == Holder::kRequest))
      return std::string(name) + ": an id is owned by a request but not request-held, or back";
    if (o.valid() && requests_.find(o) == nullptr)
      return std::string(name) + ": an id is owned by a request that was released";
  }
  return {};
}

std::string PrefixCache::check_invariants() const {
  const std::uint32_t ps = config_.page_size;
  RefCounter<GpuPageId> gpu(gpu_.pages, "gpu pages");
  RefCounter<HostPageId> host(host_.pages, "host pages");
  RefCounter<GpuSlotId> gslots(gpu_.slots, "gpu snapshot slots");

  // Rule 3: lock counts rebuilt from the lock records.
  // Key namespaces: every namespace root is a root, and a lock or a pin lies in the tree of
  // the root it records.
  auto top_of = [](const Node* n) {
    while (n->parent != nullptr) n = n->parent;
    return n;
  };
  std::unordered_map<const Node*, std::uint32_t> locks, snap_locks, pins, snap_pins;
  for (const auto& [id, rec] : requests_) {
    if (top_of(rec.node) != rec.root) return "a lock lies outside its namespace's tree";
    for (const Node* p = rec.node; p != nullptr; p = p->parent) ++locks[p];
    if (rec.holds_snapshot()) ++snap_locks[rec.snap_node];
    if (rec.priority > kMaxPriority) return "a lock's priority is above the maximum";
    // The fill (issue 33): a lock that still holds its snapshot has its copy into the live
    // slot in flight, failed, deferred until the snapshot's promotion starts, or lost with it.
    if (rec.holds_snapshot() && rec.fill_xfer == 0 && !rec.fill_failed &&
        rec.snap_node->gpu.has_snapshot() &&
        std::find(deferred_fills_.begin(), deferred_fills_.end(), LockId(id)) ==
            deferred_fills_.end())
      return "a lock holds a snapshot whose copy into its live slot was never started";
    if (rec.fill_xfer != 0) {
      auto it = xfers_.device.find(rec.fill_xfer);
      if (it == xfers_.device.end() || it->second.kind != DeviceCopy::Kind::kFill ||
          it->second.lock != LockId(id) || it->second.node != rec.snap_node ||
          it->second.slot != rec.live || !rec.holds_snapshot())
        return "a lock's fill disagrees with its transfer record";
    }
  }
  // Device copies (rules 2 and 5): a fill's source is a snapshot its lock keeps (or, once the
  // request released it, the copy's own snapshot lock) and its destination the request's live
  // slot (or the copy's); a materialization holds its slot and its node's arriving pages.
  // A fill whose snapshot's promotion failed has lost its source pages: it runs after that
  // promotion, so the engine fails it too (TransferBatch::after) and nothing is read from them.
  for (const auto& [id, c] : xfers_.device) {
    if (c.kind == DeviceCopy::Kind::kMaterialize) {
      if (!c.node->gpu.has_snapshot()) return "a materialization has no GPU pages";
      if (c.node->snap_xfer != Xfer::kMaterialize || c.node->snap_xfer_id != id)
        return "a materialization record disagrees with its node";
      if (std::string e = gslots.add(c.slot, Holder::kTransfer); !e.empty()) return e;
    } else if (!c.lock.valid()) {
      ++snap_locks[c.node];
      if (std::string e = gslots.add(c.slot, Holder::kTransfer); !e.empty()) return e;
    } else if (requests_.find(c.lock) == nullptr || requests_.find(c.lock)->fill_xfer != id) {
      return "a fill names a lock that does not name it";
    }
  }
  for (const auto& [id, rec] : pins_) {
    if (top_of(rec.node) != rec.root) return "a pin lies outside its namespace's tree";
    for (const Node* p = rec.node; p != nullptr; p = p->parent) ++pins[p];
    ++snap_pins[rec.node];
  }
  std::size_t nodes = 0, locked_pages = 0, pinned_pages = 0;
  std::size_t listed[kTierCount][2] = {};  // nodes linked on each tier's KV / snapshot order
  std::unordered_set<RecordId> store_ids;  // every record a node holds
  std::vector<const Node*> stack{tree_.root()};
  for (const auto& [ns, r] : tree_.namespace_roots()) {
    if (r == tree_.root() || !r->is_root() || ns == kDefaultNamespace.value())
      return "a namespace root is not a root of its own";
    if (r->children.empty() && r->lock_count == 0 && r->host_pin == 0)
      return "an empty namespace root was left";
    stack.push_back(r);
  }
  // No node is reachable from two namespaces (nor twice from one).
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> preorder;  // parents before children: counts are summed backwards
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) return "a node is reachable twice (from two namespaces?)";
    preorder.push_back(n);
    ++nodes;
    std::ostringstream where;
    where << "node at boundary " << n->boundary << ": ";
    auto fail = [&](const std::string& what) { return where.str() + what; };

    if (n->is_root()) {
      if (!n->tokens.empty() || n->has_kv() || n->has_snapshot())
        return fail("the root holds data");
    } else {
      if (n->tokens.empty() || n->tokens.size() % ps != 0)
        return fail("tokens are not whole pages");
      if (n->boundary != n->parent->boundary + n->tokens.size()) return fail("wrong boundary");
      auto it = n->parent->children.find(n->first_page(ps));
      if (it == n->parent->children.end() || it->second != n)
        return fail("not keyed in its parent");
      const std::size_t np = n->page_count(ps);
      if (n->gpu.has_kv() && n->gpu.pages.size() != np) return fail("GPU page count != pages");
      if (n->host.has_kv() && n->host.pages.size() != np) return fail("host page count != pages");
      if (n->children.empty() && n->lock_count == 0 && n->snapshot_lock == 0 && n->host_pin == 0 &&
          !n->has_kv() && n->kv_xfer == Xfer::kNone && n->snap_xfer == Xfer::kNone)
        return fail(std::string("an empty leaf was left in the tree (snapshot on gpu ") +
                    (n->gpu.has_snapshot() ? "yes" : "no") + ", host " +
                    (n->host.has_snapshot() ? "yes" : "no") + ")");
    }
    // Rule 2 and 5: each id in one place; ids of an in-flight copy are held by it.
    const bool kv_to_host = n->kv_to_host();
    const bool kv_to_gpu = n->kv_to_gpu();
    // A staged load's destinations are GPU pages only (its staging pages are the load's).
    if (n->kv_xfer == Xfer::kStage) {
      if (!n->gpu.has_kv() || n->host.has_kv())
        return fail("a staged KV load is in flight without its GPU pages, or with host pages");
    } else if ((kv_to_host || kv_to_gpu) && !(n->gpu.has_kv() && n->host.has_kv())) {
      return fail("a KV copy is in flight without both ends");
    }
    if (n->kv_xfer == Xfer::kLoad && !n->store.has_kv())
      return fail("a KV load is in flight without its store records");
    if (n->kv_xfer == Xfer::kStore && !n->host.has_kv())
      return fail("a KV store write is in flight without its host pages");
    if (n->snap_xfer == Xfer::kLoad && !n->store.snapshot.valid())
      return fail("a snapshot load is in flight without its store record");
    if (n->snap_xfer == Xfer::kStore && !n->host.has_snapshot())
      return fail("a snapshot store write is in flight without its host pages");
    // The store row: records of the default namespace only, one per page, each held once.
    if (n->store.has_kv() && n->store.pages.size() != n->page_count(ps))
      return fail("store record count != pages");
    if ((n->store.has_kv() || n->store.snapshot.valid()) && top_of(n) != tree_.root())
      return fail("a node outside the default namespace holds store records");
    for (RecordId id : n->store.pages) {
      if (!store_ids.insert(id).second) return fail("a store record is held twice");
    }
    if (n->store.snapshot.valid() && !store_ids.insert(n->store.snapshot).second)
      return fail("a store record is held twice");
    for (GpuPageId id : n->gpu.pages)
      if (auto e = gpu.add(id, kv_to_gpu ? Holder::kTransfer : Holder::kNode); !e.empty())
        return fail(e);
    for (HostPageId id : n->host.pages)
      if (auto e = host.add(id, kv_to_host ? Holder::kTransfer : Holder::kNode); !e.empty())
        return fail(e);
    const bool snap_to_host = n->snap_to_host();
    const bool snap_to_gpu = n->snap_to_gpu();
    if (n->snap_xfer == Xfer::kStage) {
      if (!n->gpu.has_snapshot() || n->host.has_snapshot())
        return fail(
            "a staged snapshot load is in flight without its GPU pages, or with host pages");
    } else if (n->snap_xfer == Xfer::kMaterialize) {
      if (!n->gpu.has_snapshot()) return fail("a materialization is in flight without GPU pages");
    } else if ((snap_to_host || snap_to_gpu) &&
               !(n->gpu.has_snapshot() && n->host.has_snapshot())) {
      return fail("a snapshot copy is in flight without both ends");
    }
    if (n->host.has_snapshot() && n->host.snapshot.size() != config_.snapshot_pages())
      return fail("a host snapshot does not span snapshot_pages() host pages");
    if (n->gpu.has_snapshot() && n->gpu.snapshot.size() != config_.snapshot_pages())
      return fail("a GPU snapshot does not span snapshot_pages() GPU pages");
    for (GpuPageId id : n->gpu.snapshot)  // the same GPU pool as the KV pages
      if (auto e = gpu.add(id, snap_to_gpu ? Holder::kTransfer : Holder::kNode); !e.empty())
        return fail(e);
    for (HostPageId id : n->host.snapshot)  // the same host pool as the KV pages
      if (auto e = host.add(id, snap_to_host ? Holder::kTransfer : Holder::kNode); !e.empty())
        return fail(e);
    auto recorded = [&](Xfer x, std::uint32_t id) {
      if (x == Xfer::kStage) return xfers_.staged.count(id) != 0;
      if (x == Xfer::kMaterialize) return xfers_.device.count(id) != 0;
      return Node::store_copy(x) ? xfers_.store.count(id) != 0 : xfers_.copies.count(id) != 0;
    };
    if (n->kv_xfer != Xfer::kNone && !recorded(n->kv_xfer, n->kv_xfer_id))
      return fail("KV copy in flight with no transfer record");
    if (n->snap_xfer != Xfer::kNone && !recorded(n->snap_xfer, n->snap_xfer_id))
      return fail("snapshot copy in flight with no transfer record");

    if (n->lock_count > 0) locked_pages += n->gpu.pages.size();
    // Rule 3.
    const auto lk = locks.find(n);
    if (n->lock_count != (lk == locks.end() ? 0u : lk->second)) return fail("lock count is off");
    const auto sl = snap_locks.find(n);
    if (n->snapshot_lock != (sl == snap_locks.end() ? 0u : sl->second))
      return fail("snapshot lock count is off");
    // Pins, as locks; a pinned node's host copies are never dropped for room (rule 4 below
    // keeps them off the host orders).
    const auto pn = pins.find(n);
    if (n->host_pin != (pn == pins.end() ? 0u : pn->second)) return fail("pin count is off");
    const auto sp = snap_pins.find(n);
    if (n->snap_pin != (sp == snap_pins.end() ? 0u : sp->second))
      return fail("snapshot pin count is off");
    if (n->host_pin > 0) pinned_pages += n->page_count(ps);
    if (n->snap_pin > 0) pinned_pages += config_.snapshot_pages();
    if (n->kv_priority > kMaxPriority || n->snap_priority > kMaxPriority)
      return fail("a retention priority is above the maximum");

    std::uint32_t children[kTierCount] = {};  // per tier, children that hold KV there
    for (const auto& [key, c] : n->children) {
      if (c->parent != n) return fail("a child does not point back to its parent");
      if (c->lock_count > n->lock_count) return fail("a child is locked more than its parent");
      if (c->host_pin > n->host_pin) return fail("a child is pinned more than its parent");
      const Node* child = c;  // (clang cannot capture a structured binding)
      for_each_tier([&]<Tier T>() { children[std::size_t(T)] += child->row<T>().has_kv(); });
      stack.push_back(c);
    }
    // Per row: the child counter, and rule 4 (on an order iff evictable there now, at the
    // key the node's state gives now: a stale key misorders victims).
    std::string row_error;
    for_each_tier([&]<Tier T>() {
      const Row<T>& row = n->row<T>();
      const std::string tier_name = to_string(T);
      if (!row_error.empty()) return;
      if (children[std::size_t(T)] != row.kv_children) {
        row_error = tier_name + " child residency counter is off";
        return;
      }
      const bool kv_on = row.kv_hook.is_linked(), snap_on = row.snap_hook.is_linked();
      if (kv_on != n->kv_evictable<T>() || snap_on != n->snapshot_evictable<T>()) {
        row_error = tier_name + " order membership differs from evictability";
      } else if ((kv_on && row.kv_key != kv_key<T>(*n)) ||
                 (snap_on && row.snap_key != snap_key<T>(*n))) {
        row_error = tier_name + " order key is stale";
      }
      listed[std::size_t(T)][0] += kv_on;
      listed[std::size_t(T)][1] += snap_on;
    });
    if (!row_error.empty()) return fail(row_error);
  }
  // Snapshot counts, rebuilt bottom-up: each node's count = its own snapshot + its children's.
  std::unordered_map<const Node*, std::uint32_t> below;
  for (auto it = preorder.rbegin(); it != preorder.rend(); ++it) {
    const Node* n = *it;
    std::uint32_t count = n->has_snapshot() ? 1 : 0;
    for (const auto& [key, c] : n->children) count += below[c];
    below[n] = count;
    if (n->snapshots_below != count) {
      std::ostringstream os;
      os << "node at boundary " << n->boundary << ": snapshots_below is " << n->snapshots_below
         << ", the subtree has " << count;
      return os.str();
    }
  }

  // CacheConfig::max_snapshots_per_path: no root path holds more (parents come first).
  if (config_.max_snapshots_per_path > 0) {
    std::unordered_map<const Node*, std::uint32_t> on_path;
    for (const Node* n : preorder) {
      const std::uint32_t count =
          (n->is_root() ? 0 : on_path[n->parent]) + (n->has_snapshot() ? 1 : 0);
      on_path[n] = count;
      if (count > config_.max_snapshots_per_path) {
        std::ostringstream os;
        os << "node at boundary " << n->boundary << ": " << count
           << " snapshots on its root path, more than max_snapshots_per_path "
           << config_.max_snapshots_per_path;
        return os.str();
      }
    }
  }
  if (nodes != tree_.node_count()) return "node count is off";
  if (locked_pages != gpu_.locked_pages) return "locked GPU page count is off";
  if (pinned_pages != pins_.pinned_pages) return "pinned host page count is off";
  if (pins_.pinned_pages > pin_budget_pages()) return "pins hold more than host_pin_share";
  bool orders_match = true;
  for_each_tier([&]<Tier T>() {
    orders_match = orders_match &&
                   listed[std::size_t(T)][0] == tier<T>().template order<Held::kKv>().size() &&
                   listed[std::size_t(T)][1] == tier<T>().template order<Held::kSnapshot>().size();
  });
  if (!orders_match) return "an eviction order holds a node that is not in the tree";
  std::size_t store_snaps = 0;
  for (const Node* n : preorder) store_snaps += n->store.snapshot.valid();
  if (store_snaps != store_tier_.snaps_held) return "store snapshot count is off";

  // Staged loads: their staging pages (held by them, as a transfer's), their nodes, and the
  // records of nodes whose read failed its check, erased when the load ends.
  std::size_t staging = 0;
  for (const auto& [id, l] : xfers_.staged) {
    staging += l.window;
    std::size_t held = 0;
    auto hold = [&](const std::vector<HostPageId>& pages) {
      held += pages.size();
      for (HostPageId p : pages) {
        if (std::string e = host.add(p, Holder::kTransfer); !e.empty()) return e;
      }
      return std::string();
    };
    if (std::string e = hold(l.idle); !e.empty()) return e;
    for (const StagedChunk& c : l.chunks) {
      if (std::string e = hold(c.staging); !e.empty()) return e;
    }
    if (held != l.window) return "a staged load's staging pages differ from its window";
    for (const Node* n : l.nodes) {
      if (n != nullptr && (n->kv_xfer != Xfer::kStage || n->kv_xfer_id != id))
        return "a staged load record disagrees with its node";
    }
    if (l.target != nullptr &&
        (l.target->snap_xfer != Xfer::kStage || l.target->snap_xfer_id != id))
      return "a staged load record disagrees with its snapshot node";
    for (RecordId r : l.to_erase) {
      if (!store_ids.insert(r).second) return "a store record is held twice";
    }
  }
  if (staging != xfers_.staging_pages) return "staging page count is off";
  // The store holds exactly the records the nodes hold (writes in flight have no ids yet).
  if (host_.link != nullptr) {
    const std::vector<StoredRecord> records = host_.link->records();
    if (records.size() != store_ids.size())
      return "the store holds " + std::to_string(records.size()) + " records, the nodes " +
             std::to_string(store_ids.size());
    for (const StoredRecord& r : records) {
      if (store_ids.count(r.id) == 0) return "the store holds a record no node holds";
    }
  } else if (!store_ids.empty()) {
    return "nodes hold store records without a store";
  }
  for (const auto& [id, t] : xfers_.store) {
    for (const StoreOp& op : t.ops) {
      const Xfer state = op.snapshot ? op.node->snap_xfer : op.node->kv_xfer;
      const std::uint32_t xid = op.snapshot ? op.node->snap_xfer_id : op.node->kv_xfer_id;
      if (state != op.kind || xid != id) return "a store transfer record disagrees with its node";
    }
  }
  for (const std::string& e : {gpu.finish(), host.finish(), gslots.finish()})
    if (!e.empty()) return e;
  // Rule 9: every request-held id has exactly one owner, a live request.
  if (std::string e = check_ownership(gpu_.pages, requests_.page_owner, "GPU pages"); !e.empty())
    return e;
  if (std::string e = check_ownership(gpu_.slots, requests_.slot_owner, "GPU snapshot slots");
      !e.empty())
    return e;
  for (const auto& [id, t] : xfers_.copies) {
    for (const CopyOp& op : t.ops) {
      const Xfer state = op.snapshot ? op.node->snap_xfer : op.node->kv_xfer;
      const std::uint32_t xid = op.snapshot ? op.node->snap_xfer_id : op.node->kv_xfer_id;
      if (state != op.kind || xid != id) return "a transfer record disagrees with its node";
    }
  }
  // The watermark step counts what demotions in flight will free: node-held ids, each once.
  if (gpu_pages_demoting() > gpu_.pages.count(Holder::kNode))
    return "GPU pages being demoted exceed the node-held pages";
  if (alloc_room_) return "alloc_room_ left set outside make_gpu_*_room";
  return {};
}

}  // namespace radixtier
