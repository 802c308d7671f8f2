// Regressions found by the store-tier property tests (property_tests/, Restart and the store
// faults): each failed on the cache of the store-tier commit (a686324) and passes since the
// store-tier fixes main merged in c92a78f.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "memory_store_engine.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::MemoryStoreEngine;

std::vector<Token> tokens(std::size_t n) {
  std::vector<Token> p;
  for (std::size_t i = 0; i < n; ++i) p.push_back(Token(100 + i));
  return p;
}

// The per-path cap's victim held its snapshot on the store only: cap_path_snapshots() dropped
// its GPU and host copies, has_snapshot() stayed true, and the insert never returned.
TEST(StoreTierRegression, SnapshotCapDropsAStoreOnlySnapshot) {
  CacheConfig c = testing::small_config();
  c.max_snapshots_per_path = 2;
  c.host_pages = 12;
  MemoryStoreEngine store(c, 200);
  Harness h(c, HostTransferEngine::Mode::kManual, &store);
  store.attach(h.memory);
  const std::vector<Token> p = tokens(17);
  const std::size_t two[] = {4, 8}, third[] = {12};
  ASSERT_TRUE(h.serve(std::span(p).first(9), two, 1).bytes_ok);
  ASSERT_TRUE(h.restart(true).is_ok());  // both snapshots now on the store only
  ASSERT_EQ(h.cache->stats().restored_snapshots, 2u);
  ASSERT_TRUE(h.serve(std::span(p).first(13), third, 1).bytes_ok);
  EXPECT_EQ(h.cache->check_invariants(), "");
  std::size_t snapshots = 0;
  for (const NodeInfo& n : h.cache->inspect(std::span(p).first(13)))
    snapshots += n.snapshot != Residency::kNone || n.snapshot_on_store;
  EXPECT_LE(snapshots, 2u);
}

// After a restart, the prefix's store load failed with an I/O error (the record is kept);
// pin() of it then failed and broke check_invariants() ("a KV copy is in flight without both
// ends"). Now it refuses (part of the prefix is on the store only), changing nothing.
TEST(StoreTierRegression, PinAfterAFailedStoreLoadKeepsInvariants) {
  CacheConfig c = testing::small_config();
  c.host_pages = 12;
  MemoryStoreEngine store(c, 400);
  Harness h(c, HostTransferEngine::Mode::kManual, &store);
  store.attach(h.memory);
  const std::vector<Token> p = tokens(25);
  const std::size_t at[] = {24};
  ASSERT_TRUE(h.serve(p, at, 1).bytes_ok);
  ASSERT_TRUE(h.restart(true).is_ok());
  store.io_error_next_reads(1);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a.is_ok());
  ASSERT_EQ(a->cached_tokens, 24u);
  auto resumed = h.cache->wait(a->lock);
  ASSERT_TRUE(resumed.is_ok());
  EXPECT_EQ(*resumed, 0u);  // the load failed: recompute
  ASSERT_TRUE(h.cache->release(a->lock).is_ok());
  ASSERT_EQ(h.cache->check_invariants(), "");
  h.cache->poll();
  const testing::Fingerprint before = h.fingerprint({});
  auto pin = h.cache->pin(std::span(p).first(24));
  EXPECT_EQ(h.cache->check_invariants(), "");
  if (pin) {
    EXPECT_TRUE(h.cache->unpin(*pin).is_ok());
  } else {
    EXPECT_EQ(before.difference(h.fingerprint({})), "");
  }
}

}  // namespace
}  // namespace radixtier
