// The disk as a StoreEngine: host pages (a KV page, a snapshot's pieces) to disk records and
// back into other host pages, byte-exact, across a reopen of the store; refusals that change
// nothing; a flipped bit reported as kDataLoss and the record gone; the sync that frees the
// slots of erased records when a batch needs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "disk_harness.hpp"
#include "fsync_fault.hpp"
#include "radixtier/disk/disk_store_engine.hpp"

namespace radixtier::disk {
namespace {

using testing::expected_bytes;
using testing::page_tokens_for;
using testing::small_config;
using testing::TempDir;

constexpr std::size_t kPage = 4096;

CacheConfig host_config() {
  const ModelFingerprint f = testing::small_fingerprint();
  CacheConfig c;
  c.page_size = f.page_tokens;
  c.gpu_pages = 4;
  c.host_pages = 32;
  c.gpu_snapshot_slots = 1;
  c.host_snapshot_slots = 1;
  c.page_bytes = f.page_bytes;
  c.snapshot_bytes = f.snapshot_bytes;
  return c;
}

std::vector<HostPageId> ids(std::initializer_list<std::uint32_t> v) {
  std::vector<HostPageId> out;
  for (std::uint32_t x : v) out.push_back(HostPageId(x));
  return out;
}

/// Writes expected_bytes(d) across `pages` (a snapshot over its pieces, the last partial).
void fill(HostArenas& host, const RecordDesc& d, const std::vector<HostPageId>& pages,
          std::size_t total) {
  const auto bytes = expected_bytes(d, total);
  for (std::size_t k = 0; k < pages.size(); ++k) {
    auto page = host.host_page(pages[k]);
    const std::size_t n = std::min(page.size(), total - k * page.size());
    std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(k * page.size()), n, page.begin());
  }
}

std::vector<std::byte> gather(HostArenas& host, const std::vector<HostPageId>& pages,
                              std::size_t total) {
  std::vector<std::byte> out;
  for (HostPageId p : pages) {
    auto page = host.host_page(p);
    const std::size_t n = std::min(page.size(), total - out.size());
    out.insert(out.end(), page.begin(), page.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

void scribble(HostArenas& host) {
  for (std::uint32_t p = 0; p < host.host_pages(); ++p) {
    auto page = host.host_page(HostPageId(p));
    std::fill(page.begin(), page.end(), std::byte{0xEE});
  }
}

/// Polls ready() until true (it never blocks), then finishes the writes.
Result<std::vector<RecordId>> write_all(DiskStoreEngine& engine, std::vector<StoreWrite> batch) {
  auto t = engine.submit_writes(std::move(batch));
  if (!t) return t.status();
  while (!engine.ready(*t)) {
  }
  return engine.finish_writes(*t);
}

std::vector<Status> read_all(DiskStoreEngine& engine, std::vector<StoreRead> batch) {
  auto t = engine.submit_reads(std::move(batch));
  if (!t) return {t.status()};
  while (!engine.ready(*t)) {
  }
  return engine.finish_reads(*t);
}

RecordDesc first_page(std::uint64_t seed) {
  return RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(seed, 4));
}

TEST(DiskStoreEngine, KvPageAndSnapshotRoundTripAcrossAReopen) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  const std::size_t snap = c.fingerprint.snapshot_bytes;
  const RecordDesc p1 = first_page(1);
  const RecordDesc p2 = RecordDesc::kv_page(p1.node_path(), 8, page_tokens_for(2, 4));
  const RecordDesc s2 = RecordDesc::snapshot(p2.node_path(), 8);
  fill(host, p1, ids({3}), kPage);
  fill(host, p2, ids({9}), kPage);
  fill(host, s2, ids({20, 5, 17, 11}), snap);  // pieces in any host pages
  std::vector<RecordId> written;
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    DiskStoreEngine engine(**store, host);
    const StoreGeometry g = engine.geometry();
    EXPECT_EQ(g.page_tokens, 4u);
    EXPECT_EQ(g.page_bytes, kPage);
    EXPECT_EQ(g.snapshot_bytes, snap);
    EXPECT_EQ(g.capacity_slots, 64u);
    EXPECT_EQ(g.snapshot_slots(), 4u);
    EXPECT_EQ(engine.free_slots(), 64u);
    auto rec = write_all(engine, {{p1, ids({3})}, {p2, ids({9})}, {s2, ids({20, 5, 17, 11})}});
    ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
    ASSERT_EQ(rec->size(), 3u);
    written = *rec;
    EXPECT_EQ(engine.free_slots(), 64u - 6u);
    EXPECT_EQ(engine.pending_tickets(), 0u);
    ASSERT_TRUE(engine.sync().is_ok());
  }
  scribble(host);  // the host tier is gone (a restart)
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  DiskStoreEngine engine(**store, host);
  EXPECT_EQ(engine.geometry().capacity_slots, 64u);
  EXPECT_EQ(engine.free_slots(), 64u - 6u);
  const std::vector<StoredRecord> listed = engine.records();
  ASSERT_EQ(listed.size(), 3u);
  const RecordDesc* want[] = {&p1, &p2, &s2};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(listed[i].id, written[i]);
    EXPECT_EQ(listed[i].desc.kind, want[i]->kind);
    EXPECT_EQ(listed[i].desc.boundary, want[i]->boundary);
    EXPECT_EQ(listed[i].desc.node_path(), want[i]->node_path());
    EXPECT_EQ(listed[i].desc.tokens, want[i]->tokens);
  }
  const auto st = read_all(
      engine, {{written[0], ids({0})}, {written[1], ids({1})}, {written[2], ids({2, 30, 4, 35})}});
  ASSERT_EQ(st.size(), 3u);
  for (const Status& s : st) EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(gather(host, ids({0}), kPage), expected_bytes(p1, kPage));
  EXPECT_EQ(gather(host, ids({1}), kPage), expected_bytes(p2, kPage));
  EXPECT_EQ(gather(host, ids({2, 30, 4, 35}), snap), expected_bytes(s2, snap));
  EXPECT_EQ((*store)->check_invariants(), "");
}

