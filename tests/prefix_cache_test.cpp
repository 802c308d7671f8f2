#include "radixtier/cache/prefix_cache.hpp"

#include <gtest/gtest.h>

#include <span>
#include <sstream>
#include <thread>

#include "cache_harness.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;

#define EXPECT_INVARIANTS(h) EXPECT_EQ((h).cache->check_invariants(), "")

class PrefixCacheTest : public ::testing::TestWithParam<WritePolicy> {
 protected:
  Harness h{small_config(GetParam())};
};

INSTANTIATE_TEST_SUITE_P(Policies, PrefixCacheTest,
                         ::testing::Values(WritePolicy::kWriteBack, WritePolicy::kWriteThrough),
                         [](const auto& info) {
                           return info.param == WritePolicy::kWriteBack ? "WriteBack"
                                                                        : "WriteThrough";
                         });

/// A change to small_config() and the field its refusal must name.
using ConfigCase = std::pair<const char*, void (*)(CacheConfig&)>;

void expect_refused_naming_the_field(std::span<const ConfigCase> cases) {
  for (auto [field, mutate] : cases) {
    CacheConfig c = small_config();
    mutate(c);
    Status s = c.validate();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << field;
    EXPECT_EQ(s.message().rfind(std::string("CacheConfig.") + field + ":", 0), 0u) << s.message();
  }
}

TEST(CacheConfigTest, RejectsZeroCapacitiesNamingTheField) {
  const ConfigCase cases[] = {
      {"page_size", [](CacheConfig& c) { c.page_size = 0; }},
      {"gpu_pages", [](CacheConfig& c) { c.gpu_pages = 0; }},
      {"gpu_snapshot_slots", [](CacheConfig& c) { c.gpu_snapshot_slots = 0; }},
      {"page_bytes", [](CacheConfig& c) { c.page_bytes = 0; }},
      {"snapshot_bytes", [](CacheConfig& c) { c.snapshot_bytes = 0; }},
      {"slice_pages", [](CacheConfig& c) { c.slice_pages = 0; }},
  };
  expect_refused_naming_the_field(cases);
  CacheConfig c = small_config(WritePolicy::kWriteThrough);
  c.host_pages = 0;
  EXPECT_NE(c.validate().message().find("write_policy"), std::string::npos);
  EXPECT_TRUE(small_config().validate());
}

TEST(CacheConfigTest, RejectsPoolsWhoseBytesWrapNamingTheField) {
  // Each product is a pool an engine allocates as one arena: wrapped, it would be a sliver
  // indexed past its end (a config that validated made HostArenas of 0 bytes).
  constexpr std::size_t kHuge = std::size_t{1} << 61;
  const ConfigCase cases[] = {
      {"page_bytes", [](CacheConfig& c) { c.page_bytes = std::size_t{1} << 62; }},
      {"snapshot_bytes", [](CacheConfig& c) { c.snapshot_bytes = std::size_t{1} << 62; }},
      {"page_bytes", [](CacheConfig& c) { c.page_bytes = kHuge; }},  // x gpu_pages
      {"snapshot_bytes",
       [](CacheConfig& c) {
         c.snapshot_bytes = kHuge;
         c.page_bytes = kHuge;
         c.gpu_pages = 2;
         c.slice_pages = 1;
         c.host_pages = 0;
         c.host_snapshot_slots = 0;
         c.gpu_snapshot_slots = 8;
       }},
      {"host_pages",
       [](CacheConfig& c) {
         c.page_bytes = std::size_t{1} << 40;
         c.gpu_pages = 8;
         c.slice_pages = 1;
         c.host_pages = 1u << 24;
       }},
  };
  expect_refused_naming_the_field(cases);
}

TEST(PrefixCacheCreate, RefusesInvalidConfig) {
  CacheConfig c = small_config();
  c.gpu_pages = 0;
  HostArenas mem(small_config());
  HostTransferEngine engine(mem, 3);
  auto r = PrefixCache::create(c, engine);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
}

