// TierOrders<T>: the eviction part of one tier. It owns the tier's two eviction orders (the
// nodes whose KV / snapshot is evictable on T now, node.hpp "Eviction orders"), the
// GreedyDual age of the tier's pool and the value per byte of a snapshot there.
//
// Invariants it keeps (PrefixCache::check_invariants() checks them with the nodes):
//   - a node is linked in order H iff node.evictable<T, H>() (rule 4), at the key its state
//     gives (PrefixCache::key<T, H>); a key changes only while the node is unlinked;
//   - the age never decreases: the pool's age is the highest priority of a live victim taken
//     from it (class kLive), so a node's key stays comparable to those of nodes used later.
// Every tier keeps KV and snapshots in one pool (GPU and host pages, the store's slots), so
// its two orders are one eviction order (victim(): the lower head) with one age.
#pragma once

#include <algorithm>

#include "radixtier/cache/node.hpp"

namespace radixtier {

template <Tier T>
class TierOrders {
 public:
  template <Held H>
  Order<T, H>& order() {
    if constexpr (H == Held::kKv) {
      return kv_;
    } else {
      return snap_;
    }
  }
  template <Held H>
  const Order<T, H>& order() const {
    return const_cast<TierOrders*>(this)->order<H>();
  }
  /// The head of order H (lowest key), nullptr when it is empty.
  template <Held H>
  Node* head() const {
    const auto& o = order<H>();
    return o.empty() ? nullptr : const_cast<Node*>(&*o.begin());
  }
  /// The pool's next victim when both kinds share it: the lower of the two heads (a tie goes
  /// to the KV); `snapshot` says which. nullptr when both orders are empty.
  Node* victim(bool& snapshot) const {
    const Node* kv = head<Held::kKv>();
    const Node* sn = head<Held::kSnapshot>();
    snapshot = sn != nullptr && (kv == nullptr || sn->row<T>().snap_key < kv->row<T>().kv_key);
    return const_cast<Node*>(snapshot ? sn : kv);
  }

  /// The age a use of a node's KV / snapshot records on the node's row.
  double age(Held) const { return age_; }
  /// `victim`'s KV (h = kKv) or snapshot was taken from this tier for room: a live one (key
  /// class kLive) raises its pool's age to the victim's priority.
  void aged_by(Held h, const Node& victim) {
    const OrderKey& key = victim.row<T>().key(h);
    if (key.cls == KeyClass::kLive) age_ = std::max(age_, key.priority);
  }

  /// Re-links n on order H: in it iff `want`, at `key`.
  template <Held H>
  void sync(Node& n, bool want, const OrderKey& key) {
    Row<T>& row = n.row<T>();
    OrderHook& hook = row.hook(H);
    OrderKey& stored = row.key(H);
    auto& set = order<H>();
    if (hook.is_linked()) {
      if (want && stored == key) return;
      set.erase(set.iterator_to(n));
    }
    if (want) {
      stored = key;
      set.insert(n);
    }
  }
  /// Unlinks every node (the tree is being destroyed).
  void clear() {
    kv_.clear();
    snap_.clear();
  }

  /// Tokens of recompute a byte of a cached snapshot on this tier saves, per token of gap.
  double snap_value = 0;

 private:
  Order<T, Held::kKv> kv_;
  Order<T, Held::kSnapshot> snap_;
  double age_ = 0;
};

}  // namespace radixtier