TEST(DiskStoreEngine, RefusalsChangeNothing) {
  TempDir dir;
  const auto c = small_config(dir.store(), 8);  // 8 slots: two snapshots at most
  HostArenas host(host_config());
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  DiskStoreEngine engine(**store, host);
  const RecordDesc p1 = first_page(1);
  const RecordDesc s1 = RecordDesc::snapshot(p1.node_path(), 4);
  fill(host, p1, ids({3}), kPage);
  const auto before = (*store)->stats();
  auto unchanged = [&] {
    const auto now = (*store)->stats();
    EXPECT_EQ(now.free_slots, before.free_slots);
    EXPECT_EQ(now.writing_slots, 0u);
    EXPECT_EQ(now.records, before.records);
    EXPECT_EQ(now.syncs, before.syncs);
    EXPECT_EQ(engine.pending_tickets(), 0u);
    EXPECT_EQ((*store)->check_invariants(), "");
  };
  // A bad host page id (36 host pages) refuses the whole batch, the good item too.
  EXPECT_EQ(engine.submit_writes({{p1, ids({3})}, {p1, ids({99})}}).status().code(),
            ErrorCode::kInvalidArgument);
  unchanged();
  EXPECT_EQ(engine.submit_writes({{p1, {HostPageId()}}}).status().code(),
            ErrorCode::kInvalidArgument);  // the invalid id
  // Wrong piece counts: a snapshot in 2 pages (it takes 4), a KV page in 2 (it takes 1).
  EXPECT_EQ(engine.submit_writes({{s1, ids({1, 2})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.submit_writes({{p1, ids({1, 2})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.submit_writes({}).status().code(), ErrorCode::kInvalidArgument);
  unchanged();
  // The budget: 3 snapshots take 12 slots of 8.
  const auto full = engine.submit_writes(
      {{s1, ids({1, 2, 4, 5})}, {s1, ids({6, 7, 8, 10})}, {s1, ids({11, 12, 13, 14})}});
  EXPECT_EQ(full.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(full.status().message().find("disk budget"), std::string::npos)
      << full.status().to_string();
  unchanged();
  // Reads: an unknown record, a wrong piece count, a bad destination.
  auto rec = write_all(engine, {{p1, ids({3})}});
  ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
  const RecordId id = rec->front();
  const auto after_write = (*store)->stats();
  EXPECT_EQ(engine.submit_reads({{RecordId(77), ids({0})}}).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine.submit_reads({{id, ids({0})}, {RecordId(77), ids({1})}}).status().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(engine.submit_reads({{id, ids({0, 1})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.submit_reads({{id, ids({36})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.pending_tickets(), 0u);
  // Unknown tickets and tickets of the other kind: an error, the ticket stays pending.
  EXPECT_EQ(engine.finish_writes(12345).status().code(), ErrorCode::kInvalidArgument);
  ASSERT_EQ(engine.finish_reads(12345).size(), 1u);
  EXPECT_EQ(engine.finish_reads(12345)[0].code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(engine.ready(12345));  // nobody polls forever on it
  auto t = engine.submit_reads({{id, ids({0})}});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(engine.finish_writes(*t).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.pending_tickets(), 1u);
  EXPECT_EQ(engine.erase(id).code(), ErrorCode::kFailedPrecondition);  // being read
  const auto st = engine.finish_reads(*t);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_TRUE(st[0].is_ok()) << st[0].to_string();
  EXPECT_EQ(gather(host, ids({0}), kPage), expected_bytes(p1, kPage));
  EXPECT_EQ(engine.pending_tickets(), 0u);
  EXPECT_EQ(engine.erase(RecordId(77)).code(), ErrorCode::kNotFound);
  EXPECT_EQ((*store)->stats().records, after_write.records);
  EXPECT_EQ(engine.records().size(), 1u);
  EXPECT_TRUE(engine.erase(id).is_ok());
  EXPECT_TRUE(engine.records().empty());
  EXPECT_EQ((*store)->check_invariants(), "");
}

TEST(DiskStoreEngine, AFlippedBitOnDiskIsDataLossAndTheRecordIsGone) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  const std::size_t snap = c.fingerprint.snapshot_bytes;
  const RecordDesc p1 = first_page(1);
  const RecordDesc s1 = RecordDesc::snapshot(p1.node_path(), 4);
  RecordId kv;
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok());
    DiskStoreEngine engine(**store, host);
    fill(host, p1, ids({3}), kPage);
    fill(host, s1, ids({4, 5, 6, 7}), snap);
    auto rec = write_all(engine, {{p1, ids({3})}, {s1, ids({4, 5, 6, 7})}});
    ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
    kv = (*rec)[0];
    const RecordId sn = (*rec)[1];
    {  // one bit of the snapshot's last (partial) slot
      std::fstream f(c.directory + "/data", std::ios::in | std::ios::out | std::ios::binary);
      const auto off =
          static_cast<std::streamoff>((*store)->find(sn)->slots[3].value() * kPage + 42);
      f.seekg(off);
      char b = 0;
      f.read(&b, 1);
      b = static_cast<char>(b ^ 0x04);
      f.seekp(off);
      f.write(&b, 1);
    }
    scribble(host);
    const auto st = read_all(engine, {{kv, ids({10})}, {sn, ids({11, 12, 13, 14})}});
    ASSERT_EQ(st.size(), 2u);
    EXPECT_TRUE(st[0].is_ok()) << st[0].to_string();
    EXPECT_EQ(st[1].code(), ErrorCode::kDataLoss) << st[1].to_string();
    EXPECT_EQ(gather(host, ids({10}), kPage), expected_bytes(p1, kPage));
    const auto listed = engine.records();
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].id, kv);
    EXPECT_EQ(engine.erase(sn).code(), ErrorCode::kNotFound);
    EXPECT_EQ(engine.submit_reads({{sn, ids({11, 12, 13, 14})}}).status().code(),
              ErrorCode::kNotFound);
    ASSERT_TRUE(engine.sync().is_ok());
  }
  // The loss is durable: a reopen does not bring the record back.
  auto again = DiskStore::open(c);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  DiskStoreEngine reopened(**again, host);
  ASSERT_EQ(reopened.records().size(), 1u);
  EXPECT_EQ(reopened.records()[0].id, kv);
}

TEST(DiskStoreEngine, ABatchThatFitsOnlyWithErasedSlotsSyncsFirst) {
  TempDir dir;
  const auto c = small_config(dir.store(), 8);
  HostArenas host(host_config());
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  DiskStoreEngine engine(**store, host);
  const std::size_t snap = c.fingerprint.snapshot_bytes;
  // Fill the 8 slots: 4 KV pages and one snapshot.
  std::vector<RecordDesc> pages;
  std::vector<StoreWrite> batch;
  for (std::uint32_t i = 0; i < 4; ++i) {
    pages.push_back(first_page(100 + i));
    fill(host, pages.back(), ids({i}), kPage);
    batch.push_back({pages.back(), ids({i})});
  }
  const RecordDesc s0 = RecordDesc::snapshot(pages[0].node_path(), 4);
  fill(host, s0, ids({4, 5, 6, 7}), snap);
  batch.push_back({s0, ids({4, 5, 6, 7})});
  auto rec = write_all(engine, std::move(batch));
  ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
  EXPECT_EQ(engine.free_slots(), 0u);
  // Erase two KV pages: their slots come back only after a sync.
  ASSERT_TRUE(engine.erase((*rec)[1]).is_ok());
  ASSERT_TRUE(engine.erase((*rec)[2]).is_ok());
  EXPECT_EQ(engine.free_slots(), 0u);
  EXPECT_EQ((*store)->stats().freeing_slots, 2u);
  // A snapshot (4 slots) fits neither the free slots nor free + freeing: refused, no sync.
  const RecordDesc s3 = RecordDesc::snapshot(pages[3].node_path(), 4);
  fill(host, s3, ids({8, 9, 10, 11}), snap);
  const auto syncs = (*store)->stats().syncs;
  EXPECT_EQ(engine.submit_writes({{s3, ids({8, 9, 10, 11})}}).status().code(),
            ErrorCode::kOutOfMemory);
  EXPECT_EQ((*store)->stats().syncs, syncs);
  EXPECT_EQ((*store)->stats().freeing_slots, 2u);
  EXPECT_EQ(engine.syncs_for_room(), 0u);
  // Two KV pages fit once the erases are durable: the engine syncs and writes them.
  const RecordDesc q1 = first_page(201);
  const RecordDesc q2 = RecordDesc::kv_page(q1.node_path(), 8, page_tokens_for(202, 4));
  fill(host, q1, ids({12}), kPage);
  fill(host, q2, ids({13}), kPage);
  auto more = write_all(engine, {{q1, ids({12})}, {q2, ids({13})}});
  ASSERT_TRUE(more.is_ok()) << more.status().to_string();
  EXPECT_EQ(engine.syncs_for_room(), 1u);
  EXPECT_EQ((*store)->stats().syncs, syncs + 1);
  EXPECT_EQ(engine.free_slots(), 0u);
  EXPECT_EQ((*store)->stats().freeing_slots, 0u);
  // Every record still holds its own bytes (the reused slots hold the new ones).
  scribble(host);
  const auto st = read_all(engine, {{(*rec)[0], ids({20})},
                                    {(*rec)[3], ids({21})},
                                    {(*rec)[4], ids({22, 23, 24, 25})},
                                    {(*more)[0], ids({26})},
                                    {(*more)[1], ids({27})}});
  ASSERT_EQ(st.size(), 5u);
  for (const Status& s : st) EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(gather(host, ids({20}), kPage), expected_bytes(pages[0], kPage));
  EXPECT_EQ(gather(host, ids({21}), kPage), expected_bytes(pages[3], kPage));
  EXPECT_EQ(gather(host, ids({22, 23, 24, 25}), snap), expected_bytes(s0, snap));
  EXPECT_EQ(gather(host, ids({26}), kPage), expected_bytes(q1, kPage));
  EXPECT_EQ(gather(host, ids({27}), kPage), expected_bytes(q2, kPage));
  EXPECT_EQ((*store)->check_invariants(), "");
}

TEST(DiskStoreEngine, DestroyedWithTicketsPendingItWaitsAndCommitsNothing) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  const RecordDesc p1 = first_page(1);
  const RecordDesc p2 = first_page(2);
  fill(host, p1, ids({3}), kPage);
  fill(host, p2, ids({4}), kPage);
  RecordId id;
  {
    DiskStoreEngine engine(**store, host);
    auto rec = write_all(engine, {{p1, ids({3})}});
    ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
    id = rec->front();
    ASSERT_TRUE(engine.submit_writes({{p2, ids({4})}}).is_ok());
    ASSERT_TRUE(engine.submit_reads({{id, ids({10})}}).is_ok());
    EXPECT_EQ(engine.pending_tickets(), 2u);
  }
  const auto st = (*store)->stats();
  EXPECT_EQ(st.records, 1u);  // p1 only: p2's write was never finished
  EXPECT_EQ(st.writing_slots, 0u);
  EXPECT_EQ(st.free_slots, 63u);
  EXPECT_EQ((*store)->check_invariants(), "");
  EXPECT_TRUE((*store)->erase(id).is_ok());  // the abandoned read does not pin it
}

TEST(DiskStoreEngine, AStoreSwitchedOffByAFailedFsyncRefusesEveryCall) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  DiskStoreEngine engine(**store, host);
  const RecordDesc p1 = first_page(1);
  const RecordDesc p2 = first_page(2);
  fill(host, p1, ids({3}), kPage);
  fill(host, p2, ids({4}), kPage);
  auto rec = write_all(engine, {{p1, ids({3})}});
  ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
  const RecordId id = rec->front();
  // A read and a write in flight when the store switches itself off.
  auto read = engine.submit_reads({{id, ids({10})}});
  ASSERT_TRUE(read.is_ok()) << read.status().to_string();
  auto write = engine.submit_writes({{p2, ids({4})}});
  ASSERT_TRUE(write.is_ok()) << write.status().to_string();
  const int failed_before = radixtier::testing::failed_fdatasyncs();
  radixtier::testing::fail_next_fdatasyncs(1);
  const Status sync = engine.sync();
  radixtier::testing::fail_next_fdatasyncs(0);
  ASSERT_EQ(radixtier::testing::failed_fdatasyncs(), failed_before + 1);
  EXPECT_EQ(sync.code(), ErrorCode::kFailedPrecondition) << sync.to_string();
  EXPECT_FALSE((*store)->disabled_reason().empty());
  // Every call is an error now; nothing is listed, nothing has room.
  EXPECT_EQ(engine.free_slots(), 0u);
  EXPECT_EQ(engine.geometry().capacity_slots, 0u);
  EXPECT_EQ(engine.geometry().page_bytes, kPage);  // what it was made for stays known
  EXPECT_TRUE(engine.records().empty());
  EXPECT_EQ(engine.submit_writes({{p2, ids({5})}}).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(engine.submit_reads({{id, ids({11})}}).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(engine.erase(id).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(engine.sync().code(), ErrorCode::kFailedPrecondition);
  // The transfers in flight finish their I/O but hand out nothing.
  EXPECT_EQ(engine.finish_writes(*write).status().code(), ErrorCode::kFailedPrecondition);
  const auto st = engine.finish_reads(*read);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].code(), ErrorCode::kFailedPrecondition) << st[0].to_string();
  EXPECT_EQ(engine.pending_tickets(), 0u);
  EXPECT_EQ((*store)->stats().writing_slots, 0u);
}

}  // namespace
}  // namespace radixtier::disk
