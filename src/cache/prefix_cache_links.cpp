// The transitions between a tier and the one below it, written once for every adjacent pair
// (GPU -> host on the TransferEngine, host -> store on the StoreEngine): node.hpp's table of
// transitions over a pair of adjacent tiers, as code.
//
//   evict<T>        one victim of tier T leaves it: dead KV is dropped; a copy already kept
//                   below makes it free; else its copy down is planned (demote); when that
//                   cannot be made it is dropped (or, ahead of need, left where it is)
//   drop_victim<T>  the drop: counted as dropped on T (and as dead when nothing resumes from
//                   it); a node left empty leaves the tree
//   plan_down<T>    the copy of a node's KV / snapshot one tier down, as a demotion (the copy
//                   above goes when it lands) or a write-through (it stays), room below made
//   plan_up<T>      the copy of a node's KV / snapshot from the tier below up into T: a
//                   promotion (host -> GPU) or a load (store -> host, then on to GPU)
//   submit_link<T>, wait_link<T>: a batch goes to the engine between T and the tier below /
//                   is waited for
//
// What stays with each link: how a copy is planned on its engine (host pages taken before the
// copy for GPU -> host; store records named by path hashes for host -> store) and how a
// finished copy lands (prefix_cache_transfers.cpp, prefix_cache_store.cpp).
#include <algorithm>
#include <cassert>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

template <Tier T>
PrefixCache::Evicted PrefixCache::evict(Node* n, Held h, LinkBatch<T>& batch, bool ahead) {
  assert(h == Held::kKv ? n->kv_evictable<T>() : n->snapshot_evictable<T>());
  const bool kv = h == Held::kKv;
  Evicted out = Evicted::kFreed;
  if (kv && cost_aware_ && !n->kv_live()) {  // dead KV: nothing resumes from it, no copy pays
    drop_victim<T>(n, h);
    return out;
  }
  if (kept_below<T>(*n, h)) {
    free_kept<T>(n, h);
    return out;
  }
  if (!kv && !n->has_kv()) {  // a snapshot without KV: nothing resumes from it either
    drop_victim<T>(n, h);
    return out;
  }
  // Its key in T's order now (planning the copy takes it off the order).
  const OrderKey key = n->row<T>().key(h);
  bool planned = plan_down<T>(n, h, Xfer::kDemote, batch);
  if (!planned && ahead && n->has_kv()) {
    // No room below now (what is there is in flight or pinned): ahead of need, nothing is
    // dropped that an allocation, waiting for those copies, would demote instead.
    return Evicted::kLeft;
  }
  if constexpr (T == Tier::kGpu) {
    if (!planned) planned = displace_planned(n, h, key, batch);
    if (planned) batch.victims.push_back({n, h, key});
  }
  if (!planned) {
    drop_victim<T>(n, h);
    return out;
  }
  return Evicted::kCopying;
}

bool PrefixCache::displace_planned(Node* n, Held h, const OrderKey& key, PendingBatch& batch) {
  // Victims are taken lowest key first, so the copies planned before n are below it (or
  // equal): without this, the last and highest of a batch into a full host is the one
  // dropped (the planned copies are not evictable), a priority inversion.
  for (;;) {
    if (!n->has_kv()) return false;  // making room took n's own KV: nothing to keep
    auto lowest = batch.victims.end();
    for (auto it = batch.victims.begin(); it != batch.victims.end(); ++it) {
      // Never n's own other copy: dropping its KV could take n out of the tree.
      if (it->node != n && it->key < key &&
          (lowest == batch.victims.end() || it->key < lowest->key))
        lowest = it;
    }
    if (lowest == batch.victims.end()) return false;
    Node* const v = lowest->node;
    const Held vh = lowest->held;
    // Its KV goes with its snapshot: a snapshot on host without the KV below it is dead.
    const bool with_snapshot =
        vh == Held::kKv &&
        std::any_of(batch.victims.begin(), batch.victims.end(), [v](const PlannedVictim& p) {
          return p.node == v && p.held == Held::kSnapshot;
        });
    std::erase_if(batch.victims, [v, vh, with_snapshot](const PlannedVictim& p) {
      return p.node == v && (p.held == vh || with_snapshot);
    });
    if (vh == Held::kSnapshot || with_snapshot) {
      unplan(batch, v, true);
      drop_victim<Tier::kGpu>(v, Held::kSnapshot);
    }
    if (vh == Held::kKv) {
      unplan(batch, v, false);
      drop_victim<Tier::kGpu>(v, Held::kKv);
    }
    if (plan_down<Tier::kGpu>(n, h, Xfer::kDemote, batch)) return true;
  }
}

void PrefixCache::unplan(PendingBatch& batch, Node* n, bool snapshot) {
  const std::vector<HostPageId>& dst = snapshot ? n->host.snapshot : n->host.pages;
  const std::unordered_set<HostPageId> mine(dst.begin(), dst.end());
  std::erase_if(batch.batch.pages, [&mine](const PageCopy& c) { return mine.contains(c.host); });
  auto op = std::find_if(batch.ops.begin(), batch.ops.end(), [n, snapshot](const CopyOp& o) {
    return o.node == n && o.snapshot == snapshot;
  });
  assert(op != batch.ops.end());
  const CopyOp planned = *op;
  batch.ops.erase(op);
  cancel_ops(std::span<const CopyOp>(&planned, 1));
}

template <Tier T>
bool PrefixCache::kept_below(const Node& n, Held h) const {
  // KV is kept below when the next tier has it (a promotion reads it from there); a snapshot
  // when any tier below has it (it is never written twice).
  if (h == Held::kKv) return n.row<lower_tier(T)>().has_kv();
  if constexpr (T == Tier::kGpu) return n.host.has_snapshot() || n.store.has_snapshot();
  return n.store.has_snapshot();
}

