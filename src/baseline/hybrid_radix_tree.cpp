#include "baseline/hybrid_radix_tree.hpp"

#include <algorithm>
#include <cassert>
#include <queue>

namespace radixtier::index_tier {

namespace {

std::vector<Token> first_page(std::span<const Token> tokens, std::size_t pos, std::uint32_t page) {
  return {tokens.begin() + static_cast<std::ptrdiff_t>(pos),
          tokens.begin() + static_cast<std::ptrdiff_t>(pos + page)};
}

struct OlderFirst {
  bool operator()(const TreeNode* a, const TreeNode* b) const {
    return a->last_access > b->last_access;  // min-heap on the stamp
  }
};

}  // namespace

HybridRadixTree::HybridRadixTree(std::uint32_t page_size, IdPool<GpuPageId>& pages,
                                 IdPool<GpuSlotId>& slots, TreeHooks* hooks)
    : page_size_(page_size),
      pages_(pages),
      slots_(slots),
      hooks_(hooks),
      root_(std::make_unique<TreeNode>()) {}

HybridRadixTree::~HybridRadixTree() = default;

template <class F>
void HybridRadixTree::walk(const F& visit) {
  std::vector<TreeNode*> stack{root_.get()};
  while (!stack.empty()) {
    TreeNode* n = stack.back();
    stack.pop_back();
    ++walk_nodes_;
    visit(n);
    for (auto& [k, c] : n->children) stack.push_back(c.get());
  }
}

TreeNode* HybridRadixTree::child_at(const TreeNode* n, std::span<const Token> tokens,
                                    std::size_t pos) const {
  if (pos + page_size_ > tokens.size()) return nullptr;
  auto it = n->children.find(first_page(tokens, pos, page_size_));
  return it == n->children.end() ? nullptr : it->second.get();
}

std::size_t HybridRadixTree::common_pages(const TreeNode* n, std::span<const Token> tokens,
                                          std::size_t pos) const {
  std::size_t pages = 0;
  const std::size_t max_pages =
      std::min(n->key.size(), tokens.size() - pos) / static_cast<std::size_t>(page_size_);
  while (pages < max_pages) {
    const std::size_t off = pages * page_size_;
    if (!std::equal(n->key.begin() + static_cast<std::ptrdiff_t>(off),
                    n->key.begin() + static_cast<std::ptrdiff_t>(off + page_size_),
                    tokens.begin() + static_cast<std::ptrdiff_t>(pos + off)))
      break;
    ++pages;
  }
  return pages;
}

TreeMatch HybridRadixTree::match(std::span<const Token> tokens) {
  assert(tokens.size() % page_size_ == 0);
  TreeNode* node = root_.get();
  node->last_access = stamp();
  std::size_t pos = 0;
  std::size_t partial = 0;  // common tokens with the child where the walk stops
  while (TreeNode* child = child_at(node, tokens, pos)) {
    const std::size_t common = common_pages(child, tokens, pos) * page_size_;
    if (common < child->key.size()) {
      partial = common;
      break;
    }
    child->last_access = stamp();
    node = child;
    pos += child->key.size();
  }
  TreeMatch m;
  m.kv_tokens = pos + partial;
  for (; node != root_.get(); node = node->parent) {
    if (node->snapshot.valid()) break;
    if (hooks_ == nullptr) continue;
    GpuSlotId slot = hooks_->on_match_dead_snapshot(*node);
    if (slot.valid()) {
      assert(slots_.holder(slot) == Holder::kNode);
      node->snapshot = slot;
      m.revived = true;
      break;
    }
  }
  m.node = node;
  m.cached_tokens = node->boundary;
  return m;
}

std::vector<GpuPageId> HybridRadixTree::pages_along(std::span<const Token> tokens) const {
  std::vector<GpuPageId> out;
  const TreeNode* node = root_.get();
  std::size_t pos = 0;
  while (const TreeNode* child = child_at(node, tokens, pos)) {
    const std::size_t common = common_pages(child, tokens, pos);
    out.insert(out.end(), child->pages.begin(),
               child->pages.begin() + static_cast<std::ptrdiff_t>(common));
    if (common * page_size_ < child->key.size()) break;
    node = child;
    pos += child->key.size();
  }
  return out;
}

TreeNode* HybridRadixTree::split(TreeNode* n, std::size_t pages) {
  // The new upper part takes the first `pages` pages and no snapshot; `n` stays the lower
  // part (so lock records pointing at it stay valid) and keeps the snapshot.
  const std::size_t cut = pages * page_size_;
  auto upper = std::make_unique<TreeNode>();
  TreeNode* up = upper.get();
  up->parent = n->parent;
  up->key.assign(n->key.begin(), n->key.begin() + static_cast<std::ptrdiff_t>(cut));
  up->pages.assign(n->pages.begin(), n->pages.begin() + static_cast<std::ptrdiff_t>(pages));
  up->full_lock = n->full_lock;
  up->last_access = n->last_access;
  up->boundary = n->boundary - n->key.size() + cut;

  TreeNode* parent = n->parent;
  auto it = parent->children.find(first_page(n->key, 0, page_size_));
  std::unique_ptr<TreeNode> lower = std::move(it->second);
  parent->children.erase(it);

  n->key.erase(n->key.begin(), n->key.begin() + static_cast<std::ptrdiff_t>(cut));
  n->pages.erase(n->pages.begin(), n->pages.begin() + static_cast<std::ptrdiff_t>(pages));
  n->parent = up;
  up->children.emplace(first_page(n->key, 0, page_size_), std::move(lower));
  parent->children.emplace(first_page(up->key, 0, page_size_), std::move(upper));
  ++node_count_;
  return up;
}

TreeInsert HybridRadixTree::insert(std::span<const Token> tokens, std::span<const GpuPageId> pages,
                                   GpuSlotId slot) {
  assert(tokens.size() % page_size_ == 0 && pages.size() * page_size_ == tokens.size());
  TreeNode* node = root_.get();
  node->last_access = stamp();
  std::size_t pos = 0;
  while (pos < tokens.size()) {
    TreeNode* child = child_at(node, tokens, pos);
    if (child == nullptr) {
      auto leaf = std::make_unique<TreeNode>();
      leaf->parent = node;
      leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos), tokens.end());
      leaf->pages.assign(pages.begin() + static_cast<std::ptrdiff_t>(pos / page_size_),
                         pages.end());
      for (GpuPageId p : leaf->pages) pages_.reassign(p, Holder::kNode);
      leaf->boundary = tokens.size();
      leaf->last_access = stamp();
      TreeNode* raw = leaf.get();
      node->children.emplace(first_page(leaf->key, 0, page_size_), std::move(leaf));
      ++node_count_;
      node = raw;
      break;
    }
    const std::size_t common = common_pages(child, tokens, pos);
    if (common * page_size_ < child->key.size()) child = split(child, common);
    child->last_access = stamp();
    node = child;
    pos += child->key.size();
  }
  TreeInsert r;
  r.end = node;
  r.existing_pages = pos / page_size_;
  if (node != root_.get() && slot.valid() && !node->snapshot.valid()) {
    slots_.reassign(slot, Holder::kNode);
    node->snapshot = slot;
    r.snapshot_taken = true;
  }
  return r;
}

