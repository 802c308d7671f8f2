// RadixTree (radix_tree.hpp): the nodes' memory, the namespace roots and the walks.
#include "radixtier/cache/radix_tree.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>

#include "vector_clones.hpp"

namespace radixtier {

RadixTree::RadixTree(std::uint32_t page_size) : page_size_(page_size), pool_(sizeof(Node)) {
  root_ = new_node(nullptr, {});
}

RadixTree::~RadixTree() {
  for (auto& [ns, root] : ns_roots_) destroy_subtree(root);
  destroy_subtree(root_);
}

Node* RadixTree::root_of(NamespaceId ns) const {
  if (ns == kDefaultNamespace) return root_;
  auto it = ns_roots_.find(ns.value());
  return it == ns_roots_.end() ? nullptr : it->second;
}

Node* RadixTree::ensure_root(NamespaceId ns) {
  if (Node* r = root_of(ns)) return r;
  Node* r = new_node(nullptr, {});
  ns_roots_.emplace(ns.value(), r);
  return r;
}

void RadixTree::remove_root(Node* root) {
  assert(root != root_);
  for (auto it = ns_roots_.begin(); it != ns_roots_.end(); ++it) {
    if (it->second != root) continue;
    ns_roots_.erase(it);
    destroy_subtree(root);
    return;
  }
}

std::vector<Node*> RadixTree::roots() const {
  std::vector<Node*> out{root_};
  for (const auto& [ns, r] : ns_roots_) out.push_back(r);
  return out;
}

Node* RadixTree::new_node(Node* parent, std::span<const Token> tokens) {
  void* mem = pool_.malloc();
  if (mem == nullptr) throw std::bad_alloc();
  Node* n = new (mem) Node;
  n->parent = parent;
  n->tokens.assign(tokens.begin(), tokens.end());
  n->boundary = (parent ? parent->boundary : 0) + tokens.size();
  if (parent) parent->children.emplace(n->first_page(page_size_), n);
  ++node_count_;
  return n;
}

void RadixTree::free_leaf(Node* n) {
  assert(n->children.empty() && n->parent != nullptr);
  auto& siblings = n->parent->children;
  if (auto it = siblings.find(n->first_page(page_size_)); it != siblings.end() && it->second == n)
    siblings.erase(it);
  n->~Node();
  pool_.free(n);
  --node_count_;
}

void RadixTree::destroy_subtree(Node* top) {
  std::vector<Node*> stack{top};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [key, child] : n->children) stack.push_back(child);
    n->~Node();
    pool_.free(n);
    --node_count_;
  }
}

Node* RadixTree::split_tokens(Node* n, std::size_t pages) {
  assert(pages > 0 && pages < n->page_count(page_size_));
  const std::size_t cut = pages * page_size_;
  Node* parent = n->parent;
  parent->children.erase(n->first_page(page_size_));
  void* mem = pool_.malloc();
  if (mem == nullptr) throw std::bad_alloc();
  Node* upper = new (mem) Node;
  ++node_count_;
  upper->parent = parent;
  upper->tokens.assign(n->tokens.begin(), n->tokens.begin() + cut);
  upper->boundary = n->boundary - (n->tokens.size() - cut);
  n->tokens.erase(n->tokens.begin(), n->tokens.begin() + cut);
  n->parent = upper;
  upper->children.emplace(n->first_page(page_size_), n);
  parent->children.emplace(upper->first_page(page_size_), upper);
  return upper;
}

std::vector<Node*> RadixTree::path_of(Node* n) {
  std::vector<Node*> path;
  for (; n != nullptr && !n->is_root(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

namespace {
/// How many leading tokens of `theirs` equal `mine` (int32 tree tokens), of `len`.
std::size_t common_prefix(const Token* mine, const Token* theirs, std::size_t len) {
  // The common case is a full match: one vectorised memcmp, then find the token only if not.
  if (std::memcmp(mine, theirs, len * sizeof(Token)) == 0) return len;
  return static_cast<std::size_t>(std::mismatch(mine, mine + len, theirs).first - mine);
}
// The int64 walk's one pass over the prompt: AVX2 / AVX-512 clones (vector_clones.hpp), as
// glibc's memcmp has for the int32 walk (baseline x86-64 has no sign-extending vector load).
RADIXTIER_VECTOR_CLONES std::size_t common_prefix(const Token* mine, const std::int64_t* theirs,
                                                  std::size_t len) {
  // int64 against int32: blocks compared branch-free (vectorised, as memcmp), then the block
  // that differs token by token. A value outside int32 differs from every tree token.
  constexpr std::size_t kBlock = 64;
  std::size_t i = 0;
  for (; i + kBlock <= len; i += kBlock) {
    std::uint64_t diff = 0;
    for (std::size_t j = 0; j < kBlock; ++j)
      diff |= static_cast<std::uint64_t>(std::int64_t{mine[i + j]} ^ theirs[i + j]);
    if (diff != 0) break;
  }
  while (i < len && std::int64_t{mine[i]} == theirs[i]) ++i;
  return i;
}
}  // namespace

Node* RadixTree::find_child(const Node* n, std::span<const Token> tokens, std::size_t pos) const {
  if (pos + page_size_ > tokens.size()) return nullptr;
  auto it = n->children.find(PageKey{tokens.data() + pos, page_size_});
  return it == n->children.end() ? nullptr : it->second;
}

Node* RadixTree::find_child(const Node* n, std::span<const std::int64_t> tokens,
                            std::size_t pos) const {
  if (pos + page_size_ > tokens.size()) return nullptr;
  auto it = n->children.find(WidePageKey{tokens.data() + pos, page_size_});
  return it == n->children.end() ? nullptr : it->second;
}

std::size_t RadixTree::common_pages(const Node* n, std::span<const Token> tokens,
                                    std::size_t pos) const {
  const std::size_t avail = (tokens.size() - pos) / page_size_ * page_size_;
  const std::size_t len = std::min(n->tokens.size(), avail);
  return common_prefix(n->tokens.data(), tokens.data() + pos, len) / page_size_;
}

std::size_t RadixTree::common_pages(const Node* n, std::span<const std::int64_t> tokens,
                                    std::size_t pos) const {
  const std::size_t avail = (tokens.size() - pos) / page_size_ * page_size_;
  const std::size_t len = std::min(n->tokens.size(), avail);
  return common_prefix(n->tokens.data(), tokens.data() + pos, len) / page_size_;
}

}  // namespace radixtier
