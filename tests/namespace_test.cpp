// Key namespaces (issue 15 item 8): the same tokens in two namespaces never share KV or
// snapshots, eviction stays one global order, release and flush keep to their namespace.
#include <gtest/gtest.h>

#include <algorithm>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "side_request.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;
using testing::take_pages;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

RequestOptions in(std::uint32_t ns, RetentionPriority priority = kDefaultPriority) {
  return RequestOptions{NamespaceId(ns), priority};
}

// The harness writes bytes that depend on the namespace: a page or a snapshot handed to a
// request of another namespace would fail the byte check.
TEST(Namespaces, SameTokensInTwoNamespacesShareNoPagesOrSnapshots) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {50, 1}});
  const std::size_t snaps[] = {8, 16};
  for (std::uint32_t ns : {0u, 7u}) {
    h.request_options = in(ns);
    auto first = h.serve(p, snaps);
    ASSERT_EQ(first.error, "");
    EXPECT_EQ(first.cached, 0u) << "namespace " << ns << " reused another namespace's prefix";
    ASSERT_INVARIANTS(h);
  }
  EXPECT_EQ(h.cache->match(p, NamespaceId(7)).usable_tokens, 16u);
  EXPECT_EQ(h.cache->match(p, NamespaceId(3)).usable_tokens, 0u);  // never used
  EXPECT_TRUE(h.cache->inspect(p, NamespaceId(3)).empty());
  for (std::uint32_t ns : {0u, 7u}) {
    h.request_options = in(ns);
    auto again = h.serve(p, snaps);
    EXPECT_EQ(again.cached, 16u);
    EXPECT_TRUE(again.bytes_ok) << "namespace " << ns << " got bytes of another namespace";
  }
  // The two matches hold disjoint pages and distinct snapshot slots.
  auto a = h.cache->admit(p, in(0));
  auto b = h.cache->admit(p, in(7));
  ASSERT_TRUE(a && b);
  auto pa = h.cache->path_pages(a->lock), pb = h.cache->path_pages(b->lock);
  ASSERT_TRUE(pa && pb);
  ASSERT_EQ(pa->size(), 4u);
  for (GpuPageId id : *pa) EXPECT_EQ(std::count(pb->begin(), pb->end(), id), 0);
  EXPECT_NE(*h.cache->path_snapshot(a->lock), *h.cache->path_snapshot(b->lock));
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_TRUE(h.cache->release(b->lock));
}

// One pool, one order: the older namespace's prefix leaves the GPU first, whichever
// namespace asks for the room.
TEST(Namespaces, EvictionStaysGlobalAcrossNamespaces) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const auto q = seq({{100, 8}, {60, 1}});
  const std::size_t snaps[] = {8};
  h.request_options = in(1);
  ASSERT_EQ(h.serve(p, snaps).error, "");  // older
  h.request_options = in(2);
  ASSERT_EQ(h.serve(q, snaps).error, "");
  // Eviction takes no namespace: the GPU pool's orders are global. KV first, then a
  // snapshot (pages of the same pool): P's leave each time, Q's stay.
  auto kv = h.cache->evict({1, 0, Tier::kGpu});
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->kv_pages, 2u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p, NamespaceId(1)).at(0).kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(q, NamespaceId(2)).at(0).kv, Residency::kGpu);
  auto snap = h.cache->evict({0, 1, Tier::kGpu});
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->snapshots, 1u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p, NamespaceId(1)).at(0).snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(q, NamespaceId(2)).at(0).snapshot, Residency::kGpu);
  h.request_options = in(1);
  auto back = h.serve(p, snaps);  // promoted back, byte-exact
  EXPECT_EQ(back.cached, 8u);
  EXPECT_TRUE(back.bytes_ok);
}

// A namespace's tree lives while something is in it: a request's lock keeps its root, release
// of the last one removes it; flush(ns) drops one namespace's copies and no other's.
TEST(Namespaces, ReleaseAndFlushKeepToTheirNamespace) {
  Harness h(small_config());
  const Occupancy fresh = h.cache->occupancy();
  const auto p = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  auto a = h.cache->admit(p, in(5));  // nothing cached: locks namespace 5's new root
  ASSERT_TRUE(a);
  EXPECT_EQ(h.cache->namespace_count(), 2u);
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->namespace_count(), 1u);
  EXPECT_EQ(h.cache->occupancy(), fresh);
  ASSERT_INVARIANTS(h);

  for (std::uint32_t ns : {0u, 5u, 6u}) {
    h.request_options = in(ns);
    ASSERT_EQ(h.serve(p, snaps).error, "");
  }
  EXPECT_EQ(h.cache->namespace_count(), 3u);
  auto held = h.cache->admit(p, in(6));  // a running request of namespace 6 keeps its path
  ASSERT_TRUE(held);
  h.cache->flush(NamespaceId(5));
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(p, NamespaceId(5)).usable_tokens, 0u);
  EXPECT_EQ(h.cache->namespace_count(), 2u);  // its root went with its tree
  EXPECT_EQ(h.cache->match(p).usable_tokens, 8u);
  h.cache->flush(NamespaceId(6));
  // Locked: the KV is kept (its snapshot is in the request's live slot, the cached one goes).
  EXPECT_EQ(h.cache->match(p, NamespaceId(6)).kv_tokens, 8u);
  ASSERT_TRUE(h.cache->release(held->lock));
  h.cache->flush();
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->namespace_count(), 1u);
  EXPECT_EQ(h.cache->occupancy(), fresh);
}

TEST(Namespaces, BadOptionsAreRefusedAndChangeNothing) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const std::vector<Token> known[] = {p};
  h.cache->poll();
  const auto before = h.fingerprint(known);
  auto bad_ns = h.cache->admit(p, RequestOptions{NamespaceId(), kDefaultPriority});
  EXPECT_EQ(bad_ns.status().code(), ErrorCode::kInvalidArgument);
  auto bad_priority = h.cache->admit(p, RequestOptions{kDefaultNamespace, 101});
  EXPECT_EQ(bad_priority.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad_priority.status().message().find("priority"), std::string::npos);
  EXPECT_EQ(before.difference(h.fingerprint(known)), "");
  EXPECT_EQ(h.cache->namespace_count(), 1u);
}

}  // namespace
}  // namespace radixtier
