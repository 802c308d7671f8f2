// The parts PrefixCache is composed of, on their own: the tree (RadixTree) and a tier's
// eviction orders (TierOrders<T>), with real nodes.
#include <gtest/gtest.h>

#include <vector>

#include "radixtier/cache/radix_tree.hpp"
#include "radixtier/cache/tier_orders.hpp"

namespace radixtier {
namespace {

std::vector<Token> tokens(Token first, std::size_t n) {
  std::vector<Token> t;
  for (std::size_t i = 0; i < n; ++i) t.push_back(first + Token(i));
  return t;
}

TEST(RadixTree, NodesAndRootsAreCountedAndFoundByTheirFirstPage) {
  RadixTree tree(4);
  EXPECT_EQ(tree.node_count(), 1u) << "the default namespace's root";
  const std::vector<Token> a = tokens(100, 8);
  Node* n = tree.new_node(tree.root(), a);
  EXPECT_EQ(n->boundary, 8u);
  EXPECT_EQ(tree.find_child(tree.root(), std::span<const Token>(a), 0), n);
  EXPECT_EQ(tree.common_pages(n, std::span<const Token>(a), 0), 2u);
  const std::vector<std::int64_t> wide(a.begin(), a.end());
  EXPECT_EQ(tree.find_child(tree.root(), std::span<const std::int64_t>(wide), 0), n);
  std::vector<Token> other = a;
  other[5] = 7;  // differs in the second page
  EXPECT_EQ(tree.common_pages(n, std::span<const Token>(other), 0), 1u);

  Node* r7 = tree.ensure_root(NamespaceId(7));
  EXPECT_EQ(tree.ensure_root(NamespaceId(7)), r7) << "made once";
  EXPECT_EQ(tree.root_of(NamespaceId(8)), nullptr);
  EXPECT_EQ(tree.roots().size(), 2u);
  EXPECT_EQ(tree.node_count(), 3u);
  tree.remove_root(r7);
  EXPECT_EQ(tree.root_of(NamespaceId(7)), nullptr);
  EXPECT_EQ(tree.node_count(), 2u);
}

TEST(RadixTree, SplitPutsANewNodeAboveWithTheFirstPages) {
  RadixTree tree(4);
  const std::vector<Token> a = tokens(100, 12);
  Node* n = tree.new_node(tree.root(), a);
  Node* upper = tree.split_tokens(n, 1);
  EXPECT_EQ(upper->parent, tree.root());
  EXPECT_EQ(n->parent, upper);
  EXPECT_EQ(upper->tokens, tokens(100, 4));
  EXPECT_EQ(n->tokens, tokens(104, 8));
  EXPECT_EQ(upper->boundary, 4u);
  EXPECT_EQ(n->boundary, 12u);
  EXPECT_EQ(tree.find_child(tree.root(), std::span<const Token>(a), 0), upper);
  EXPECT_EQ(tree.find_child(upper, std::span<const Token>(a), 4), n);
  EXPECT_EQ(RadixTree::path_of(n), (std::vector<Node*>{upper, n}));
  EXPECT_EQ(tree.node_count(), 3u);
  tree.free_leaf(n);
  EXPECT_TRUE(upper->children.empty());
  EXPECT_EQ(tree.node_count(), 2u);
}

TEST(TierOrders, ASharedPoolTakesTheLowerHeadAndItsAgeOnlyRises) {
  RadixTree tree(4);
  Node* a = tree.new_node(tree.root(), tokens(100, 4));
  Node* b = tree.new_node(tree.root(), tokens(200, 4));
  TierOrders<Tier::kHost> host;
  host.sync<Held::kKv>(*a, true, OrderKey{KeyClass::kLive, 5.0, 1, 0});
  host.sync<Held::kSnapshot>(*b, true, OrderKey{KeyClass::kLive, 3.0, 2, 0});
  bool snapshot = false;
  EXPECT_EQ(host.victim(snapshot), b);
  EXPECT_TRUE(snapshot) << "the snapshot's key is lower";
  host.sync<Held::kSnapshot>(*b, true, OrderKey{KeyClass::kLive, 5.0, 1, 0});
  EXPECT_EQ(host.victim(snapshot), a);
  EXPECT_FALSE(snapshot) << "a tie goes to the KV";

  // A victim's own key (its row's, of the kind taken) ages the pool.
  Node* v = tree.new_node(tree.root(), tokens(300, 4));
  v->host.snap_key = OrderKey{KeyClass::kLive, 4.0, 0, 0};
  host.aged_by(Held::kSnapshot, *v);
  EXPECT_EQ(host.age(Held::kKv), 4.0) << "one pool, one age";
  v->host.kv_key = OrderKey{KeyClass::kLive, 2.0, 0, 0};
  host.aged_by(Held::kKv, *v);
  EXPECT_EQ(host.age(Held::kKv), 4.0) << "ages never fall";
  v->host.kv_key = OrderKey{KeyClass::kDead, 9.0, 0, 0};
  host.aged_by(Held::kKv, *v);
  EXPECT_EQ(host.age(Held::kKv), 4.0) << "a dead victim does not age the pool";
  v->host.kv_key = OrderKey{KeyClass::kCopy, 9.0, 0, 0};
  host.aged_by(Held::kKv, *v);
  EXPECT_EQ(host.age(Held::kKv), 4.0) << "nor does a copy of what the GPU holds";

  // The GPU is one pool too (issue 21: cached snapshots are pages of the GPU pool): the lower
  // head of the two orders is the victim and both kinds share one age.
  TierOrders<Tier::kGpu> gpu;
  gpu.sync<Held::kKv>(*a, true, OrderKey{KeyClass::kLive, 5.0, 1, 0});
  gpu.sync<Held::kSnapshot>(*b, true, OrderKey{KeyClass::kLive, 3.0, 2, 0});
  EXPECT_EQ(gpu.victim(snapshot), b);
  EXPECT_TRUE(snapshot) << "the snapshot's key is lower";
  v->gpu.snap_key = OrderKey{KeyClass::kLive, 6.0, 0, 0};
  gpu.aged_by(Held::kSnapshot, *v);
  EXPECT_EQ(gpu.age(Held::kSnapshot), 6.0);
  EXPECT_EQ(gpu.age(Held::kKv), 6.0) << "one GPU pool, one age";
  v->gpu.kv_key = OrderKey{KeyClass::kLive, 2.0, 0, 0};
  gpu.aged_by(Held::kKv, *v);
  EXPECT_EQ(gpu.age(Held::kKv), 6.0) << "ages never fall";
  gpu.sync<Held::kKv>(*a, false, {});
  gpu.sync<Held::kSnapshot>(*b, false, {});
  EXPECT_EQ(gpu.victim(snapshot), nullptr);

  host.sync<Held::kKv>(*a, false, {});
  host.sync<Held::kSnapshot>(*b, false, {});
  EXPECT_EQ(host.victim(snapshot), nullptr);
  EXPECT_FALSE(a->host.kv_hook.is_linked());
}

}  // namespace
}  // namespace radixtier
