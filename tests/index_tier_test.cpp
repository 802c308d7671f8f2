// Unit tests of the index-based baseline (IndexTierCache) with real bytes: every page and
// snapshot written by a "request" is derived from the tokens before it, so any mix-up of
// slots shows up as a byte mismatch.
#include "baseline/index_tier_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "radixtier/transfer/host_transfer_engine.hpp"
#include "sim/counting_transfer_engine.hpp"

namespace radixtier::index_tier {
namespace {

constexpr std::uint32_t kPage = 4;

CacheConfig make_config(std::uint32_t gpu_pages, std::uint32_t host_pages, std::uint32_t gpu_slots,
                        std::uint32_t host_slots) {
  CacheConfig c;
  c.page_size = kPage;
  c.gpu_pages = gpu_pages;
  c.host_pages = host_pages;
  c.gpu_snapshot_slots = gpu_slots;
  c.host_snapshot_slots = host_slots;
  c.page_bytes = 16;
  c.snapshot_bytes = 40;
  c.slice_pages = 2;  // small, so that whole-prefix copies take several slices
  return c;
}

/// A token sequence of `n` tokens unique to `seed`.
std::vector<Token> seq(int seed, std::size_t n) {
  std::vector<Token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<Token>(seed * 100000 + int(i));
  return t;
}

std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The bytes the "model" writes for the state after tokens[0:end): a hash of that prefix.
std::uint64_t prefix_hash(std::span<const Token> tokens, std::size_t end) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < end; ++i)
    h = (h ^ std::uint64_t(std::uint32_t(tokens[i]))) * 1099511628211ull;
  return h;
}

void fill(std::span<std::byte> dst, std::uint64_t h, std::uint8_t salt) {
  for (std::size_t i = 0; i < dst.size(); ++i)
    dst[i] = std::byte(static_cast<std::uint8_t>((h >> ((i % 8) * 8)) + i * 7 + salt));
}

bool same(std::span<const std::byte> got, std::uint64_t h, std::uint8_t salt) {
  std::vector<std::byte> want(got.size());
  fill(want, h, salt);
  return std::equal(got.begin(), got.end(), want.begin());
}

constexpr std::uint8_t kKvSalt = 1, kSnapSalt = 2;

struct Rig {
  explicit Rig(const CacheConfig& c,
               HostTransferEngine::Mode mode = HostTransferEngine::Mode::kManual)
      : config(c), arenas(c), engine(arenas, c.slice_pages, mode) {
    auto made = IndexTierCache::create(c, engine);
    EXPECT_TRUE(made.is_ok()) << made.status().to_string();
    cache = std::move(made.value());
  }

  /// Checks the bytes of a fresh admission against what the prefix must contain.
  void expect_bytes(const Admission& a, std::span<const Token> prompt) {
    auto pages = cache->path_pages(a.lock);
    ASSERT_TRUE(pages.is_ok());
    ASSERT_EQ(pages->size() * kPage, a.cached_tokens);
    for (std::size_t i = 0; i < pages->size(); ++i) {
      EXPECT_TRUE(same(arenas.gpu_page((*pages)[i]), prefix_hash(prompt, (i + 1) * kPage), kKvSalt))
          << "page " << i << " of the match has foreign bytes";
    }
    if (a.cached_tokens > 0) {
      auto slot = cache->path_snapshot(a.lock);
      ASSERT_TRUE(slot.is_ok()) << slot.status().to_string();
      EXPECT_TRUE(same(arenas.gpu_snapshot(*slot), prefix_hash(prompt, a.cached_tokens), kSnapSalt))
          << "snapshot at " << a.cached_tokens << " has foreign bytes";
    }
  }