TEST_P(PrefixCacheTest, EmptyCacheMatchesNothing) {
  auto prompt = seq({{1, 9}});
  auto a = h.cache->admit(prompt);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 0u);
  EXPECT_FALSE(a->promoting);
  EXPECT_INVARIANTS(h);
  EXPECT_TRUE(h.cache->release(a->lock));
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, ReusesInsertedPrefixAndKeepsTheLastTokenComputed) {
  auto prompt = seq({{1, 16}});  // 4 pages
  const std::size_t snaps[] = {8, 16};
  auto first = h.serve(prompt, snaps);
  EXPECT_EQ(first.cached, 0u);
  EXPECT_EQ(first.error, "");
  EXPECT_INVARIANTS(h);
  // Same prompt: the snapshot at 16 is not usable (the last token must be computed).
  auto again = h.serve(prompt, snaps);
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
  // A longer prompt reuses all 16.
  auto longer = seq({{1, 16}, {100, 3}});
  auto third = h.serve(longer, snaps);
  EXPECT_EQ(third.cached, 16u);
  EXPECT_TRUE(third.bytes_ok);
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, MatchNeverUsesAShorterSnapshotForADeeperNode) {
  auto prompt = seq({{1, 24}, {500, 1}});
  const std::size_t snaps[] = {8, 24};
  h.serve(prompt, snaps);
  MatchResult m = h.cache->match(std::span(prompt).first(24));
  EXPECT_EQ(m.usable_tokens, 24u);
  EXPECT_EQ(m.kv_tokens, 24u);
  // A query ending between the snapshots resumes from the one below its end, never above.
  MatchResult mid = h.cache->match(std::span(prompt).first(20));
  EXPECT_EQ(mid.usable_tokens, 8u);
  EXPECT_EQ(mid.kv_tokens, 20u);
  // admit() reports the same KV depth (on all but the last prompt token) with its lock.
  auto admitted = h.cache->admit(std::span(prompt).first(21));
  ASSERT_TRUE(admitted) << admitted.status().to_string();
  EXPECT_EQ(admitted->cached_tokens, 8u);
  EXPECT_EQ(admitted->kv_tokens, 20u);
  EXPECT_TRUE(h.cache->wait(admitted->lock));
  EXPECT_TRUE(h.cache->release(admitted->lock));
}

TEST_P(PrefixCacheTest, DivergingInsertSplitsTheNode) {
  auto a = seq({{1, 32}, {900, 1}});
  auto b = seq({{1, 12}, {300, 20}, {901, 1}});
  const std::size_t snaps_a[] = {32};
  const std::size_t snaps_b[] = {24};
  h.serve(a, snaps_a);
  h.serve(b, snaps_b);
  EXPECT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(a).usable_tokens, 32u);
  EXPECT_EQ(h.cache->match(b).usable_tokens, 24u);
  // The shared 12 tokens exist once, with no snapshot at the split.
  EXPECT_EQ(h.cache->match(std::span(a).first(12)).kv_tokens, 12u);
  EXPECT_EQ(h.cache->match(std::span(a).first(12)).usable_tokens, 0u);
  auto again = h.serve(a, snaps_a);
  EXPECT_EQ(again.cached, 32u);
  EXPECT_TRUE(again.bytes_ok);
}

TEST_P(PrefixCacheTest, DuplicateInsertHandsBackTheRequestsPages) {
  auto prompt = seq({{1, 8}, {77, 1}});
  const std::size_t snaps[] = {8};
  h.serve(prompt, snaps);
  // A second request computes the same 8 tokens itself (admitted before the first inserted).
  auto a = h.cache->admit(seq({{1, 8}}));  // matches nothing: the last token rule
  ASSERT_TRUE(a);
  auto pages = h.cache->alloc_pages(a->lock, 2);
  ASSERT_TRUE(pages);
  auto slot = h.cache->alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(slot);
  auto ins = h.cache->insert(a->lock, std::span(prompt).first(8), *pages, *slot);
  ASSERT_TRUE(ins) << ins.status().to_string();
  EXPECT_EQ(ins->not_taken, *pages);
  EXPECT_FALSE(ins->snapshot_taken);
  EXPECT_TRUE(h.cache->free_pages(a->lock, *pages));
  EXPECT_TRUE(h.cache->free_snapshot_slot(a->lock, *slot));
  EXPECT_TRUE(h.cache->release(a->lock));
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, PressureDemotesToHostAndPromotionRestoresTheBytes) {
  auto convo = seq({{1, 40}, {999, 1}});  // 10 pages
  const std::size_t snaps[] = {40};
  h.serve(convo, snaps);
  // Side requests push it out of the 32-page GPU pool (the host tier holds them all).
  for (int i = 0; i < 4; ++i) {
    auto side = seq({{Token(10000 + 1000 * i), 40}, {5, 1}});
    const std::size_t side_snaps[] = {40};
    EXPECT_EQ(h.serve(side, side_snaps).error, "");
    EXPECT_INVARIANTS(h);
  }
  MatchResult m = h.cache->match(convo);
  EXPECT_EQ(m.usable_tokens, 40u);
  EXPECT_GT(m.host_tokens, 0u) << "the conversation should have been demoted";
  auto back = h.serve(convo, snaps);
  EXPECT_EQ(back.cached, 40u);
  EXPECT_TRUE(back.bytes_ok);
  const CacheStats s = h.cache->stats();
  EXPECT_GT(s.kv_pages_demoted, 0u);
  EXPECT_GT(s.kv_pages_promoted, 0u);
  EXPECT_GT(s.bytes_h2d, 0u);
  EXPECT_GT(s.hit_tokens_host, 0u);
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, EvictionGoesLeafFirst) {
  auto base = seq({{1, 16}, {3, 1}});
  const std::size_t snaps[] = {16};
  h.serve(base, snaps);
  auto ext = seq({{1, 16}, {200, 16}, {4, 1}});
  const std::size_t snaps2[] = {32};
  h.serve(ext, snaps2);
  // Ask for nearly the whole pool: the leaf (the extension) must go before its parent.
  auto pages = h.cache->alloc_pages(h.side_lock(), 32 - 4);
  ASSERT_TRUE(pages) << pages.status().to_string();
  h.settle();
  MatchResult m = h.cache->match(ext);
  EXPECT_EQ(m.kv_tokens, 32u);
  EXPECT_GT(m.host_tokens, 0u);
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, LockedPathIsNeverEvicted) {
  auto prompt = seq({{1, 64}, {2, 1}});  // 16 pages
  const std::size_t snaps[] = {64};
  h.serve(prompt, snaps);
  auto a = h.cache->admit(prompt);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 64u);
  ASSERT_TRUE(h.cache->wait(a->lock));
  // 16 pages are pinned; 16 are free; asking for 17 must fail, changing nothing pinned.
  auto pages = h.cache->alloc_pages(h.side_lock(), 17);
  ASSERT_FALSE(pages);
  EXPECT_EQ(pages.status().code(), ErrorCode::kOutOfMemory);
  auto table = h.cache->path_pages(a->lock);
  ASSERT_TRUE(table);
  for (std::size_t i = 0; i < table->size(); ++i) EXPECT_TRUE(h.page_ok((*table)[i], prompt, i));
  EXPECT_INVARIANTS(h);
  EXPECT_TRUE(h.cache->release(a->lock));
  auto now = h.cache->alloc_pages(h.side_lock(), 17);
  EXPECT_TRUE(now);
  EXPECT_INVARIANTS(h);
}

