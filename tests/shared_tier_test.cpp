// The shared tier's logic over an in-memory store (issue 22): one instance publishes from its
// host copies, another resumes from them byte-exact; values that fail their header, tokens or
// checksum, holes and failed stores are misses that enter nothing wrong.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "memory_shared_store.hpp"
#include "radixtier/shared/shared_tier.hpp"
#include "shared_tier_test_config.hpp"

namespace radixtier {
namespace {

using shared::SharedTier;
using shared::SharedTierConfig;
using testing::Harness;
using testing::MemorySharedStore;
using testing::seq;
using testing::small_config;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

SharedTierConfig tier_config(const CacheConfig& c) {
  SharedTierConfig t = testing::memory_tier_config(c, "test-model");
  t.namespace_salts[5] = "tenant-a";
  return t;
}

struct Instance {
  explicit Instance(MemorySharedStore& store, WritePolicy w = WritePolicy::kWriteThrough,
                    SharedTierConfig (*cfg)(const CacheConfig&) = tier_config)
      : h(small_config(w), HostTransferEngine::Mode::kThreaded) {
    auto t = SharedTier::create(cfg(h.config), *h.cache, h.memory, store);
    if (!t) throw std::runtime_error(t.status().to_string());
    tier = std::move(t).value();
  }
  /// Serves `prompt` with snapshots at `snaps`, then publishes what it inserted.
  void compute_and_publish(std::span<const Token> prompt, std::span<const std::size_t> snaps) {
    ASSERT_EQ(h.serve(prompt, snaps).error, "");
    h.cache->drain();
    tier->publish(prompt.first(snaps.back()), h.request_options.ns);
    tier->flush_publishes();
  }
  Harness h;
  std::unique_ptr<SharedTier> tier;
};

TEST(SharedTier, AnotherInstanceResumesFromWhatOnePublishedByteExact) {
  MemorySharedStore store;
  Instance a(store), b(store, WritePolicy::kWriteBack);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  a.compute_and_publish(prompt, snaps);
  const auto sa = a.tier->stats();
  EXPECT_EQ(sa.publish_jobs, 1u);
  // 10 KV pages, 2 snapshots of 4 chunks and a manifest each.
  EXPECT_EQ(sa.published_keys, 10u + 2 * 5);
  EXPECT_EQ(store.data().size(), 20u);

  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(f.tokens, 40u);
  EXPECT_GT(f.bytes, 0u);
  ASSERT_INVARIANTS(b.h);
  auto served = b.h.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 40u);
  EXPECT_TRUE(served.bytes_ok);
  const auto sb = b.tier->stats();
  EXPECT_EQ(sb.imports, 1u);
  EXPECT_EQ(sb.imported_pages, 10u);
  EXPECT_EQ(sb.imported_snapshots, 1u);
  EXPECT_EQ(sb.values_rejected, 0u);