  /// One request with the end-of-prompt snapshot policy: admit, check the bytes of the
  /// match, compute (write) the rest of the page-aligned prompt, insert it with one snapshot
  /// at its end, release. Returns the admission.
  Admission run(std::span<const Token> prompt, bool with_snapshot = true) {
    auto admitted = cache->admit(prompt);
    EXPECT_TRUE(admitted.is_ok()) << admitted.status().to_string();
    Admission a = admitted.value();
    expect_bytes(a, prompt);
    EXPECT_TRUE(cache->wait(a.lock).is_ok());
    const std::size_t aligned = prompt.size() / kPage * kPage;
    std::vector<GpuPageId> table = cache->path_pages(a.lock).value();
    const std::size_t have = table.size();
    auto fresh = cache->alloc_pages(a.lock, aligned / kPage - have);
    EXPECT_TRUE(fresh.is_ok()) << fresh.status().to_string();
    for (std::size_t i = 0; i < fresh->size(); ++i) {
      fill(arenas.gpu_page((*fresh)[i]), prefix_hash(prompt, (have + i + 1) * kPage), kKvSalt);
      table.push_back((*fresh)[i]);
    }
    std::optional<GpuSlotId> slot;
    if (with_snapshot && aligned > 0) {
      auto s = cache->alloc_snapshot_slot(a.lock);
      EXPECT_TRUE(s.is_ok()) << s.status().to_string();
      slot = *s;
      fill(arenas.gpu_snapshot(*slot), prefix_hash(prompt, aligned), kSnapSalt);
    }
    auto ins = cache->insert(a.lock, prompt.first(aligned), table, slot);
    EXPECT_TRUE(ins.is_ok()) << ins.status().to_string();
    EXPECT_TRUE(cache->free_pages(a.lock, ins->not_taken).is_ok());
    if (slot && !ins->snapshot_taken) {
      EXPECT_TRUE(cache->free_snapshot_slot(a.lock, *slot).is_ok());
    }
    EXPECT_TRUE(cache->release(a.lock).is_ok());
    EXPECT_EQ(cache->check_invariants(), "");
    return a;
  }

  /// Admits, checks bytes, releases.
  Admission probe(std::span<const Token> prompt) {
    auto admitted = cache->admit(prompt);
    EXPECT_TRUE(admitted.is_ok());
    Admission a = admitted.value();
    expect_bytes(a, prompt);
    EXPECT_TRUE(cache->release(a.lock).is_ok());
    EXPECT_EQ(cache->check_invariants(), "");
    return a;
  }

  CacheConfig config;
  HostArenas arenas;
  HostTransferEngine engine;
  std::unique_ptr<IndexTierCache> cache;
};

TEST(IndexTier, RejectsBadConfig) {
  CacheConfig c = make_config(0, 0, 1, 0);
  HostArenas arenas(make_config(1, 0, 1, 0));
  HostTransferEngine engine(arenas, 2, HostTransferEngine::Mode::kManual);
  auto made = IndexTierCache::create(c, engine);
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("gpu_pages"), std::string::npos);
}

TEST(IndexTier, GpuHitMatchesAllButLastTokenWithSameBytes) {
  Rig rig(make_config(32, 32, 4, 4));
  const auto a = seq(1, 5 * kPage + 1);
  EXPECT_EQ(rig.run(a).cached_tokens, 0u);
  const Admission again = rig.probe(a);
  EXPECT_EQ(again.cached_tokens, 5 * kPage);
  EXPECT_EQ(again.gpu_tokens, 5 * kPage);
  EXPECT_EQ(again.host_tokens, 0u);
  EXPECT_FALSE(again.snapshot_from_host);
  // A prompt of exactly 5 pages matches only 4: the last token is always computed, and the
  // snapshot sits at 5 pages, so nothing usable lies below.
  const auto exact = seq(1, 5 * kPage);
  const Admission partial = rig.probe(exact);
  EXPECT_EQ(partial.cached_tokens, 0u);
  EXPECT_EQ(partial.kv_tokens, 4 * kPage);  // the KV is there, only the snapshot is not
  EXPECT_EQ(again.kv_tokens, 5 * kPage);
  const CacheStats s = rig.cache->stats();
  EXPECT_EQ(s.admissions, 3u);
  EXPECT_EQ(s.hit_tokens_gpu, 5 * kPage);
  EXPECT_EQ(s.snapshots_inserted, 1u);
}

