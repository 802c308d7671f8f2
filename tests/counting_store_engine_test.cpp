// CountingStoreEngine: the simulator's store tier (descriptions only, no bytes): slots, the
// record states, counts, and bad input that changes nothing.
#include "sim/counting_store_engine.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace radixtier::sim {
namespace {

// 4 tokens per page, 100-byte pages, 250-byte snapshots (3 slots), room for 10 slots, a host
// pool of 16 pages.
std::unique_ptr<CountingStoreEngine> make_store(std::uint64_t slots = 10) {
  CacheConfig c;
  c.page_size = 4;
  c.page_bytes = 100;
  c.snapshot_bytes = 250;
  auto s = CountingStoreEngine::create(CountingStoreEngine::geometry_for(c, slots * 100), 16);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(*s);
}

std::vector<Token> page(Token first) {
  std::vector<Token> t(4);
  std::iota(t.begin(), t.end(), first);
  return t;
}

StoreWrite kv(PathHash parent, std::uint64_t boundary, Token first, std::uint32_t host) {
  return StoreWrite{RecordDesc::kv_page(parent, boundary, page(first)), {HostPageId(host)}};
}

StoreWrite snap(PathHash path, std::uint64_t boundary, std::uint32_t host) {
  return StoreWrite{RecordDesc::snapshot(path, boundary),
                    {HostPageId(host), HostPageId(host + 1), HostPageId(host + 2)}};
}

TEST(CountingStoreEngine, GeometryFollowsTheCacheConfigAndZeroesAreRefused) {
  CacheConfig c;
  c.page_size = 64;
  c.page_bytes = 64 * 24'576;
  c.snapshot_bytes = 77'266'944;
  const StoreGeometry g = CountingStoreEngine::geometry_for(c, 64ull << 30);
  EXPECT_EQ(g.page_tokens, 64u);
  EXPECT_EQ(g.page_bytes, 64u * 24'576u);
  EXPECT_EQ(g.snapshot_bytes, 77'266'944u);
  EXPECT_EQ(g.capacity_slots, (64ull << 30) / (64 * 24'576));
  EXPECT_EQ(g.snapshot_slots(), 50u);  // ceil(77,266,944 / 1,572,864)
  auto none = CountingStoreEngine::create(CountingStoreEngine::geometry_for(c, 0), 16);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("capacity_slots"), std::string::npos);
  auto no_host = CountingStoreEngine::create(g, 0);
  ASSERT_FALSE(no_host.is_ok());
  EXPECT_NE(no_host.status().message().find("host_pages"), std::string::npos);
}

TEST(CountingStoreEngine, WritesReserveAtSubmitCommitAtFinishAndCountBytes) {
  auto store = make_store();
  const PathHash p1 = extend_path(PathHash::root(), page(0));
  std::vector<StoreWrite> batch;
  batch.push_back(kv(PathHash::root(), 4, 0, 0));
  batch.push_back(snap(p1, 4, 1));
  auto t = store->submit_writes(std::move(batch));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_TRUE(store->ready(*t));
  EXPECT_EQ(store->free_slots(), 6u);     // 1 + 3 slots reserved
  EXPECT_TRUE(store->records().empty());  // not committed yet
  EXPECT_EQ(store->check_invariants(), "");
  auto ids = store->finish_writes(*t);
  ASSERT_TRUE(ids.is_ok());
  ASSERT_EQ(ids->size(), 2u);
  EXPECT_LT((*ids)[0], (*ids)[1]);
  const auto recs = store->records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].id, (*ids)[0]);
  EXPECT_EQ(recs[0].desc.kind, RecordKind::kKvPage);
  EXPECT_EQ(recs[0].desc.tokens, page(0));
  EXPECT_EQ(recs[1].desc.kind, RecordKind::kSnapshot);
  EXPECT_EQ(recs[1].desc.path, p1);
  EXPECT_EQ(store->counts().writes, 2u);
  EXPECT_EQ(store->counts().bytes_written, 350u);
  EXPECT_EQ(store->pending_tickets(), 0u);
  // Finishing twice is an unknown ticket.
  auto again = store->finish_writes(*t);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kNotFound);