void HybridRadixTree::lock(TreeNode* n) {
  if (n == root_.get()) return;
  ++n->snapshot_lock;
  for (; n != root_.get(); n = n->parent) ++n->full_lock;
}

void HybridRadixTree::unlock(TreeNode* n) {
  if (n == root_.get()) return;
  assert(n->snapshot_lock > 0);
  --n->snapshot_lock;
  for (; n != root_.get(); n = n->parent) {
    assert(n->full_lock > 0);
    --n->full_lock;
  }
}

TreeNode* HybridRadixTree::remove_leaf(TreeNode* leaf, std::size_t& freed_pages) {
  assert(leaf != root_.get() && leaf->is_leaf() && leaf->full_lock == 0);
  if (hooks_ != nullptr) {
    hooks_->on_evict_kv(*leaf);
    if (leaf->snapshot.valid()) hooks_->on_evict_node(*leaf);
  }
  for (GpuPageId p : leaf->pages) pages_.give_back(p);
  freed_pages += leaf->pages.size();
  kv_pages_evicted_ += leaf->pages.size();
  if (leaf->snapshot.valid()) {
    slots_.give_back(leaf->snapshot);
    ++snapshots_evicted_;
  }
  TreeNode* parent = leaf->parent;
  parent->children.erase(first_page(leaf->key, 0, page_size_));  // deletes leaf
  --node_count_;
  return parent;
}

TreeNode* HybridRadixTree::cascade(TreeNode* n, std::size_t& freed_pages) {
  while (n != root_.get() && n->is_leaf() && n->full_lock == 0 && !n->snapshot.valid()) {
    n = remove_leaf(n, freed_pages);
  }
  return n;
}