TEST(IndexTier, EvictedPrefixIsPromotedFromHostWithOriginalBytes) {
  Rig rig(make_config(12, 64, 4, 4));
  const auto a = seq(1, 8 * kPage + 1);
  rig.run(a);
  rig.run(seq(2, 8 * kPage + 1));  // needs 8 pages: evicts A's leaf -> host (whole prefix)
  const CacheStats before = rig.cache->stats();
  EXPECT_EQ(before.kv_pages_demoted, 8u);
  EXPECT_EQ(before.snapshots_demoted, 1u);
  EXPECT_EQ(before.copies_d2h, 4u + 1u);  // 8 pages in slices of 2, then one snapshot

  const Admission back = rig.probe(a);  // promotion evicts B the same way
  EXPECT_EQ(back.cached_tokens, 8 * kPage);
  EXPECT_EQ(back.host_tokens, 8 * kPage);
  EXPECT_EQ(back.gpu_tokens, 0u);
  EXPECT_TRUE(back.snapshot_from_host);
  EXPECT_FALSE(back.promoting);
  const CacheStats s = rig.cache->stats();
  EXPECT_EQ(s.kv_pages_promoted, 8u);
  EXPECT_EQ(s.snapshots_promoted, 1u);
  EXPECT_EQ(s.hit_tokens_host, 8 * kPage);
  EXPECT_EQ(s.bytes_h2d, 8 * 16u + 40u);
  EXPECT_EQ(s.copies_h2d, 4u + 1u);
  EXPECT_EQ(s.bytes_d2h, 2 * (8 * 16u + 40u));
  EXPECT_GE(s.host_bytes_peak, 2 * (8 * 16u + 40u));
  EXPECT_EQ(rig.cache->index_stats().promotions, 1u);
  EXPECT_GT(rig.cache->index_stats().tree_walk_nodes, 0u);
}

TEST(IndexTier, ThreadedEngineGivesTheSameBytes) {
  Rig rig(make_config(12, 64, 4, 4), HostTransferEngine::Mode::kThreaded);
  const auto a = seq(1, 8 * kPage + 1);
  rig.run(a);
  rig.run(seq(2, 8 * kPage + 1));
  EXPECT_EQ(rig.probe(a).cached_tokens, 8 * kPage);
  EXPECT_EQ(rig.probe(seq(2, 8 * kPage + 1)).cached_tokens, 8 * kPage);
}

TEST(IndexTier, EachHostEntryStoresItsWholePrefix) {
  Rig rig(make_config(12, 64, 4, 4));
  const auto a = seq(1, 4 * kPage);
  const auto ab = concat(a, seq(2, 4 * kPage + 1));
  rig.run(a);                      // snapshot at 4 pages
  rig.run(ab);                     // snapshot at 8 pages; node A is now internal
  rig.run(seq(3, 8 * kPage + 1));  // evicts the AB leaf; A keeps its snapshot, stays
  rig.run(seq(4, 8 * kPage + 1));  // evicts A (a leaf by now) and seq 3
  // Host pages held: AB's whole prefix (8) + A's whole prefix (4), nothing shared.
  const auto extra = rig.cache->index_stats();
  EXPECT_GE(extra.host_entries, 2u);
  EXPECT_EQ(rig.cache->stats().kv_pages_demoted, 8u + 4u + 8u);
  EXPECT_EQ(rig.probe(concat(ab, seq(5, 3))).cached_tokens, 8 * kPage);
}

TEST(IndexTier, TombstonedSnapshotIsRevivedFromHost) {
  Rig rig(make_config(64, 64, 2, 4));
  const auto a = seq(1, 3 * kPage + 1);
  rig.run(a);
  rig.run(seq(2, 3 * kPage + 1));
  rig.run(seq(3, 3 * kPage + 1));  // its slot evicts A's snapshot: A becomes a tombstone
  EXPECT_EQ(rig.cache->stats().snapshots_demoted, 1u);
  EXPECT_EQ(rig.cache->stats().kv_pages_demoted, 0u);  // KV stays in place
  const Admission back = rig.probe(a);
  EXPECT_EQ(back.cached_tokens, 3 * kPage);
  EXPECT_EQ(back.gpu_tokens, 3 * kPage);
  EXPECT_TRUE(back.snapshot_from_host);
  EXPECT_EQ(rig.cache->index_stats().snapshots_revived, 1u);
}