  // Publishing again writes nothing new: every key is there.
  a.tier->publish(std::span(prompt).first(40), kDefaultNamespace);
  a.tier->flush_publishes();
  EXPECT_EQ(a.tier->stats().published_keys, sa.published_keys);
  EXPECT_EQ(a.tier->stats().publish_skipped, 20u);
}

// Once published, a node's host copy of what the GPU holds leaves host first (node.hpp,
// KeyClass::kCopy). A later publish of a deeper turn still goes from the root: the published
// pages without a host copy go as keys only, skipped where the tier has them, and the new
// pages are written; another instance resumes the whole turn byte-exact. Where the tier lost
// them, nothing deeper is written (a reader could not reach it), counted as a failure.
TEST(SharedTier, APublishGoesOnPastPublishedPagesWhoseHostCopyLeft) {
  for (bool lost : {false, true}) {
    SCOPED_TRACE(lost ? "the tier lost turn 1" : "the tier has turn 1");
    MemorySharedStore store;
    Instance a(store), b(store, WritePolicy::kWriteBack);
    const auto turn1 = seq({{1, 40}, {90, 1}});
    const std::size_t snaps1[] = {40};
    a.compute_and_publish(turn1, snaps1);
    ASSERT_EQ(store.data().size(), 10u + 5);
    auto freed = a.h.cache->evict({40, 0, Tier::kHost});  // the published copies go first
    ASSERT_TRUE(freed);
    ASSERT_EQ(a.h.cache->inspect(turn1).at(0).kv, Residency::kGpu);
    ASSERT_INVARIANTS(a.h);
    if (lost) store.data().clear();

    const auto turn2 = seq({{1, 40}, {200, 16}, {90, 1}});
    const std::size_t snaps2[] = {56};
    const auto before = a.tier->stats();
    a.compute_and_publish(turn2, snaps2);
    const auto after = a.tier->stats();
    EXPECT_EQ(after.publish_jobs, before.publish_jobs + 1);
    if (lost) {
      EXPECT_EQ(store.data().size(), 0u);
      EXPECT_EQ(after.publish_failures, before.publish_failures + 1);
      EXPECT_EQ(b.tier->before_admit(1, turn2, kDefaultNamespace).tokens, 0u);
      continue;
    }
    // Turn 1's 10 pages as keys only, and its snapshot's 4 chunks and manifest from its
    // host copy, all there already.
    EXPECT_EQ(after.publish_skipped, before.publish_skipped + 10 + 5);
    EXPECT_EQ(after.published_keys, before.published_keys + 4 + 5);
    EXPECT_EQ(b.tier->before_admit(1, turn2, kDefaultNamespace).tokens, 56u);
    const std::size_t all[] = {40, 56};
    const auto served = b.h.serve(turn2, all);
    EXPECT_EQ(served.cached, 56u);
    EXPECT_TRUE(served.bytes_ok);
    ASSERT_INVARIANTS(b.h);
  }
}

TEST(SharedTier, ACorruptValueIsAMissAndTheFetchResumesBelowIt) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  a.compute_and_publish(prompt, snaps);
  // One byte of every value of the deepest snapshot's chunk 1, and of KV page 6, flipped.
  int flipped = 0;
  for (auto& [k, v] : store.data()) {
    const bool deep_chunk = k.ends_with(":c1");
    if (deep_chunk) {
      v[v.size() - 1] ^= 0x5a;
      ++flipped;
    }
  }
  ASSERT_EQ(flipped, 2);  // both snapshots' chunk 1
  Instance b(store, WritePolicy::kWriteBack);
  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(f.tokens, 0u);  // no snapshot arrived whole
  EXPECT_GE(b.tier->stats().values_rejected, 2u);
  EXPECT_EQ(b.tier->stats().fetch_failures, 1u);
  EXPECT_EQ(b.h.cache->match(prompt).usable_tokens, 0u);
  ASSERT_INVARIANTS(b.h);
}

TEST(SharedTier, AMissingChunkFallsBackToTheNextBoundary) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  a.compute_and_publish(prompt, snaps);
  // The deepest snapshot loses a chunk (maxmemory eviction): its manifest is still there.
  std::string deep;
  for (const auto& [k, v] : store.data()) {
    if (k.ends_with(":m")) {
      // boundary of the value (offset 40, 8 bytes LE)
      if (static_cast<unsigned char>(v[40]) == 40) deep = k.substr(0, k.size() - 1);
    }
  }
  ASSERT_FALSE(deep.empty());
  ASSERT_EQ(store.data().erase(deep + "c2"), 1u);
  Instance b(store, WritePolicy::kWriteBack);
  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(f.tokens, 16u);
  EXPECT_EQ(b.tier->stats().fallbacks, 1u);
  auto served = b.h.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 16u);
  EXPECT_TRUE(served.bytes_ok);
  ASSERT_INVARIANTS(b.h);
}

TEST(SharedTier, KvWithAHoleResumesAboveTheHole) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  a.compute_and_publish(prompt, snaps);
  // A KV page between the two snapshots goes (page 6: tokens 24..28).
  std::size_t erased = 0;
  for (auto it = store.data().begin(); it != store.data().end();) {
    const auto& v = it->second;
    if (it->first.ends_with(":kv") && static_cast<unsigned char>(v[40]) == 28) {
      it = store.data().erase(it);
      ++erased;
    } else {
      ++it;
    }
  }
  ASSERT_EQ(erased, 1u);
  Instance b(store, WritePolicy::kWriteBack);
  EXPECT_EQ(b.tier->before_admit(1, prompt, kDefaultNamespace).tokens, 16u);
  auto served = b.h.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 16u);
  EXPECT_TRUE(served.bytes_ok);
}