  // Reads: one OK per record, bytes counted; then erase frees the slots.
  auto r = store->submit_reads({StoreRead{(*ids)[1], {HostPageId(5), HostPageId(6), HostPageId(7)}},
                                StoreRead{(*ids)[0], {HostPageId(8)}}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(store->finish_writes(*r).status().code() == ErrorCode::kNotFound);
  const auto st = store->finish_reads(*r);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_TRUE(st[0].is_ok() && st[1].is_ok());
  EXPECT_EQ(store->counts().reads, 2u);
  EXPECT_EQ(store->counts().bytes_read, 350u);
  EXPECT_TRUE(store->erase((*ids)[1]).is_ok());
  EXPECT_EQ(store->free_slots(), 9u);
  EXPECT_EQ(store->erase((*ids)[1]).code(), ErrorCode::kNotFound);
  EXPECT_TRUE(store->sync().is_ok());
  EXPECT_EQ(store->counts().syncs, 1u);
  EXPECT_EQ(store->counts().erases, 1u);
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(CountingStoreEngine, AFullStoreRefusesTheWholeBatch) {
  auto store = make_store(4);
  const PathHash p1 = extend_path(PathHash::root(), page(0));
  std::vector<StoreWrite> fits;
  fits.push_back(kv(PathHash::root(), 4, 0, 0));
  fits.push_back(snap(p1, 4, 1));
  auto t = store->submit_writes(std::move(fits));
  ASSERT_TRUE(t.is_ok());
  ASSERT_TRUE(store->finish_writes(*t).is_ok());
  EXPECT_EQ(store->free_slots(), 0u);
  std::vector<StoreWrite> more;
  more.push_back(kv(p1, 8, 4, 4));
  auto full = store->submit_writes(std::move(more));
  ASSERT_FALSE(full.is_ok());
  EXPECT_EQ(full.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(store->counts().out_of_room, 1u);
  EXPECT_EQ(store->records().size(), 2u);
  EXPECT_EQ(store->pending_tickets(), 0u);
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(CountingStoreEngine, BadInputIsRefusedAndChangesNothing) {
  auto store = make_store();
  const PathHash p1 = extend_path(PathHash::root(), page(0));
  auto expect_refused = [&](StoreWrite w, const char* why) {
    std::vector<StoreWrite> b;
    b.push_back(kv(PathHash::root(), 4, 0, 0));  // a good item first: all or nothing
    b.push_back(std::move(w));
    auto t = store->submit_writes(std::move(b));
    ASSERT_FALSE(t.is_ok()) << why;
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument) << why;
    EXPECT_NE(t.status().message().find(why), std::string::npos) << t.status().message();
    EXPECT_EQ(store->free_slots(), 10u);
    EXPECT_EQ(store->pending_tickets(), 0u);
    EXPECT_TRUE(store->records().empty());
  };
  StoreWrite short_page = kv(p1, 8, 4, 1);
  short_page.desc.tokens.pop_back();
  expect_refused(std::move(short_page), "carries 4 tokens, got 3");
  expect_refused(kv(p1, 6, 4, 1), "boundary 6 is not a positive multiple of 4");
  expect_refused(kv(p1, 4, 4, 1), "the first page's parent must be the root");
  StoreWrite two_pages = kv(p1, 8, 4, 1);
  two_pages.pages.push_back(HostPageId(2));
  expect_refused(std::move(two_pages), "takes 1 host pages, got 2");
  expect_refused(kv(p1, 8, 4, 16), "out of range (host pool 16 pages)");
  expect_refused(kv(p1, 8, 4, 0), "already named by item 0");
  StoreWrite snap_tokens = snap(p1, 4, 1);
  snap_tokens.desc.tokens = page(0);
  expect_refused(std::move(snap_tokens), "a snapshot record carries no tokens");
  StoreWrite short_snap = snap(p1, 4, 1);
  short_snap.pages.pop_back();
  expect_refused(std::move(short_snap), "takes 3 host pages, got 2");

  auto unknown = store->submit_reads({StoreRead{RecordId(7), {HostPageId(0)}}});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("record#7 is not a committed record"),
            std::string::npos);
  const auto st = store->finish_reads(12345);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].code(), ErrorCode::kNotFound);
  EXPECT_EQ(store->counts().reads, 0u);
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(CountingStoreEngine, ARecordBeingWrittenIsNeitherListedNorReadable) {
  auto store = make_store();
  std::vector<StoreWrite> b;
  b.push_back(kv(PathHash::root(), 4, 0, 0));
  auto t = store->submit_writes(std::move(b));
  ASSERT_TRUE(t.is_ok());
  // Ids are handed out at submit; until finish_writes the record is only reserved.
  auto r = store->submit_reads({StoreRead{RecordId(0), {HostPageId(3)}}});
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(store->erase(RecordId(0)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store->used_slots(), 1u);
  ASSERT_TRUE(store->finish_writes(*t).is_ok());
  EXPECT_TRUE(store->submit_reads({StoreRead{RecordId(0), {HostPageId(3)}}}).is_ok());
}

}  // namespace
}  // namespace radixtier::sim