// Stale slot 1: reviving a tombstone needs a GPU slot; making room evicts another snapshot,
// whose write to the full one-slot bank drops the oldest entry (the one being revived) and
// reuses its host slot. The revival must look the key up again: nothing, never B's bytes.
TEST(IndexTier, RevivalThatRecyclesItsOwnHostSlotGivesNothing) {
  Rig rig(make_config(64, 64, 1, 1));
  const auto a = seq(1, 3 * kPage + 1);
  const auto b = seq(2, 3 * kPage + 1);
  rig.run(a);
  rig.run(b);  // B's slot evicts A's snapshot -> host slot 0
  const Admission got = rig.probe(a);
  EXPECT_EQ(got.cached_tokens, 0u) << "A's entry was dropped while making room";
  EXPECT_EQ(rig.cache->index_stats().snapshots_revived, 0u);
  // B's snapshot went to the recycled host slot and comes back intact.
  const Admission gb = rig.probe(b);
  EXPECT_EQ(gb.cached_tokens, 3 * kPage);
  EXPECT_TRUE(gb.snapshot_from_host);
}

// Stale slot 2: promoting a complete host entry allocates GPU pages for its whole prefix;
// the KV eviction that makes room writes the victim's whole prefix to host, dropping the
// oldest entry (the one being promoted) and recycling its host pages for the victim.
TEST(IndexTier, PromotionThatRecyclesItsOwnHostPagesIsAbandoned) {
  Rig rig(make_config(8, 8, 4, 4));
  const auto a = seq(1, 6 * kPage + 1);
  const auto b = seq(2, 6 * kPage + 1);
  rig.run(a);
  rig.run(b);  // evicts A: host holds A (6 pages + snapshot)
  const Admission got = rig.probe(a);
  EXPECT_EQ(got.cached_tokens, 0u) << "A's host pages now hold B's bytes";
  EXPECT_EQ(rig.cache->index_stats().promotions_abandoned, 1u);
  EXPECT_EQ(rig.cache->stats().kv_pages_promoted, 0u);
  const Admission gb = rig.probe(b);  // B's entry is intact and complete
  EXPECT_EQ(gb.cached_tokens, 6 * kPage);
  EXPECT_EQ(gb.host_tokens, 6 * kPage);
}

TEST(IndexTier, FailedCopiesDegradeToRecompute) {
  Rig rig(make_config(12, 64, 4, 4));
  const auto a = seq(1, 8 * kPage + 1);
  const auto b = seq(2, 8 * kPage + 1);
  rig.run(a);
  rig.engine.fail_nth_submission(0);  // the first KV slice of A's demotion fails
  rig.run(b);
  CacheStats s = rig.cache->stats();
  EXPECT_EQ(s.transfers_failed, 1u);
  EXPECT_EQ(s.kv_pages_demoted, 0u);
  EXPECT_EQ(s.kv_pages_dropped_gpu, 8u);
  EXPECT_EQ(s.snapshots_demoted, 1u);  // the snapshot-only entry is of no use to admission
  EXPECT_EQ(rig.probe(a).cached_tokens, 0u);

  rig.run(seq(3, 8 * kPage + 1));  // evicts B: complete entry
  // Promoting B evicts seq 3 (4 KV slices + 1 snapshot), then copies B's snapshot back:
  // that sixth submission fails, so the promotion is abandoned.
  rig.engine.fail_nth_submission(5);
  EXPECT_EQ(rig.probe(b).cached_tokens, 0u);
  EXPECT_EQ(rig.cache->stats().transfers_failed, 2u);
  const Admission again = rig.probe(b);  // the host entry is intact: now it works
  EXPECT_EQ(again.cached_tokens, 8 * kPage);
  EXPECT_EQ(again.host_tokens, 8 * kPage);
}