TEST_P(PrefixCacheTest, UnlockReturnsToTheExactPriorState) {
  auto prompt = seq({{1, 24}, {2, 1}});
  const std::size_t snaps[] = {8, 24};
  h.serve(prompt, snaps);
  h.settle();
  const Occupancy before = h.cache->occupancy();
  auto a = h.cache->admit(prompt);
  ASSERT_TRUE(a);
  auto b = h.cache->admit(prompt);
  ASSERT_TRUE(b);
  EXPECT_INVARIANTS(h);
  EXPECT_TRUE(h.cache->release(b->lock));
  EXPECT_TRUE(h.cache->release(a->lock));
  EXPECT_INVARIANTS(h);
  const Occupancy after = h.cache->occupancy();
  EXPECT_EQ(before.gpu_pages_free, after.gpu_pages_free);
  EXPECT_EQ(before.nodes, after.nodes);
}

TEST_P(PrefixCacheTest, SnapshotDemotionAndPromotionAreByteExact) {
  // Five conversations with snapshots through 4 GPU slots: some snapshots go to host.
  std::vector<std::vector<Token>> convos;
  for (int i = 0; i < 5; ++i) convos.push_back(seq({{Token(100 * (i + 1)), 8}, {7, 1}}));
  const std::size_t snaps[] = {8};
  for (auto& c : convos) h.serve(c, snaps);
  h.settle();
  EXPECT_GT(h.cache->stats().snapshots_demoted + (GetParam() == WritePolicy::kWriteThrough), 0u);
  for (auto& c : convos) {
    auto r = h.serve(c, snaps);
    EXPECT_EQ(r.cached, 8u);
    EXPECT_TRUE(r.bytes_ok);
  }
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheWriteThrough, CopiesInBackgroundSoEvictionIsFree) {
  Harness h(small_config(WritePolicy::kWriteThrough));
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  EXPECT_FALSE(h.engine.pending().empty()) << "write-through should be in flight";
  h.settle();
  const std::uint64_t d2h = h.cache->stats().bytes_d2h;
  // The snapshot is copied as its snapshot_pages() whole GPU pages (issue 21).
  EXPECT_EQ(d2h, (10 + h.config.snapshot_pages()) * h.config.page_bytes);
  auto pages = h.cache->alloc_pages(h.side_lock(), 32);  // evicts every page of the prompt
  ASSERT_TRUE(pages);
  EXPECT_EQ(h.cache->stats().bytes_d2h, d2h) << "eviction of clean pages must copy nothing";
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  auto back = h.serve(prompt, snaps);
  EXPECT_EQ(back.cached, 40u);
  EXPECT_TRUE(back.bytes_ok);
  EXPECT_EQ(h.cache->check_invariants(), "");
}

