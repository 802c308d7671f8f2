// The GPU "hybrid radix cache" of the index-based baseline (see docs/index-tier.md).
//
// A plain radix tree over token ids at page granularity; children keyed by their first page.
// Every node in this tree holds its KV pages on the GPU: KV eviction removes the node.
// Only the snapshot has a second state:
//
//   Node states (snapshot):   live  (snapshot valid)        -- the node is a resume point
//                             tombstone (snapshot invalid)  -- KV kept, no resume point
//   live -> tombstone   evict_snapshots()           (on_evict_node fires first, slot valid)
//   tombstone -> live   match() via on_match_dead_snapshot, or insert() with a slot
//   any -> removed      evict_kv() (unlocked leaves), or evict_snapshots() of a leaf when no
//                       host tier is wired
//
// Eviction candidates are rebuilt by walking the whole tree on every call, ordered by a
// last-access stamp (a logical clock). That walk is one of the baseline's measured costs:
// walk_nodes() counts the nodes it visits. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "radixtier/cache/id_pool.hpp"
#include "radixtier/ids.hpp"

namespace radixtier::index_tier {

struct TreeNode {
  TreeNode* parent = nullptr;
  std::map<std::vector<Token>, std::unique_ptr<TreeNode>> children;  ///< by first page
  std::vector<Token> key;           ///< this node's own tokens (a page multiple)
  std::vector<GpuPageId> pages;     ///< one GPU page per page of `key`
  GpuSlotId snapshot;               ///< snapshot at this node's end; invalid: tombstone
  std::uint32_t full_lock = 0;      ///< locks of requests whose path passes through here
  std::uint32_t snapshot_lock = 0;  ///< locks of requests that resume from this node
  std::uint64_t last_access = 0;
  std::size_t boundary = 0;  ///< tokens from the root to this node's end

  bool is_leaf() const { return children.empty(); }
};

/// The three hooks the host tier wires into the tree.
class TreeHooks {
 public:
  virtual ~TreeHooks() = default;
  /// A node on the match path has no snapshot; return a freshly filled GPU slot (owned by
  /// the tree from then on) or an invalid id.
  virtual GpuSlotId on_match_dead_snapshot(const TreeNode& node) = 0;
  /// The node's KV pages (and its ancestors', all on GPU) are about to be freed.
  virtual void on_evict_kv(const TreeNode& node) = 0;
  /// The node's snapshot is about to be freed; the slot is still valid.
  virtual void on_evict_node(const TreeNode& node) = 0;
};

struct TreeMatch {
  TreeNode* node = nullptr;       ///< deepest node with a live snapshot (root: none)
  std::size_t cached_tokens = 0;  ///< node->boundary
  bool revived = false;           ///< node's snapshot came back through the hook
  std::size_t kv_tokens = 0;      ///< page-aligned prefix whose KV is in the tree, snapshot or
                                  ///< not (a partially matched node counts its common pages)
};

struct TreeInsert {
  TreeNode* end = nullptr;         ///< node ending at tokens.size() (root when empty)
  std::size_t existing_pages = 0;  ///< leading pages the tree already had
  bool snapshot_taken = false;
};

class HybridRadixTree {
 public:
  /// `hooks` may be null (no host tier wired). Pools must outlive the tree.
  HybridRadixTree(std::uint32_t page_size, IdPool<GpuPageId>& pages, IdPool<GpuSlotId>& slots,
                  TreeHooks* hooks);
  ~HybridRadixTree();
  HybridRadixTree(const HybridRadixTree&) = delete;
  HybridRadixTree& operator=(const HybridRadixTree&) = delete;

  TreeNode* root() { return root_.get(); }
  const TreeNode* root() const { return root_.get(); }

  /// `tokens` must be page-aligned. Stamps every fully passed node, then walks back up to
  /// the first node with a live snapshot, asking the hook to revive each dead one on the way.
  TreeMatch match(std::span<const Token> tokens);
  /// The tree's GPU pages along `tokens` (page-aligned), without side effects.
  std::vector<GpuPageId> pages_along(std::span<const Token> tokens) const;
  /// Adopts pages[existing_pages..] (callers must hold them); the caller keeps the rest.
  /// An existing live snapshot at the end node wins; the root never holds one.
  TreeInsert insert(std::span<const Token> tokens, std::span<const GpuPageId> pages,
                    GpuSlotId slot);

  /// +1 snapshot lock on `n`, +1 full lock on `n` and every ancestor below the root.
  void lock(TreeNode* n);
  void unlock(TreeNode* n);

  /// Frees at least `pages` GPU pages if unlocked leaves allow; returns the pages freed.
  std::size_t evict_kv(std::size_t pages);
  /// Frees at least `slots` GPU snapshot slots if unlocked snapshots allow; returns freed.
  std::size_t evict_snapshots(std::size_t slots);

  std::vector<Token> prefix_tokens(const TreeNode* n) const;
  std::vector<GpuPageId> prefix_pages(const TreeNode* n) const;

  std::size_t node_count() const { return node_count_; }
  std::uint64_t walk_nodes() const { return walk_nodes_; }
  std::uint64_t kv_pages_evicted() const { return kv_pages_evicted_; }
  std::uint64_t snapshots_evicted() const { return snapshots_evicted_; }

  /// Structure and id ownership of the tree: every node's pages and snapshot are held by
  /// kNode, keys are page multiples, boundaries add up, a parent's full lock covers its
  /// children's, the root has no snapshot. Returns "" or the first violation; fills the
  /// counts of pages and slots the tree holds.
  std::string check(std::size_t& pages_held, std::size_t& slots_held) const;

 private:
  std::uint64_t stamp() { return ++clock_; }
  std::size_t common_pages(const TreeNode* n, std::span<const Token> tokens, std::size_t pos) const;
  TreeNode* child_at(const TreeNode* n, std::span<const Token> tokens, std::size_t pos) const;
  TreeNode* split(TreeNode* n, std::size_t pages);
  /// Frees a leaf's pages and snapshot (hooks fire first) and deletes it; returns its parent.
  TreeNode* remove_leaf(TreeNode* leaf, std::size_t& freed_pages);
  /// Deletes unlocked snapshot-less parents that became leaves, starting at `n`; returns the
  /// node where it stopped.
  TreeNode* cascade(TreeNode* n, std::size_t& freed_pages);
  template <class F>
  void walk(const F& visit);

  const std::uint32_t page_size_;
  IdPool<GpuPageId>& pages_;
  IdPool<GpuSlotId>& slots_;
  TreeHooks* hooks_;
  std::unique_ptr<TreeNode> root_;
  std::size_t node_count_ = 0;
  std::uint64_t clock_ = 0;
  std::uint64_t walk_nodes_ = 0;
  std::uint64_t kv_pages_evicted_ = 0;
  std::uint64_t snapshots_evicted_ = 0;
};

}  // namespace radixtier::index_tier