TEST(IndexTier, ReplayEndingInsideAnEarlierPromptFindsNoSnapshot) {
  Rig rig(make_config(64, 128, 4, 4));
  const auto a = seq(1, 8 * kPage + 1);
  rig.run(a);  // end-of-prompt policy: one snapshot, at 8 pages
  std::vector<Token> replay(a.begin(), a.begin() + 5 * kPage);
  replay = concat(replay, seq(9, 10));
  EXPECT_EQ(rig.probe(replay).cached_tokens, 0u);
  // The same after A leaves the GPU: host entries are keyed by the whole 8-page prefix.
  rig.run(seq(2, 60 * kPage + 1));
  EXPECT_EQ(rig.probe(replay).cached_tokens, 0u);
  EXPECT_EQ(rig.probe(concat(a, seq(3, 5))).cached_tokens, 8 * kPage);
}

TEST(IndexTier, LongKvOnlyEntryShadowsShorterCompleteOne) {
  // Host snapshot bank of 1: a longer prefix's KV-only entry hides a shorter complete one.
  Rig rig(make_config(8, 64, 4, 1));
  const auto a = seq(1, 4 * kPage);
  const auto ab = concat(a, seq(2, 4 * kPage));
  rig.run(a);
  rig.run(ab, /*with_snapshot=*/false);
  rig.run(seq(3, 8 * kPage + 1));  // evicts AB's leaf (KV-only entry), then A (complete)
  const Admission got = rig.probe(concat(ab, seq(4, 3)));
  EXPECT_EQ(got.cached_tokens, 0u) << "lookup() returns the longest entry only";
}

