// Key namespaces and retention priorities of PrefixCache.
//
// Each namespace other than the default one has its own root in the tree (radix_tree.hpp),
// made by its first admission or pin (RadixTree::ensure_root) and removed once its tree is empty,
// with no lock and no pin on the root (remove_root_if_empty, called where remove_if_empty stops at
// a root). A root is a node without a parent, so everything that walks to "the root" (locks, pins,
// snapshot counts, path_of) stays inside the namespace; the pools and the four eviction orders are
// the cache's, so eviction is global across namespaces.
#include <algorithm>
#include <unordered_set>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

void PrefixCache::remove_root_if_empty(Node* root) {
  if (root == tree_.root() || !root->children.empty() || root->lock_count > 0 || root->host_pin > 0)
    return;
  tree_.remove_root(root);
}

void PrefixCache::raise_priority(Node* n, RetentionPriority p, bool kv, bool snapshot) {
  if (kv) n->kv_priority = std::max(n->kv_priority, p);
  if (snapshot) n->snap_priority = std::max(n->snap_priority, p);
  refresh(n);
}

void PrefixCache::flush(NamespaceId ns) {
  Node* root = root_of(ns);
  if (root == nullptr) return;
  drain();  // copies in flight pin their nodes
  // Deepest first, so a node is dropped after its children (leaf-first, as flush()): its
  // KV is then evictable on each tier unless a lock or a pin keeps it.
  std::vector<Node*> nodes;
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!n->is_root()) nodes.push_back(n);
    for (auto& [key, c] : n->children) stack.push_back(c);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const Node* a, const Node* b) { return a->boundary > b->boundary; });
  std::vector<const Node*> removed_list;
  std::unordered_set<const Node*> removed;
  for (Node* n : nodes) {
    if (removed.count(n) != 0) continue;
    // Every row (only the default namespace has store rows); what a lock or a pin holds stays.
    for_each_tier([this, n]<Tier T>() {
      if (n->snapshot_evictable<T>()) drop_snapshot<T>(n);
      if (n->kv_evictable<T>()) {
        dropped_pages<T>() += n->row<T>().pages.size();
        free_kv<T>(n);  // removed below, with what it empties
      }
    });
    // The root is never listed, so this cannot free a node still to be visited but an
    // ancestor already emptied: those are recorded and skipped.
    removed_list.clear();
    remove_if_empty(n, &removed_list);
    removed.insert(removed_list.begin(), removed_list.end());
  }
  if (host_.link != nullptr && ns == kDefaultNamespace) (void)host_.link->sync();
}

}  // namespace radixtier