TEST(PrefixCacheWriteThrough, SourcePagesStayHeldUntilTheCopyLands) {
  Harness h(small_config(WritePolicy::kWriteThrough));
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  ASSERT_FALSE(h.engine.pending().empty());
  // Grab every GPU page while the write-through is still pending: the cache must let the
  // copy land before it recycles its source pages; scribble over all of them.
  auto pages = h.cache->alloc_pages(h.side_lock(), 32);
  ASSERT_TRUE(pages);
  for (GpuPageId p : *pages) {
    auto bytes = h.memory.gpu_page(p);
    std::fill(bytes.begin(), bytes.end(), std::byte{0xEE});
  }
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  auto back = h.serve(prompt, snaps);
  EXPECT_EQ(back.cached, 40u);
  EXPECT_TRUE(back.bytes_ok);
}

TEST(PrefixCacheHostFull, DropsWhenHostHasNoRoom) {
  CacheConfig c = small_config();
  c.host_pages = 4;
  c.host_snapshot_slots = 0;  // the one host pool: 4 pages in all
  Harness h(c);
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  auto pages = h.cache->alloc_pages(h.side_lock(), 32);
  ASSERT_TRUE(pages);
  const CacheStats s = h.cache->stats();
  EXPECT_GT(s.kv_pages_dropped_gpu + s.kv_pages_dropped_host, 0u);
  EXPECT_EQ(h.cache->match(prompt).usable_tokens, 0u);
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  EXPECT_EQ(h.cache->check_invariants(), "");
}

TEST(PrefixCacheNoHost, GpuOnlyConfigurationWorks) {
  CacheConfig c = small_config();
  c.host_pages = 0;
  c.host_snapshot_slots = 0;
  Harness h(c);
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  EXPECT_EQ(h.serve(prompt, snaps).cached, 40u);
  for (int i = 0; i < 3; ++i) h.serve(seq({{Token(5000 * (i + 1)), 64}, {1, 1}}), snaps);
  EXPECT_EQ(h.cache->stats().bytes_d2h, 0u);
  EXPECT_EQ(h.cache->check_invariants(), "");
}

TEST(PrefixCacheFaults, FailedDemotionLeavesATombstoneNotWrongBytes) {
  Harness h(small_config());
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  h.engine.fail_nth_submission(0);  // the next copy (the demotion) fails
  // All 32 pages: no other victim can make the room, so the one that failed is dropped.
  auto pages = h.cache->alloc_pages(h.side_lock(), 32);
  ASSERT_TRUE(pages);
  EXPECT_EQ(h.cache->stats().transfers_failed, 1u);
  EXPECT_EQ(h.cache->match(prompt).usable_tokens, 0u);
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  EXPECT_EQ(h.cache->check_invariants(), "");
  auto again = h.serve(prompt, snaps);
  EXPECT_EQ(again.cached, 0u);
}

TEST(PrefixCacheFaults, FailedPromotionDegradesToRecompute) {
  Harness h(small_config());
  auto prompt = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(prompt, snaps);
  auto pages = h.cache->alloc_pages(h.side_lock(), 32);  // demote it all
  ASSERT_TRUE(pages);
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  ASSERT_EQ(h.cache->match(prompt).usable_tokens, 40u);
  h.engine.fail_nth_submission(0);  // the promotion fails
  auto a = h.cache->admit(prompt);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 40u);
  EXPECT_TRUE(a->promoting);
  auto resumed = h.cache->wait(a->lock);  // nothing of the match arrived: resume at 0
  ASSERT_TRUE(resumed);
  EXPECT_EQ(*resumed, 0u);
  EXPECT_TRUE(h.cache->path_pages(a->lock)->empty());
  EXPECT_EQ(h.cache->check_invariants(), "");
  EXPECT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->check_invariants(), "");
  // The host copy stayed (issue 15 item 5): re-admission promotes it again, never poisoned
  // bytes.
  auto again = h.serve(prompt, snaps);
  EXPECT_TRUE(again.bytes_ok);
  EXPECT_EQ(again.cached, 40u);
}

TEST(PrefixCacheThreaded, ByteExactWithTheAsyncEngine) {
  Harness h(small_config(WritePolicy::kWriteBack), HostTransferEngine::Mode::kThreaded);
  std::vector<std::vector<Token>> prompts;
  for (int i = 0; i < 8; ++i)
    prompts.push_back(seq({{1, 12}, {Token(1000 * (i + 1)), 28}, {3, 1}}));
  const std::size_t snaps[] = {12, 40};
  for (int round = 0; round < 3; ++round) {
    for (auto& p : prompts) {
      auto r = h.serve(p, snaps);
      EXPECT_TRUE(r.bytes_ok);
      EXPECT_EQ(r.error, "");
    }
  }
  h.cache->drain();
  EXPECT_GT(h.cache->stats().kv_pages_promoted, 0u);
  EXPECT_EQ(h.cache->check_invariants(), "");
}