TEST(SharedTier, ABoundaryInsideTheLocalKvFetchesOnlyItsSnapshot) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40}, b_snaps[] = {16};
  a.compute_and_publish(prompt, snaps);
  Instance b(store, WritePolicy::kWriteBack);
  ASSERT_EQ(b.h.serve(prompt, b_snaps).error, "");  // KV to 40, a snapshot at 16 only
  EXPECT_EQ(b.h.cache->match(prompt).usable_tokens, 16u);
  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(f.tokens, 40u);
  EXPECT_EQ(b.tier->stats().imported_pages, 0u);
  EXPECT_EQ(b.tier->stats().imported_snapshots, 1u);
  auto served = b.h.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 40u);
  EXPECT_TRUE(served.bytes_ok);
  ASSERT_INVARIANTS(b.h);
}

SharedTierConfig other_model(const CacheConfig& c) {
  SharedTierConfig t = tier_config(c);
  t.model.weights_version = "v2";
  return t;
}

TEST(SharedTier, OtherWeightsOrANamespaceWithoutASaltShareNothing) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {40};
  a.compute_and_publish(prompt, snaps);
  Instance b(store, WritePolicy::kWriteBack, other_model);
  EXPECT_EQ(b.tier->before_admit(1, prompt, kDefaultNamespace).tokens, 0u);
  EXPECT_EQ(b.tier->stats().fetches, 0u);
  // Namespace 5 is shared under its salt, namespace 6 is not shared at all.
  Instance c(store, WritePolicy::kWriteBack);
  EXPECT_EQ(c.tier->before_admit(1, prompt, NamespaceId(5)).tokens, 0u);
  EXPECT_EQ(c.tier->before_admit(1, prompt, NamespaceId(6)).tokens, 0u);
  EXPECT_EQ(c.tier->stats().lookups, 1u);  // only namespace 5 probed
  a.h.request_options.ns = NamespaceId(5);
  a.compute_and_publish(prompt, snaps);
  c.h.request_options.ns = NamespaceId(5);
  EXPECT_EQ(c.tier->before_admit(1, prompt, NamespaceId(5)).tokens, 40u);
  auto served = c.h.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 40u);
  EXPECT_TRUE(served.bytes_ok);
}

TEST(SharedTier, AFailedStoreIsAMissAndChangesNothing) {
  MemorySharedStore store;
  Instance a(store);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {40};
  a.compute_and_publish(prompt, snaps);
  store.fail(true);
  Instance b(store, WritePolicy::kWriteBack);
  EXPECT_EQ(b.tier->before_admit(1, prompt, kDefaultNamespace).tokens, 0u);
  EXPECT_EQ(b.tier->stats().probe_failures, 1u);
  EXPECT_EQ(b.h.cache->occupancy().nodes, 1u);
  // Publishing into a failed store fails, counted, and the cache goes on.
  a.tier->publish(std::span(prompt).first(40), kDefaultNamespace);
  a.tier->flush_publishes();
  EXPECT_EQ(a.tier->stats().publish_failures, 1u);
  ASSERT_INVARIANTS(a.h);
}

TEST(SharedTier, AFullPublishQueueDropsAndCounts) {
  MemorySharedStore store;
  auto tiny_queue = [](const CacheConfig& c) {
    SharedTierConfig t = tier_config(c);
    t.publish_queue_bytes = 100;  // less than one KV page value
    return t;
  };
  Instance a(store, WritePolicy::kWriteThrough, tiny_queue);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {40};
  a.compute_and_publish(prompt, snaps);
  EXPECT_EQ(a.tier->stats().publish_dropped, 1u);
  EXPECT_TRUE(store.data().empty());
}

TEST(SharedTier, AGeometryOtherThanTheCachesIsRefused) {
  MemorySharedStore store;
  Harness h(small_config());
  SharedTierConfig t = tier_config(h.config);
  t.model.page_bytes += 1;
  EXPECT_EQ(SharedTier::create(t, *h.cache, h.memory, store).status().code(),
            ErrorCode::kInvalidArgument);
  t = tier_config(h.config);
  t.probe_deadline = std::chrono::milliseconds(0);
  EXPECT_EQ(SharedTier::create(t, *h.cache, h.memory, store).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixtier
