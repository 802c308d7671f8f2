// The host <-> disk mover: host pages (KV and snapshot pieces) to disk records and back,
// byte-exact, across a restart; bad input refused whole; a lost record reported.
#include <gtest/gtest.h>

#include <fstream>

#include "disk_harness.hpp"
#include "radixtier/disk/disk_transfer_engine.hpp"
#include "radixtier/disk/rebuild.hpp"

namespace radixtier::disk {
namespace {

using testing::expected_bytes;
using testing::page_tokens_for;
using testing::small_config;
using testing::TempDir;

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

/// Fills host pages with expected_bytes of `d` (a snapshot across its pieces).
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

std::vector<HostPageId> ids(std::initializer_list<std::uint32_t> v) {
  std::vector<HostPageId> out;
  for (std::uint32_t x : v) out.push_back(HostPageId(x));
  return out;
}

TEST(DiskTransferEngine, HostPagesGoToDiskAndComeBackAfterARestart) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  const std::size_t snap = c.fingerprint.snapshot_bytes;
  RecordDesc p1 = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(1, 4));
  RecordDesc p2 = RecordDesc::kv_page(p1.node_path(), 8, page_tokens_for(2, 4));
  RecordDesc s2 = RecordDesc::snapshot(p2.node_path(), 8);
  fill(host, p1, ids({3}), 4096);
  fill(host, p2, ids({9}), 4096);
  fill(host, s2, ids({20, 5, 17, 11}), snap);  // pieces in any host pages
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok());
    DiskTransferEngine engine(host, **store);
    auto t = engine.demote({{p1, ids({3})}, {p2, ids({9})}, {s2, ids({20, 5, 17, 11})}});
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto records = engine.finish_demotion(std::move(t).value());
    ASSERT_TRUE(records.is_ok()) << records.status().to_string();
    EXPECT_EQ(records->size(), 3u);
    ASSERT_TRUE((*store)->sync().is_ok());
  }
  for (std::uint32_t p = 0; p < 32; ++p) {  // the host tier is gone (a restart)
    auto page = host.host_page(HostPageId(p));
    std::fill(page.begin(), page.end(), std::byte{0xEE});
  }
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  RebuiltPaths paths = rebuild_paths((*store)->records(), 4);
  ASSERT_EQ(paths.pages.size(), 2u);
  ASSERT_EQ(paths.pages[1].snapshots.size(), 1u);
  DiskTransferEngine engine(host, **store);
  auto t = engine.promote({{paths.pages[0].record, ids({0})},
                           {paths.pages[1].record, ids({1})},
                           {paths.pages[1].snapshots[0], ids({2, 30, 4, 6})}});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  for (const Status& s : engine.finish_promotion(std::move(t).value())) {
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  EXPECT_EQ(gather(host, ids({0}), 4096), expected_bytes(p1, 4096));
  EXPECT_EQ(gather(host, ids({1}), 4096), expected_bytes(p2, 4096));
  EXPECT_EQ(gather(host, ids({2, 30, 4, 6}), snap), expected_bytes(s2, snap));
  EXPECT_EQ((*store)->check_invariants(), "");
}

TEST(DiskTransferEngine, BadInputIsRefusedWholeAndALostRecordIsReported) {
  TempDir dir;
  const auto c = small_config(dir.store());
  HostArenas host(host_config());
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  DiskTransferEngine engine(host, **store);
  RecordDesc p1 = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(1, 4));
  RecordDesc s1 = RecordDesc::snapshot(p1.node_path(), 4);
  const auto before = (*store)->stats();
  EXPECT_EQ(engine.demote({{p1, ids({3})}, {p1, ids({99})}}).status().code(),
            ErrorCode::kInvalidArgument);  // host page 99 of 32
  EXPECT_EQ(engine.demote({{s1, ids({1, 2})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.demote({{p1, ids({1, 2})}}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*store)->stats().free_slots, before.free_slots);
  EXPECT_EQ((*store)->stats().records, 0u);
  fill(host, p1, ids({3}), 4096);
  auto t = engine.demote({{p1, ids({3})}});
  ASSERT_TRUE(t.is_ok());
  auto rec = engine.finish_demotion(std::move(t).value());
  ASSERT_TRUE(rec.is_ok());
  const RecordId id = rec->front();
  EXPECT_EQ(engine.promote({{RecordId(77), ids({0})}}).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine.promote({{id, ids({0})}, {id, ids({0})}}).status().code(),
            ErrorCode::kInvalidArgument);  // one host page, two destinations
  {  // flip a bit of the record on disk: the promotion reports it lost
    std::fstream f(c.directory + "/data", std::ios::in | std::ios::out | std::ios::binary);
    const auto off = static_cast<std::streamoff>((*store)->find(id)->slots[0].value() * 4096 + 9);
    f.seekg(off);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    f.seekp(off);
    f.write(&b, 1);
  }
  auto p = engine.promote({{id, ids({0})}});
  ASSERT_TRUE(p.is_ok());
  auto st = engine.finish_promotion(std::move(p).value());
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].code(), ErrorCode::kDataLoss);
  EXPECT_EQ((*store)->find(id), nullptr);
  EXPECT_EQ((*store)->check_invariants(), "");
}

}  // namespace
}  // namespace radixtier::disk