// ---- regressions found in review -------------------------------------------------------

/// Pushes every unlocked page and snapshot out of the GPU (to host, write-back).
void demote_all(Harness& h) {
  auto pages = h.cache->alloc_pages(h.side_lock(), h.config.gpu_pages);
  ASSERT_TRUE(pages);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
  std::vector<GpuSlotId> slots;
  for (std::uint32_t i = 0; i < h.config.gpu_snapshot_slots; ++i)
    slots.push_back(*h.cache->alloc_snapshot_slot(h.side_lock()));
  for (auto slot : slots) ASSERT_TRUE(h.cache->free_snapshot_slot(h.side_lock(), slot));
}

TEST(PrefixCacheRegression, ReleaseAfterTwoFailedPromotionsFreesEachNodeOnce) {
  Harness h{small_config()};
  auto p = seq({{1, 13}});
  const std::size_t snaps[] = {4, 12};
  ASSERT_EQ(h.serve(p, snaps, 1).error, "");
  demote_all(h);
  auto a = h.cache->admit(std::span(p).first(5));
  ASSERT_EQ(a->cached_tokens, 4u);
  auto b = h.cache->admit(p);
  ASSERT_EQ(b->cached_tokens, 12u);
  auto mine = h.cache->alloc_pages(a->lock, 2);
  ASSERT_TRUE(mine);
  // Inserting before wait() is refused (it used to move the lock below its snapshot).
  ASSERT_FALSE(h.cache->insert(a->lock, std::span(p).first(8), *mine, std::nullopt));
  for (TicketId t : h.engine.pending()) h.engine.fail_ticket(t);
  for (TicketId t : h.engine.pending()) h.engine.complete(t);
  h.cache->poll();
  ASSERT_TRUE(h.cache->release(b->lock));
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->check_invariants(), "");
}

TEST(PrefixCacheRegression, BadInsertDoesNotRunPendingCopies) {
  Harness h{small_config()};
  auto p = seq({{1, 8}, {9, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps, 2).error, "");
  demote_all(h);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a->promoting);
  auto b = h.cache->admit(seq({{500, 3}}));
  const auto in_flight = h.cache->in_flight();
  const auto pending = h.engine.pending().size();
  auto mine = h.cache->alloc_pages(b->lock, 1);
  auto r = h.cache->insert(b->lock, seq({{1, 4}, {77, 2}}), *mine, std::nullopt);  // 6 tokens
  ASSERT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->in_flight(), in_flight);
  EXPECT_EQ(h.engine.pending().size(), pending);
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kPending);
}