TEST(IndexTier, BadInputsGiveClearErrorsAndChangeNothing) {
  Rig rig(make_config(16, 16, 2, 2));
  const auto a = seq(1, 3 * kPage + 1);
  rig.run(a);
  auto admitted = rig.cache->admit(seq(2, 3 * kPage + 1));
  ASSERT_TRUE(admitted.is_ok());
  const LockId lock = admitted->lock;
  auto mine = rig.cache->alloc_pages(lock, 3);
  ASSERT_TRUE(mine.is_ok());
  const std::size_t free_pages = rig.cache->gpu_pages_free();
  const std::size_t free_slots = rig.cache->gpu_slots_free();
  const CacheStats stats = rig.cache->stats();
  const auto toks = seq(2, 3 * kPage);

  auto expect_unchanged = [&] {
    EXPECT_EQ(rig.cache->gpu_pages_free(), free_pages);
    EXPECT_EQ(rig.cache->gpu_slots_free(), free_slots);
    EXPECT_EQ(rig.cache->stats().snapshots_inserted, stats.snapshots_inserted);
    EXPECT_EQ(rig.cache->check_invariants(), "");
  };

  EXPECT_EQ(rig.cache->admit({}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->release(LockId(999)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(rig.cache->wait(LockId(999)).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(rig.cache->poll(LockId(999)).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(rig.cache->path_pages(LockId()).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(rig.cache->insert(LockId(999), toks, *mine, std::nullopt).status().code(),
            ErrorCode::kNotFound);
  // unaligned tokens
  auto r = rig.cache->insert(lock, std::span(toks).first(3 * kPage - 1), *mine, std::nullopt);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("multiple of the page size"), std::string::npos);
  // page count mismatch
  r = rig.cache->insert(lock, toks, std::span(*mine).first(2), std::nullopt);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  // out-of-range page id
  std::vector<GpuPageId> bad = *mine;
  bad[1] = GpuPageId(1000);
  r = rig.cache->insert(lock, toks, bad, std::nullopt);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos);
  // a page the tree holds for another prefix
  std::vector<GpuPageId> stolen = *mine;
  auto probe = rig.cache->admit(a);
  stolen[0] = rig.cache->path_pages(probe->lock).value()[0];
  EXPECT_TRUE(rig.cache->release(probe->lock).is_ok());
  r = rig.cache->insert(lock, toks, stolen, std::nullopt);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  // duplicate page
  std::vector<GpuPageId> dup = {(*mine)[0], (*mine)[0], (*mine)[1]};
  EXPECT_EQ(rig.cache->insert(lock, toks, dup, std::nullopt).status().code(),
            ErrorCode::kInvalidArgument);
  // snapshot slot not the caller's / out of range
  EXPECT_EQ(rig.cache->insert(lock, toks, *mine, GpuSlotId(77)).status().code(),
            ErrorCode::kInvalidArgument);
  // tokens that do not extend the locked prefix: lock on A's match, insert B's tokens
  auto on_a = rig.cache->admit(a);
  ASSERT_EQ(on_a->cached_tokens, 3 * kPage);
  EXPECT_EQ(rig.cache->insert(on_a->lock, toks, *mine, std::nullopt).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(rig.cache->release(on_a->lock).is_ok());
  // free ids the caller does not own
  EXPECT_EQ(rig.cache->free_pages(lock, std::vector{GpuPageId(5000)}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_pages(lock, stolen).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_pages(lock, dup).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_snapshot_slot(lock, GpuSlotId(9)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_snapshot_slot(lock, GpuSlotId(0)).code(), ErrorCode::kInvalidArgument);
  expect_unchanged();

  // double release
  EXPECT_TRUE(rig.cache->free_pages(lock, *mine).is_ok());
  EXPECT_EQ(rig.cache->free_pages(lock, *mine).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(rig.cache->release(lock).is_ok());
  EXPECT_EQ(rig.cache->release(lock).code(), ErrorCode::kNotFound);
  EXPECT_EQ(rig.cache->check_invariants(), "");
}

TEST(IndexTier, PagesBelongToTheRequestThatAllocatedThem) {
  Rig rig(make_config(32, 0, 4, 0));
  const auto a = seq(1, 2 * kPage + 1);
  auto r1 = rig.cache->admit(a);
  auto r2 = rig.cache->admit(seq(7, 2 * kPage + 1));
  auto p1 = rig.cache->alloc_pages(r1->lock, 2);
  auto s1 = rig.cache->alloc_snapshot_slot(r1->lock);
  ASSERT_TRUE(p1.is_ok() && s1.is_ok());
  const std::size_t free_pages = rig.cache->gpu_pages_free();
  EXPECT_EQ(
      rig.cache->insert(r2->lock, std::span(a).first(2 * kPage), *p1, std::nullopt).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_pages(r2->lock, *p1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->free_snapshot_slot(r2->lock, *s1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rig.cache->gpu_pages_free(), free_pages);
  EXPECT_EQ(rig.cache->check_invariants(), "");
  // Releasing the owner returns what it still owns.
  EXPECT_TRUE(rig.cache->release(r1->lock).is_ok());
  EXPECT_EQ(rig.cache->gpu_pages_free(), free_pages + 2);
  EXPECT_TRUE(rig.cache->release(r2->lock).is_ok());
  EXPECT_EQ(rig.cache->check_invariants(), "");
}

TEST(IndexTier, InsertMovesTheLockAndReturnsPagesTheTreeHad) {
  Rig rig(make_config(32, 0, 4, 0));
  const auto a = seq(1, 4 * kPage + 1);
  auto r1 = rig.cache->admit(a);
  auto r2 = rig.cache->admit(a);  // both miss, both compute A
  ASSERT_EQ(r1->cached_tokens + r2->cached_tokens, 0u);
  auto p1 = rig.cache->alloc_pages(r1->lock, 4);
  auto p2 = rig.cache->alloc_pages(r2->lock, 4);
  const auto toks = std::span(a).first(4 * kPage);
  auto i1 = rig.cache->insert(r1->lock, toks, *p1, std::nullopt);
  ASSERT_TRUE(i1.is_ok());
  EXPECT_TRUE(i1->not_taken.empty());
  auto i2 = rig.cache->insert(r2->lock, toks, *p2, std::nullopt);
  ASSERT_TRUE(i2.is_ok());
  EXPECT_EQ(i2->not_taken, *p2);  // the tree already had them: still the caller's
  EXPECT_EQ(rig.cache->path_pages(r2->lock).value(), *p1);  // lock moved to the boundary
  EXPECT_EQ(rig.cache->check_invariants(), "");
  // Locked path survives any eviction pressure.
  EXPECT_EQ(rig.cache->alloc_pages(r1->lock, 32).status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(rig.cache->path_pages(r1->lock).value(), *p1);
  EXPECT_TRUE(rig.cache->free_pages(r2->lock, i2->not_taken).is_ok());
  EXPECT_TRUE(rig.cache->release(r1->lock).is_ok());
  EXPECT_TRUE(rig.cache->release(r2->lock).is_ok());
  EXPECT_EQ(rig.cache->check_invariants(), "");
  auto after = rig.cache->admit(seq(9, 1));
  EXPECT_TRUE(rig.cache->alloc_pages(after->lock, 32).is_ok());  // all unlocked: all evictable
  EXPECT_EQ(rig.cache->check_invariants(), "");
}

TEST(IndexTier, GpuOnlyConfigurationHasNoHostTier) {
  Rig rig(make_config(12, 0, 2, 0));
  EXPECT_FALSE(rig.cache->host_tier());
  const auto a = seq(1, 8 * kPage + 1);
  rig.run(a);
  EXPECT_EQ(rig.probe(a).cached_tokens, 8 * kPage);
  rig.run(seq(2, 8 * kPage + 1));  // evicts A: gone
  EXPECT_EQ(rig.probe(a).cached_tokens, 0u);
  rig.run(seq(3, 2 * kPage + 1));
  rig.run(seq(4, 2 * kPage + 1));  // snapshot eviction of a leaf removes it with its KV
  const CacheStats s = rig.cache->stats();
  EXPECT_EQ(s.bytes_d2h + s.bytes_h2d, 0u);
  EXPECT_EQ(s.host_bytes_peak, 0u);
  EXPECT_GT(s.kv_pages_dropped_gpu, 0u);
  EXPECT_GT(s.snapshots_dropped, 0u);
  EXPECT_EQ(rig.cache->index_stats().host_entries, 0u);
}

// Random conversations over shared stems in small pools: every admission checks the bytes
// of its match and every step checks the invariants, through all eviction paths.
class IndexTierRandom : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(IndexTierRandom, WorkloadKeepsBytesAndInvariants) {
  const auto [seed, tiered] = GetParam();
  Rig rig(tiered ? make_config(24, 40, 3, 2) : make_config(24, 0, 3, 0));
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::vector<std::vector<Token>> stems;
  for (int i = 0; i < 4; ++i) stems.push_back(seq(i + 1, 12 * kPage));
  std::uint64_t cached = 0;
  for (int step = 0; step < 300; ++step) {
    const auto& stem = stems[rng() % stems.size()];
    std::vector<Token> prompt(stem.begin(), stem.begin() + 1 + rng() % stem.size());
    if (rng() % 3 == 0) prompt = concat(prompt, seq(50 + int(rng() % 5), 1 + rng() % (6 * kPage)));
    const Admission a = rig.run(prompt, /*with_snapshot=*/rng() % 5 != 0);
    ASSERT_LT(a.cached_tokens, prompt.size());
    ASSERT_EQ(a.cached_tokens % kPage, 0u);
    ASSERT_EQ(a.gpu_tokens + a.host_tokens, a.cached_tokens);
    cached += a.cached_tokens;
    ASSERT_EQ(rig.cache->check_invariants(), "") << "step " << step;
    if (HasFailure()) return;
  }
  EXPECT_GT(cached, 0u);
  const CacheStats s = rig.cache->stats();
  EXPECT_EQ(s.hit_tokens_gpu + s.hit_tokens_host, cached);
  if (tiered) {
    EXPECT_GT(s.bytes_d2h, 0u);
    EXPECT_GT(s.hit_tokens_host + rig.cache->index_stats().snapshots_revived, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(IndexTier, IndexTierRandom,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Bool()));

TEST(IndexTierSim, CountingEngineRunsMillionTokenScaleWithoutMemory) {
  CacheConfig c;
  c.page_size = 64;
  c.gpu_pages = 262'144 / 64;
  c.host_pages = 1'048'576 / 64;
  c.gpu_snapshot_slots = 4;
  c.host_snapshot_slots = 32;
  c.page_bytes = 64 * 24'576;
  c.snapshot_bytes = 77'266'944;
  sim::CountingTransferEngine engine(c);
  auto cache = IndexTierCache::create(c, engine).value();
  auto run = [&](std::span<const Token> prompt) {
    Admission a = cache->admit(prompt).value();
    const std::size_t aligned = prompt.size() / 64 * 64;
    std::vector<GpuPageId> table = cache->path_pages(a.lock).value();
    auto fresh = cache->alloc_pages(a.lock, aligned / 64 - table.size()).value();
    table.insert(table.end(), fresh.begin(), fresh.end());
    GpuSlotId slot = cache->alloc_snapshot_slot(a.lock).value();
    auto ins = cache->insert(a.lock, prompt.first(aligned), table, slot).value();
    EXPECT_TRUE(cache->free_pages(a.lock, ins.not_taken).is_ok());
    if (!ins.snapshot_taken) {
      EXPECT_TRUE(cache->free_snapshot_slot(a.lock, slot).is_ok());
    }
    EXPECT_TRUE(cache->release(a.lock).is_ok());
    return a;
  };
  const auto conv = seq(1, 200'001);
  run(conv);
  run(seq(2, 200'001));  // pushes the conversation's KV to host
  const Admission back = run(conv);
  EXPECT_EQ(back.cached_tokens, 200'000u);
  EXPECT_EQ(back.host_tokens, 200'000u);
  EXPECT_EQ(cache->check_invariants(), "");
  const sim::CountingStats es = engine.stats();
  const CacheStats s = cache->stats();
  EXPECT_EQ(es.h2d.bytes, s.bytes_h2d);
  EXPECT_EQ(es.d2h.bytes, s.bytes_d2h);
  EXPECT_EQ(es.h2d.batches, s.copies_h2d);
  EXPECT_EQ(es.h2d.bytes, 3125ull * c.page_bytes + c.snapshot_bytes);
  EXPECT_EQ(es.h2d.slices, (3125ull + 127) / 128 + 1);
  EXPECT_EQ(engine.outstanding(), 0u);
}

TEST(IndexTierSim, CountingEngineChecksIdsAndCompletesAtWait) {
  CacheConfig c = make_config(4, 4, 1, 1);
  sim::CountingTransferEngine engine(c, sim::CountingTransferEngine::Completion::kAtWait);
  TransferBatch bad;
  bad.direction = Direction::kDeviceToHost;
  bad.pages = {{GpuPageId(4), HostPageId(0)}};
  EXPECT_EQ(engine.submit(std::move(bad)).status().code(), ErrorCode::kInvalidArgument);
  TransferBatch ok;
  ok.direction = Direction::kHostToDevice;
  ok.pages = {
      {GpuPageId(0), HostPageId(1)}, {GpuPageId(1), HostPageId(2)}, {GpuPageId(2), HostPageId(3)}};
  ok.snapshots = {{GpuSlotId(0), HostSlotId(0)}};
  auto t = engine.submit(std::move(ok));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->poll(), TransferState::kPending);
  EXPECT_EQ(t->wait(), TransferState::kDone);
  t->reset();
  const auto s = engine.stats();
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.h2d.pages, 3u);
  EXPECT_EQ(s.h2d.snapshots, 1u);
  EXPECT_EQ(s.h2d.bytes, 3 * 16u + 40u);
  EXPECT_EQ(s.h2d.slices, 2u + 1u);
  EXPECT_EQ(s.d2h.batches, 0u);
  EXPECT_EQ(engine.outstanding(), 0u);
}

}  // namespace
}  // namespace radixtier::index_tier