std::size_t HybridRadixTree::evict_kv(std::size_t pages) {
  std::priority_queue<TreeNode*, std::vector<TreeNode*>, OlderFirst> heap;
  walk([&](TreeNode* n) {
    if (n != root_.get() && n->is_leaf() && n->full_lock == 0) heap.push(n);
  });
  std::size_t freed = 0;
  while (freed < pages && !heap.empty()) {
    TreeNode* leaf = heap.top();
    heap.pop();
    TreeNode* stop = cascade(remove_leaf(leaf, freed), freed);
    // A parent that became an unlocked leaf but keeps a snapshot is a new candidate.
    if (stop != root_.get() && stop->is_leaf() && stop->full_lock == 0) heap.push(stop);
  }
  return freed;
}

std::size_t HybridRadixTree::evict_snapshots(std::size_t slots) {
  std::vector<TreeNode*> candidates;
  walk([&](TreeNode* n) {
    if (n != root_.get() && n->snapshot.valid() && n->snapshot_lock == 0) candidates.push_back(n);
  });
  std::sort(candidates.begin(), candidates.end(),
            [](const TreeNode* a, const TreeNode* b) { return a->last_access < b->last_access; });
  std::size_t freed = 0;
  // Removal below only deletes snapshot-less nodes: every candidate not yet visited still
  // has its snapshot, so the raw pointers stay valid.
  for (TreeNode* n : candidates) {
    if (freed >= slots) break;
    if (hooks_ != nullptr) {
      hooks_->on_evict_node(*n);  // tier wired: the node becomes a tombstone in place
      slots_.give_back(n->snapshot);
      n->snapshot = GpuSlotId();
    } else if (n->is_leaf() && n->full_lock == 0) {
      std::size_t pages = 0;
      cascade(remove_leaf(n, pages), pages);  // no tier: the leaf goes with its KV
      ++freed;
      continue;
    } else {
      slots_.give_back(n->snapshot);
      n->snapshot = GpuSlotId();
    }
    ++snapshots_evicted_;
    ++freed;
  }
  return freed;
}

std::vector<Token> HybridRadixTree::prefix_tokens(const TreeNode* n) const {
  std::vector<const TreeNode*> path;
  for (; n != root_.get(); n = n->parent) path.push_back(n);
  std::vector<Token> out;
  for (auto it = path.rbegin(); it != path.rend(); ++it)
    out.insert(out.end(), (*it)->key.begin(), (*it)->key.end());
  return out;
}

std::vector<GpuPageId> HybridRadixTree::prefix_pages(const TreeNode* n) const {
  std::vector<const TreeNode*> path;
  for (; n != root_.get(); n = n->parent) path.push_back(n);
  std::vector<GpuPageId> out;
  for (auto it = path.rbegin(); it != path.rend(); ++it)
    out.insert(out.end(), (*it)->pages.begin(), (*it)->pages.end());
  return out;
}

std::string HybridRadixTree::check(std::size_t& pages_held, std::size_t& slots_held) const {
  pages_held = 0;
  slots_held = 0;
  std::size_t nodes = 0;
  if (root_->snapshot.valid()) return "tree: the root holds a snapshot";
  if (!root_->key.empty() || !root_->pages.empty()) return "tree: the root has tokens";
  std::vector<const TreeNode*> stack{root_.get()};
  while (!stack.empty()) {
    const TreeNode* n = stack.back();
    stack.pop_back();
    std::uint32_t child_locks = 0;
    for (const auto& [k, c] : n->children) {
      if (c->parent != n) return "tree: child's parent pointer is wrong";
      if (c->key.empty() || c->key.size() % page_size_ != 0)
        return "tree: node key is empty or not a page multiple";
      if (c->pages.size() * page_size_ != c->key.size())
        return "tree: node has a page count that does not match its tokens";
      if (k != first_page(c->key, 0, page_size_)) return "tree: child keyed by a wrong page";
      if (c->boundary != n->boundary + c->key.size()) return "tree: boundary does not add up";
      child_locks = std::max(child_locks, c->full_lock);
      stack.push_back(c.get());
    }
    if (n == root_.get()) continue;
    ++nodes;
    if (n->full_lock < child_locks) return "tree: a child is locked more often than its parent";
    if (n->full_lock < n->snapshot_lock) return "tree: snapshot lock exceeds full lock";
    for (GpuPageId p : n->pages) {
      if (!pages_.in_range(p) || pages_.holder(p) != Holder::kNode)
        return "tree: node page not held by a node";
    }
    pages_held += n->pages.size();
    if (n->snapshot.valid()) {
      if (!slots_.in_range(n->snapshot) || slots_.holder(n->snapshot) != Holder::kNode)
        return "tree: node snapshot slot not held by a node";
      ++slots_held;
    }
  }
  if (nodes != node_count_) return "tree: node count is wrong";
  return {};
}

}  // namespace radixtier::index_tier