TEST(PrefixCacheRegression, HopelessAllocationEvictsNothing) {
  Harness h{small_config()};
  // 10 KV pages and a 5-page snapshot (issue 21: pages of the one GPU pool), unlocked.
  auto p = seq({{1, 40}, {2, 1}});
  const std::size_t snaps[] = {40};
  h.serve(p, snaps);
  ASSERT_EQ(h.cache->occupancy().gpu_pages_free, 32u - 15u);
  auto held = h.cache->alloc_pages(h.side_lock(), 15);  // a running request holds 15 of the 32
  ASSERT_TRUE(held);
  // 2 free + 15 reclaimable < 18: refused before the tree loses anything.
  auto r = h.cache->alloc_pages(h.side_lock(), 18);
  EXPECT_EQ(r.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(h.cache->stats().kv_pages_demoted, 0u);
  EXPECT_EQ(h.cache->stats().snapshots_demoted, 0u);
  EXPECT_EQ(h.cache->match(p).host_tokens, 0u);
  EXPECT_TRUE(h.cache->match(p).snapshot_on_gpu);
  // Every live slot held by requests: refused, and the tree's snapshot stays on GPU (live
  // slots never evict cached snapshots).
  std::vector<GpuSlotId> slots;
  while (h.cache->occupancy().gpu_slots_free > 0)
    slots.push_back(*h.cache->alloc_snapshot_slot(h.side_lock()));
  EXPECT_EQ(h.cache->alloc_snapshot_slot(h.side_lock()).status().code(), ErrorCode::kOutOfMemory);
  EXPECT_TRUE(h.cache->match(p).snapshot_on_gpu);
  EXPECT_EQ(h.cache->stats().snapshots_demoted, 0u);
  EXPECT_EQ(h.cache->check_invariants(), "");
}

TEST(HostTransferEngineTest, ManualCompleteDuringWaitRunsTheCopyOnce) {
  CacheConfig c = small_config();
  c.gpu_pages = c.host_pages = 2048;
  c.page_bytes = 16 * 1024;
  c.slice_pages = 16;
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  TransferBatch batch;
  batch.direction = Direction::kDeviceToHost;
  for (std::uint32_t i = 0; i < 2048; ++i) batch.pages.push_back({GpuPageId(i), HostPageId(i)});
  auto ticket = engine.submit(std::move(batch));
  ASSERT_TRUE(ticket);
  const TicketId id = ticket->id();
  std::thread waiter([&] { EXPECT_EQ(engine.wait(id), TransferState::kDone); });
  bool second = false;
  for (int i = 0; i < 10'000'000 && !second; ++i) {
    if (engine.pending().empty()) {
      second = engine.complete(id);
      break;
    }
  }
  waiter.join();
  EXPECT_FALSE(second);
  EXPECT_EQ(engine.stats().slices, 2048u / 16u);
}

// ---- rule 9: a request's pages and slots are its own ------------------------------------

TEST(PrefixCacheOwnership, AnotherRequestsPagesAndSlotsAreRefused) {
  Harness h{small_config()};
  const auto p = seq({{1, 8}, {9, 1}});
  auto a = h.cache->admit(p);
  auto b = h.cache->admit(seq({{1, 8}, {10, 1}}));
  ASSERT_TRUE(a && b);
  auto pa = h.cache->alloc_pages(a->lock, 2);
  auto sa = h.cache->alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(pa && sa);
  const Occupancy before = h.cache->occupancy();
  // b cannot adopt a's pages or slot into the tree, nor free them.
  auto ins = h.cache->insert(b->lock, std::span(p).first(8), *pa, *sa);
  ASSERT_EQ(ins.status().code(), ErrorCode::kInvalidArgument);
  std::ostringstream owner;
  owner << a->lock;
  EXPECT_NE(ins.status().message().find("belongs to request " + owner.str()), std::string::npos)
      << ins.status().message();
  ins = h.cache->insert(b->lock, std::span(p).first(8), *pa, std::nullopt);
  EXPECT_NE(ins.status().message().find(owner.str()), std::string::npos);
  Status s = h.cache->free_pages(b->lock, *pa);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find(owner.str()), std::string::npos) << s.message();
  EXPECT_EQ(h.cache->free_snapshot_slot(b->lock, *sa).code(), ErrorCode::kInvalidArgument);
  const Occupancy after = h.cache->occupancy();
  EXPECT_EQ(after.gpu_pages_free, before.gpu_pages_free);
  EXPECT_EQ(after.gpu_slots_free, before.gpu_slots_free);
  EXPECT_EQ(after.nodes, before.nodes);
  EXPECT_INVARIANTS(h);
  // The owner can.
  h.fill_page((*pa)[0], p, 0);
  h.fill_page((*pa)[1], p, 1);
  h.fill_snapshot(*sa, std::span(p).first(8));
  ins = h.cache->insert(a->lock, std::span(p).first(8), *pa, *sa);
  ASSERT_TRUE(ins) << ins.status().to_string();
  EXPECT_TRUE(ins->not_taken.empty());
  EXPECT_TRUE(ins->snapshot_taken);
  // Adopted ids are the tree's now: not even their former owner may free them.
  EXPECT_EQ(h.cache->free_pages(a->lock, *pa).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(h.cache->release(a->lock));
  EXPECT_TRUE(h.cache->release(b->lock));
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheOwnership, ReleaseReturnsWhatTheRequestStillOwns) {
  Harness h{small_config()};
  const Occupancy idle = h.cache->occupancy();
  auto a = h.cache->admit(seq({{1, 20}}));
  ASSERT_TRUE(a);
  ASSERT_TRUE(h.cache->alloc_pages(a->lock, 5));
  ASSERT_TRUE(h.cache->alloc_snapshot_slot(a->lock));
  ASSERT_TRUE(h.cache->alloc_snapshot_slot(a->lock));
  EXPECT_EQ(h.cache->occupancy().gpu_pages_free, idle.gpu_pages_free - 5);
  EXPECT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  const Occupancy after = h.cache->occupancy();
  EXPECT_EQ(after.gpu_pages_free, idle.gpu_pages_free);
  EXPECT_EQ(after.gpu_slots_free, idle.gpu_slots_free);
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheOwnership, AllocationNeedsALiveRequest) {
  Harness h{small_config()};
  const Occupancy idle = h.cache->occupancy();
  EXPECT_EQ(h.cache->alloc_pages(LockId(999), 1).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(h.cache->alloc_snapshot_slot(LockId(999)).status().code(), ErrorCode::kNotFound);
  auto a = h.cache->admit(seq({{1, 5}}));
  auto pages = h.cache->alloc_pages(a->lock, 1);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->free_pages(a->lock, *pages).code(), ErrorCode::kNotFound);
  EXPECT_EQ(h.cache->occupancy().gpu_pages_free, idle.gpu_pages_free);
  EXPECT_INVARIANTS(h);
}

// ---- rule 8: bad input is rejected and changes nothing --------------------------------

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::size_t snaps[] = {8};
    h.serve(prompt, snaps);
    auto a = h.cache->admit(prompt);
    ASSERT_TRUE(a);
    lock = a->lock;
    auto p = h.cache->alloc_pages(lock, 2);
    ASSERT_TRUE(p);
    mine = *p;
    before = fingerprint();
  }
  std::string fingerprint() {
    const Occupancy o = h.cache->occupancy();
    const MatchResult m = h.cache->match(prompt);
    return std::to_string(o.gpu_pages_free) + "/" + std::to_string(o.host_pages_free) + "/" +
           std::to_string(o.gpu_slots_free) + "/" + std::to_string(o.nodes) + "/" +
           std::to_string(m.usable_tokens) + "/" + std::to_string(m.kv_tokens) + "/" +
           h.cache->check_invariants();
  }
  void expect_unchanged() { EXPECT_EQ(fingerprint(), before); }

  Harness h{small_config()};
  std::vector<Token> prompt = seq({{1, 8}, {9, 1}});
  LockId lock;
  std::vector<GpuPageId> mine;
  std::string before;
};

TEST_F(BadInputTest, UnknownLock) {
  const LockId bogus(12345);
  EXPECT_EQ(h.cache->release(bogus).code(), ErrorCode::kNotFound);
  EXPECT_EQ(h.cache->wait(bogus).status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(h.cache->path_pages(bogus));
  EXPECT_FALSE(h.cache->insert(bogus, prompt, {}, std::nullopt));
  expect_unchanged();
}

TEST_F(BadInputTest, DoubleRelease) {
  ASSERT_TRUE(h.cache->release(lock));
  before = fingerprint();
  Status s = h.cache->release(lock);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("already released"), std::string::npos);
  expect_unchanged();
}

TEST_F(BadInputTest, UnalignedTokens) {
  auto more = seq({{1, 8}, {50, 2}});
  auto r = h.cache->insert(lock, more, mine, std::nullopt);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("whole number of pages"), std::string::npos);
  expect_unchanged();
}

TEST_F(BadInputTest, MismatchedLengths) {
  auto more = seq({{1, 8}, {50, 8}});
  auto r = h.cache->insert(lock, more, std::span(mine).first(1), std::nullopt);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  expect_unchanged();
}

TEST_F(BadInputTest, PageIdOutOfRange) {
  const GpuPageId bad[] = {GpuPageId(999)};
  EXPECT_EQ(h.cache->free_pages(lock, bad).code(), ErrorCode::kInvalidArgument);
  auto table = *h.cache->path_pages(lock);
  table.push_back(GpuPageId(999));
  auto more = seq({{1, 8}, {50, 4}});
  EXPECT_FALSE(h.cache->insert(lock, more, table, std::nullopt));
  EXPECT_EQ(h.cache->free_snapshot_slot(lock, GpuSlotId(77)).code(), ErrorCode::kInvalidArgument);
  expect_unchanged();
}

TEST_F(BadInputTest, PagesNotHeldByTheCaller) {
  auto table = *h.cache->path_pages(lock);  // the tree's pages
  EXPECT_EQ(h.cache->free_pages(lock, table).code(), ErrorCode::kInvalidArgument);
  // Inserting the tree's pages at the wrong positions is refused.
  std::vector<GpuPageId> swapped{table[1], table[0]};
  EXPECT_FALSE(h.cache->insert(lock, std::span(prompt).first(8), swapped, std::nullopt));
  // A page listed twice.
  const GpuPageId twice[] = {mine[0], mine[0]};
  EXPECT_FALSE(h.cache->free_pages(lock, twice));
  expect_unchanged();
}

TEST_F(BadInputTest, DoubleFreeOfPages) {
  ASSERT_TRUE(h.cache->free_pages(lock, mine));
  before = fingerprint();
  Status s = h.cache->free_pages(lock, mine);
  EXPECT_NE(s.message().find("is not held by"), std::string::npos) << s.message();
  expect_unchanged();
}

TEST_F(BadInputTest, TokensThatDoNotExtendTheLock) {
  auto other = seq({{700, 12}});
  auto pages = mine;
  pages.push_back(mine[0]);
  EXPECT_FALSE(h.cache->insert(lock, other, std::span(mine).first(2), std::nullopt));
  EXPECT_FALSE(h.cache->admit(std::span<const Token>()));
  expect_unchanged();
}

}  // namespace
}  // namespace radixtier

