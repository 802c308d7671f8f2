// RadixTree: the tree part of PrefixCache. It owns the nodes (their memory: one boost pool),
// the root of each key namespace (the default one always, the others from their first use
// until their tree is empty) and the node count; it finds a child by its first page, counts
// the pages a node shares with a query, walks a path and splits a node's tokens. What a node
// holds on each tier, the eviction orders, locks, pins and events are the cache's other parts:
// the tree never decides that a node may go (PrefixCache::remove_if_empty does, then calls
// free_leaf()).
//
// Invariants (PrefixCache::check_invariants() checks them):
//   - every node is reachable from exactly one root, through parent/children links that agree;
//   - a child is keyed in its parent's map by its first page; boundary = parent's + its tokens;
//   - node_count() is the number of nodes reachable from the roots (roots included).
#pragma once

#include <boost/pool/pool.hpp>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/node.hpp"

namespace radixtier {

class RadixTree {
 public:
  explicit RadixTree(std::uint32_t page_size);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  /// The default namespace's root.
  Node* root() const { return root_; }
  /// The root of namespace ns; nullptr if it has no tree.
  Node* root_of(NamespaceId ns) const;
  /// root_of(ns), made if it has none yet.
  Node* ensure_root(NamespaceId ns);
  /// Frees the root of a namespace other than the default one, with its (empty) tree.
  void remove_root(Node* root);
  /// Roots of the namespaces other than the default one, by namespace id.
  const std::unordered_map<std::uint32_t, Node*>& namespace_roots() const { return ns_roots_; }
  /// Every root, the default namespace's first.
  std::vector<Node*> roots() const;
  std::size_t node_count() const { return node_count_; }

  /// A new node holding `tokens` (whole pages), linked under `parent` (nullptr: a root).
  Node* new_node(Node* parent, std::span<const Token> tokens);
  /// Frees the leaf n, unlinking it from its parent's children if it still is there.
  void free_leaf(Node* n);
  /// Cuts n's first `pages` pages into a new node between n and its parent; moves the
  /// tokens and the links only (the caller moves what the rows hold). Returns the new node.
  Node* split_tokens(Node* n, std::size_t pages);

  Node* find_child(const Node* n, std::span<const Token> tokens, std::size_t pos) const;
  Node* find_child(const Node* n, std::span<const std::int64_t> tokens, std::size_t pos) const;
  /// Whole pages of n's tokens equal to tokens[pos, ...).
  std::size_t common_pages(const Node* n, std::span<const Token> tokens, std::size_t pos) const;
  std::size_t common_pages(const Node* n, std::span<const std::int64_t> tokens,
                           std::size_t pos) const;
  /// The nodes from the root (excluded) down to n, root side first.
  static std::vector<Node*> path_of(Node* n);
  /// Calls on_node(node, end) for each node along `tokens` whose KV is present, where `end`
  /// is the token count matched from the root through that node (== node->boundary when the
  /// node matched whole); stops after a partially matched node or before one whose KV is gone.
  template <class T, class F>
  void walk_kv_path(const Node* from, std::span<const T> tokens, F&& on_node) const;

 private:
  void destroy_subtree(Node* top);

  std::uint32_t page_size_;
  boost::pool<> pool_;
  std::size_t node_count_ = 0;
  Node* root_ = nullptr;
  std::unordered_map<std::uint32_t, Node*> ns_roots_;
};

template <class T, class F>
inline void RadixTree::walk_kv_path(const Node* from, std::span<const T> tokens,
                                    F&& on_node) const {
  const Node* n = from;
  if (n == nullptr) return;  // a namespace without a tree
  std::size_t pos = 0;
  for (;;) {
    Node* c = find_child(n, tokens, pos);
    if (c == nullptr || !c->has_kv()) return;
    const std::size_t k = common_pages(c, tokens, pos);
    on_node(c, pos + k * page_size_);
    if (k < c->page_count(page_size_)) return;
    pos += c->tokens.size();
    n = c;
  }
}

}  // namespace radixtier