template <Tier T>
void PrefixCache::free_kept(Node* n, Held h) {
  if constexpr (T == Tier::kGpu) {
    // The copy on host stays in memory: KV freed here is a demotion that needed no copy.
    if (h == Held::kKv) {
      stats_.kv_pages_demoted += n->gpu.pages.size();
      free_kv<T>(n);
    } else {
      drop_snapshot<T>(n);
    }
  } else {
    drop_victim<T>(n, h);  // the last memory tier: what leaves it is dropped from memory
  }
}

template <Tier T>
void PrefixCache::drop_victim(Node* n, Held h) {
  if (h == Held::kSnapshot) {
    drop_snapshot<T>(n);
    remove_if_empty(n);  // making room may have taken its last KV
    return;
  }
  const std::size_t np = n->row<T>().pages.size();
  if (!n->kv_live()) stats_.dead_kv_pages_dropped += np;
  dropped_pages<T>() += np;
  free_kv<T>(n);
  remove_if_empty(n);
}

template <Tier T>
bool PrefixCache::plan_down(Node* n, Held h, Xfer kind, LinkBatch<T>& batch) {
  if constexpr (T == Tier::kGpu) {
    if (h == Held::kKv) {
      if (!make_host_page_room(n->gpu.pages.size())) return false;
      plan_kv_to_host(n, kind, batch);
      return true;
    }
    std::vector<HostPageId> dst = take_host_snapshot_pages(n);
    if (dst.empty()) return false;
    if (!n->has_kv()) {  // making room took n's own KV: the snapshot is of no use any more
      release(dst);
      return false;
    }
    plan_snapshot_to_host(n, std::move(dst), kind, batch);
    return true;
  } else {
    return plan_store_write(n, h == Held::kSnapshot, kind == Xfer::kDemote, batch) ==
           StoreVerdict::kPlanned;
  }
}

template <Tier T>
bool PrefixCache::plan_up(Node* n, Held h, LinkBatch<T>& batch) {
  if constexpr (T == Tier::kGpu) {  // promotion: host -> GPU, into GPU room already made
    if (h == Held::kKv) {
      std::vector<GpuPageId> dst;
      for (HostPageId src : n->host.pages) {
        dst.push_back(*gpu_.pages.take(Holder::kTransfer));
        batch.batch.pages.push_back({dst.back(), src});
      }
      n->kv_xfer = Xfer::kPromote;
      set_pages<Tier::kGpu>(n, std::move(dst));
    } else {
      n->snap_xfer = Xfer::kPromote;
      set_snapshot<Tier::kGpu>(n, take_gpu_pages(config_.snapshot_pages()));
      add_snapshot_pages(batch.batch, n);
    }
    batch.ops.push_back({n, h == Held::kSnapshot, Xfer::kPromote});
    return true;
  } else {  // load: store -> host, on to the GPU room already made when it lands
    if (h == Held::kKv) {
      plan_kv_load(n, batch);
      return true;
    }
    std::vector<HostPageId> dst = take_host_snapshot_pages(n);
    if (dst.empty()) return false;
    plan_snapshot_load(n, std::move(dst), batch);
    return true;
  }
}

template <Tier T>
Status PrefixCache::submit_link(LinkBatch<T>&& batch, std::optional<std::uint32_t>* id) {
  if constexpr (T == Tier::kGpu) {
    return submit_batch(std::move(batch), id);
  } else {
    return submit_store_batch(std::move(batch), id);
  }
}

template <Tier T>
void PrefixCache::wait_link(std::uint32_t id) {
  if constexpr (T == Tier::kGpu) {
    wait_transfer(id);
  } else {
    wait_store_transfer(id);
  }
}

template <Tier T>
LinkBatch<T> PrefixCache::down_batch() {
  LinkBatch<T> b;
  if constexpr (T == Tier::kGpu) b.batch.direction = Direction::kDeviceToHost;
  return b;
}

template <Tier T>
LinkBatch<T> PrefixCache::up_batch() {
  LinkBatch<T> b;
  if constexpr (T == Tier::kGpu) b.batch.direction = Direction::kHostToDevice;
  return b;
}

#define RADIXTIER_LINK(T)                                                                     \
  template PrefixCache::Evicted PrefixCache::evict<T>(Node*, Held, LinkBatch<T>&, bool);      \
  template bool PrefixCache::kept_below<T>(const Node&, Held) const;                          \
  template void PrefixCache::free_kept<T>(Node*, Held);                                       \
  template bool PrefixCache::plan_down<T>(Node*, Held, Xfer, LinkBatch<T>&);                  \
  template Status PrefixCache::submit_link<T>(LinkBatch<T>&&, std::optional<std::uint32_t>*); \
  template void PrefixCache::wait_link<T>(std::uint32_t);                                     \
  template LinkBatch<T> PrefixCache::down_batch<T>();                                         \
  template bool PrefixCache::plan_up<T>(Node*, Held, LinkBatch<T>&);                          \
  template LinkBatch<T> PrefixCache::up_batch<T>();
RADIXTIER_LINK(Tier::kGpu)
RADIXTIER_LINK(Tier::kHost)
#undef RADIXTIER_LINK
template void PrefixCache::drop_victim<Tier::kGpu>(Node*, Held);
template void PrefixCache::drop_victim<Tier::kHost>(Node*, Held);
template void PrefixCache::drop_victim<Tier::kStore>(Node*, Held);

}  // namespace radixtier