namespace radixtier {
namespace {

// insert_every_page is, call for call, the attention-only twin's page-by-page insert: slot,
// insert of the next page, slot back when not taken. Two caches fed the same requests, one
// each way, under eviction pressure (the pool holds a few prompts), must stay identical.
TEST(InsertEveryPage, SameAsInsertingPageByPage) {
  Harness one{small_config()}, every{small_config()};
  // Prompts that share prefixes and branch at and between page boundaries.
  const std::vector<std::vector<Token>> prompts = {
      seq({{1, 22}}),          seq({{1, 13}, {50, 9}}), seq({{1, 22}, {80, 6}}),
      seq({{7, 18}}),          seq({{1, 8}, {60, 17}}), seq({{7, 18}, {90, 10}}),
      seq({{1, 22}, {80, 6}}), seq({{200, 25}}),        seq({{1, 13}, {50, 9}, {3, 5}})};
  const std::uint32_t ps = one.ps();
  auto serve = [&](Harness& h, std::span<const Token> prompt, bool fused) {
    auto a = h.cache->admit(prompt);
    EXPECT_TRUE(a) << a.status().to_string();
    if (!a) return std::size_t{0};
    auto resumed = h.cache->wait(a->lock);
    EXPECT_TRUE(resumed);
    std::size_t from = *resumed;
    auto path = h.cache->path_pages(a->lock);
    EXPECT_TRUE(path);
    std::vector<GpuPageId> pages = *path;
    const std::size_t end = prompt.size() / ps * ps;
    auto fresh = h.cache->alloc_pages(a->lock, (end - pages.size() * ps) / ps);
    EXPECT_TRUE(fresh) << fresh.status().to_string();
    pages.insert(pages.end(), fresh->begin(), fresh->end());
    const auto tokens = prompt.first(end);
    if (from >= end) {
      // all of it cached: nothing to insert
    } else if (fused) {
      std::size_t reached = 0;
      auto r = h.cache->insert_every_page(a->lock, from, tokens, pages, std::nullopt, reached);
      EXPECT_TRUE(r) << r.status().to_string();
      EXPECT_EQ(reached, end);
    } else {
      for (std::size_t b = from + ps; b <= end; b += ps) {
        auto s = h.cache->alloc_snapshot_slot(a->lock);
        std::optional<GpuSlotId> own = s ? std::optional<GpuSlotId>(*s) : std::nullopt;
        auto r = h.cache->insert(a->lock, tokens.first(b), std::span(pages).first(b / ps), own);
        EXPECT_TRUE(r) << r.status().to_string();
        if (own && !(r && r->snapshot_taken)) (void)h.cache->free_snapshot_slot(a->lock, *own);
      }
    }
    EXPECT_TRUE(h.cache->release(a->lock));
    return a->cached_tokens;
  };
  for (int round = 0; round < 3; ++round) {
    for (const auto& p : prompts) {
      const std::size_t a = serve(one, p, false);
      const std::size_t b = serve(every, p, true);
      EXPECT_EQ(a, b);
      EXPECT_EQ(one.cache->stats(), every.cache->stats());
      EXPECT_INVARIANTS(one);
      EXPECT_INVARIANTS(every);
    }
  }
  EXPECT_GT(one.cache->stats().snapshots_inserted, 0u);
  for (const auto& p : prompts) {
    const MatchResult x = one.cache->match(p), y = every.cache->match(p);
    EXPECT_EQ(x.usable_tokens, y.usable_tokens);
    EXPECT_EQ(x.kv_tokens, y.kv_tokens);
    EXPECT_EQ(x.host_tokens, y.host_tokens);
  }
}

TEST(InsertEveryPage, RejectsABoundaryOffThePagesChangingNothing) {
  Harness h{small_config()};
  const auto prompt = seq({{1, 17}});
  auto a = h.cache->admit(prompt);
  ASSERT_TRUE(a);
  auto pages = h.cache->alloc_pages(a->lock, 4);
  ASSERT_TRUE(pages);
  const CacheStats before = h.cache->stats();
  std::size_t reached = 99;
  const auto tokens = std::span(prompt).first(16);
  auto r = h.cache->insert_every_page(a->lock, 2, tokens, *pages, std::nullopt, reached);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(reached, 2u);
  r = h.cache->insert_every_page(a->lock, 16, tokens, *pages, std::nullopt, reached);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->stats(), before);
  EXPECT_EQ(h.cache->match(prompt).kv_tokens, 0u);
  EXPECT_INVARIANTS(h);
  EXPECT_TRUE(h.cache->release(a->lock));
}

}  // namespace
}  // namespace radixtier
