// The disk store: records in and out byte-exact, restart, budget, bad input, faults.
#include <gtest/gtest.h>

#include <set>

#include "disk_harness.hpp"
#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/rebuild.hpp"

namespace radixtier::disk {
namespace {

using testing::check_every_byte;
using testing::expected_bytes;
using testing::page_tokens_for;
using testing::small_config;
using testing::TempDir;

std::unique_ptr<DiskStore> open_ok(const DiskStoreConfig& c,
                                   std::unique_ptr<DiskIoEngine> e = nullptr) {
  auto s = DiskStore::open(c, std::move(e));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

/// Writes a chain of `pages` KV pages from the root, a snapshot at every `snap_every`-th
/// boundary; returns the descriptions (bytes are expected_bytes of each).
std::vector<RecordId> write_chain(DiskStore& store, std::uint64_t seed, int pages, int snap_every,
                                  std::vector<RecordDesc>* descs = nullptr) {
  const std::uint32_t pt = store.config().fingerprint.page_tokens;
  std::vector<RecordId> ids;
  PathHash parent = PathHash::root();
  for (int i = 0; i < pages; ++i) {
    RecordDesc d = RecordDesc::kv_page(parent, (i + 1) * pt, page_tokens_for(seed + i, pt));
    auto bytes = expected_bytes(d, store.record_bytes(d.kind));
    auto id = store.put(d, bytes);
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    ids.push_back(*id);
    parent = d.node_path();
    if (descs) descs->push_back(d);
    if (snap_every > 0 && (i + 1) % snap_every == 0) {
      RecordDesc s = RecordDesc::snapshot(parent, (i + 1) * pt);
      auto sb = expected_bytes(s, store.record_bytes(s.kind));
      auto sid = store.put(s, sb);
      EXPECT_TRUE(sid.is_ok()) << sid.status().to_string();
      ids.push_back(*sid);
      if (descs) descs->push_back(s);
    }
  }
  return ids;
}

class DiskStoreEngines : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  DiskStoreConfig config(const TempDir& dir, std::uint64_t slots = 64) {
    DiskStoreConfig c = small_config(dir.store(), slots);
    c.io.kind = GetParam();
    return c;
  }
  void SetUp() override {
    if (GetParam() == IoEngineKind::kIoUring) {
      IoEngineConfig io;
      io.kind = IoEngineKind::kIoUring;
      if (!make_io_engine(io).is_ok()) GTEST_SKIP() << "io_uring unavailable here";
    }
  }
};

TEST_P(DiskStoreEngines, RecordsComeBackByteExactAndAfterARestart) {
  TempDir dir;
  std::vector<RecordDesc> descs;
  std::vector<RecordId> ids;
  {
    auto store = open_ok(config(dir));
    ASSERT_TRUE(store);
    EXPECT_TRUE(store->recovery().created);
    ids = write_chain(*store, 7, 10, 3, &descs);
    EXPECT_EQ(check_every_byte(*store), "");
    EXPECT_EQ(store->check_invariants(), "");
    ASSERT_TRUE(store->sync().is_ok());
  }
  auto store = open_ok(config(dir));
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->recovery().created);
  EXPECT_EQ(store->recovery().records, ids.size());
  EXPECT_EQ(store->recovery().torn_tail_bytes, 0u);
  EXPECT_EQ(store->check_invariants(), "");
  ASSERT_EQ(store->records().size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const RecordInfo* r = store->find(ids[i]);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->desc.kind, descs[i].kind);
    EXPECT_EQ(r->desc.boundary, descs[i].boundary);
    EXPECT_EQ(r->desc.tokens, descs[i].tokens);
    EXPECT_EQ(r->desc.node_path(), descs[i].node_path());
  }
  EXPECT_EQ(check_every_byte(*store), "");
}

TEST_P(DiskStoreEngines, BatchesOfWritesAndReadsOverlap) {
  TempDir dir;
  auto store = open_ok(config(dir));
  ASSERT_TRUE(store);
  const std::uint32_t pt = store->config().fingerprint.page_tokens;
  std::vector<RecordDesc> descs;
  std::vector<std::vector<std::byte>> bytes;
  for (int i = 0; i < 12; ++i) {
    descs.push_back(RecordDesc::kv_page(PathHash::root(), pt, page_tokens_for(100 + i, pt)));
    bytes.push_back(expected_bytes(descs.back(), 4096));
  }
  descs.push_back(RecordDesc::snapshot(descs[0].node_path(), pt));
  bytes.push_back(expected_bytes(descs.back(), store->record_bytes(RecordKind::kSnapshot)));
  std::vector<WriteRequest> first, second;
  for (std::size_t i = 0; i < descs.size(); ++i) {
    (i % 2 ? second : first).push_back({descs[i], bytes[i], {}});
  }
  auto p1 = store->submit_writes(std::move(first));
  auto p2 = store->submit_writes(std::move(second));  // both in flight at once
  ASSERT_TRUE(p1.is_ok() && p2.is_ok());
  EXPECT_EQ(store->check_invariants(), "");
  EXPECT_GT(store->stats().writing_slots, 0u);
  auto ids2 = store->complete_writes(std::move(p2).value());
  auto ids1 = store->complete_writes(std::move(p1).value());
  ASSERT_TRUE(ids1.is_ok() && ids2.is_ok());
  EXPECT_EQ(store->stats().writing_slots, 0u);
  std::vector<std::vector<std::byte>> out;
  std::vector<ReadRequest> reads;
  std::vector<RecordId> all(ids1->begin(), ids1->end());
  all.insert(all.end(), ids2->begin(), ids2->end());
  for (RecordId id : all) out.emplace_back(store->record_bytes(store->find(id)->desc.kind));
  for (std::size_t i = 0; i < all.size(); ++i) reads.push_back({all[i], out[i], {}});
  auto pr = store->submit_reads(std::move(reads));
  ASSERT_TRUE(pr.is_ok());
  for (const Status& s : store->complete_reads(std::move(pr).value())) EXPECT_TRUE(s.is_ok());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(out[i], expected_bytes(store->find(all[i])->desc, out[i].size()));
  }
  EXPECT_EQ(store->check_invariants(), "");
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskStoreEngines,
                         ::testing::Values(IoEngineKind::kThreadPool, IoEngineKind::kIoUring),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(DiskStore, WritesCompletedOutOfOrderSurviveARestart) {
  // Ids are handed out at submit, commit entries written at completion: a later batch that
  // completes first puts larger ids before smaller ones in the journal (the cache finishes
  // its store tickets in whatever order their I/O lands).
  TempDir dir;
  const auto c = small_config(dir.store());
  std::vector<RecordDesc> descs;
  std::vector<RecordId> all;
  {
    auto store = open_ok(c);
    ASSERT_TRUE(store);
    std::vector<WriteRequest> batches[3];
    std::vector<std::vector<std::byte>> bytes;
    for (int i = 0; i < 9; ++i) {
      descs.push_back(RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(300 + i, 4)));
      bytes.push_back(expected_bytes(descs.back(), 4096));
    }
    for (int i = 0; i < 9; ++i) batches[i / 3].push_back({descs[i], bytes[i], {}});
    auto p0 = store->submit_writes(std::move(batches[0]));
    auto p1 = store->submit_writes(std::move(batches[1]));
    auto p2 = store->submit_writes(std::move(batches[2]));
    ASSERT_TRUE(p0.is_ok() && p1.is_ok() && p2.is_ok());
    auto ids2 = store->complete_writes(std::move(p2).value());
    ASSERT_TRUE(ids2.is_ok());
    ASSERT_TRUE(store->sync().is_ok());  // the largest ids durable first
    auto ids0 = store->complete_writes(std::move(p0).value());
    auto ids1 = store->complete_writes(std::move(p1).value());
    ASSERT_TRUE(ids0.is_ok() && ids1.is_ok());
    ASSERT_TRUE(store->erase(ids2->front()).is_ok());
    ASSERT_TRUE(store->sync().is_ok());
    for (const auto* ids : {&*ids0, &*ids1, &*ids2})
      all.insert(all.end(), ids->begin(), ids->end());
  }
  auto store = open_ok(c);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->recovery().torn_tail_bytes, 0u);
  EXPECT_EQ(store->records().size(), 8u);
  EXPECT_EQ(store->find(all[6]), nullptr);  // the erased one stays erased
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i == 6) continue;
    ASSERT_NE(store->find(all[i]), nullptr) << "record " << all[i].value() << " lost";
  }
  EXPECT_EQ(check_every_byte(*store), "");
  // New ids continue above every id the journal named.
  RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(400, 4));
  auto id = store->put(d, expected_bytes(d, 4096));
  ASSERT_TRUE(id.is_ok());
  for (RecordId old : all) EXPECT_GT(id->value(), old.value());
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(DiskStore, TheTreeRebuildsFromTheRecordsAlone) {
  TempDir dir;
  const auto c = small_config(dir.store(), 256);
  std::vector<std::vector<Token>> paths;  // every page's full token path
  {
    auto store = open_ok(c);
    ASSERT_TRUE(store);
    // A branching tree: a trunk of 6 pages and branches off pages 1 and 3.
    std::vector<RecordDesc> trunk;
    write_chain(*store, 1, 6, 2, &trunk);
    std::vector<RecordDesc> kv;
    for (const RecordDesc& d : trunk) {
      if (d.kind == RecordKind::kKvPage) kv.push_back(d);
    }
    for (int branch : {1, 3}) {
      PathHash parent = kv[branch].node_path();
      std::uint64_t boundary = kv[branch].boundary;
      for (int j = 0; j < 3; ++j) {
        boundary += 4;
        RecordDesc d =
            RecordDesc::kv_page(parent, boundary, page_tokens_for(500 + branch * 10 + j, 4));
        ASSERT_TRUE(store->put(d, expected_bytes(d, 4096)).is_ok());
        parent = d.node_path();
      }
      RecordDesc s = RecordDesc::snapshot(parent, boundary);
      ASSERT_TRUE(store->put(s, expected_bytes(s, store->record_bytes(s.kind))).is_ok());
    }
    // An orphan: its parent never reached the disk.
    RecordDesc orphan = RecordDesc::kv_page(kv[5].node_path(), 99 * 4, page_tokens_for(9, 4));
    ASSERT_TRUE(store->put(orphan, expected_bytes(orphan, 4096)).is_ok());
    ASSERT_TRUE(store->sync().is_ok());
  }
  auto store = open_ok(c);
  ASSERT_TRUE(store);
  RebuiltPaths rebuilt = rebuild_paths(store->records(), 4);
  EXPECT_EQ(rebuilt.pages.size(), 12u);
  EXPECT_EQ(rebuilt.orphan_pages.size(), 1u);
  EXPECT_TRUE(rebuilt.orphan_snapshots.empty());
  std::size_t snapshots = 0;
  for (std::size_t i = 0; i < rebuilt.pages.size(); ++i) {
    const RebuiltPage& p = rebuilt.pages[i];
    if (p.parent >= 0) {
      EXPECT_LT(static_cast<std::size_t>(p.parent), i);  // parents first
    }
    std::vector<Token> tokens = path_tokens(rebuilt, i);
    ASSERT_EQ(tokens.size(), p.boundary);
    // The path hash of the rebuilt tokens is the record's: the tokens are the written ones.
    PathHash h = PathHash::root();
    for (std::size_t at = 0; at < tokens.size(); at += 4) {
      h = extend_path(h, std::span<const Token>(tokens).subspan(at, 4));
    }
    EXPECT_EQ(h, p.path);
    snapshots += p.snapshots.size();
  }
  EXPECT_EQ(snapshots, 5u);  // trunk boundaries 2, 4, 6 and the two branch ends
}

TEST(DiskStore, BadInputIsRefusedAndChangesNothing) {
  TempDir dir;
  auto store = open_ok(small_config(dir.store()));
  ASSERT_TRUE(store);
  const std::vector<std::byte> page(4096), small(100);
  const auto before = store->stats();
  auto tokens = page_tokens_for(1, 4);
  struct Case {
    const char* what;
    RecordDesc desc;
    std::span<const std::byte> bytes;
  } cases[] = {
      {"boundary 0", RecordDesc::kv_page(PathHash::root(), 0, tokens), page},
      {"boundary not page aligned", RecordDesc::kv_page(PathHash::root(), 5, tokens), page},
      {"wrong token count", RecordDesc::kv_page(PathHash::root(), 4, {1, 2, 3}), page},
      {"wrong size", RecordDesc::kv_page(PathHash::root(), 4, tokens), small},
      {"root parent deep", RecordDesc::kv_page(PathHash::root(), 8, tokens), page},
      {"non-root parent at first page", RecordDesc::kv_page(PathHash{1, 2}, 4, tokens), page},
      {"snapshot at the root", RecordDesc::snapshot(PathHash::root(), 4), page},
      {"snapshot wrong size", RecordDesc::snapshot(PathHash{1, 2}, 4), page},
  };
  for (const Case& c : cases) {
    std::vector<WriteRequest> one{{c.desc, c.bytes, {}}};
    auto r = store->submit_writes(std::move(one));
    ASSERT_FALSE(r.is_ok()) << c.what;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << c.what;
  }
  EXPECT_EQ(store->submit_writes({}).status().code(), ErrorCode::kInvalidArgument);
  std::vector<std::byte> out(4096);
  EXPECT_EQ(store->get(RecordId(12345), out).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store->erase(RecordId(12345)).code(), ErrorCode::kNotFound);
  RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, tokens);
  auto id = store->put(d, expected_bytes(d, 4096));
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(store->get(*id, std::span<std::byte>(out).first(10)).code(),
            ErrorCode::kInvalidArgument);
  const auto after = store->stats();
  EXPECT_EQ(after.records, before.records + 1);
  EXPECT_EQ(after.free_slots, before.free_slots - 1);
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(DiskStore, ASnapshotWrittenInPiecesReadsBackWholeAndViceVersa) {
  TempDir dir;
  auto store = open_ok(small_config(dir.store()));
  ASSERT_TRUE(store);
  const std::size_t n = store->record_bytes(RecordKind::kSnapshot);  // 3 pages + 100 bytes
  RecordDesc d = RecordDesc::snapshot(PathHash{5, 6}, 8);
  const auto bytes = expected_bytes(d, n);
  const std::span<const std::byte> all(bytes);
  WriteRequest w;
  w.desc = d;
  w.pieces = {all.subspan(0, 4096), all.subspan(4096, 4096), all.subspan(8192, 4096),
              all.subspan(12288)};
  std::vector<WriteRequest> bad_requests;
  WriteRequest bad = w;
  bad.pieces[1] = all.subspan(4096, 4000);  // a piece that is not a slot's size
  bad_requests.push_back(bad);
  EXPECT_EQ(store->submit_writes(std::move(bad_requests)).status().code(),
            ErrorCode::kInvalidArgument);
  std::vector<WriteRequest> one;
  one.push_back(w);
  auto pending = store->submit_writes(std::move(one));
  ASSERT_TRUE(pending.is_ok());
  auto id = store->complete_writes(std::move(pending).value());
  ASSERT_TRUE(id.is_ok());
  std::vector<std::byte> whole(n);
  ASSERT_TRUE(store->get(id->front(), whole).is_ok());
  EXPECT_EQ(whole, bytes);
  std::vector<std::byte> a(4096), b(4096), c(4096), e(100);
  auto pr = store->submit_reads({{id->front(), {}, {a, b, c, e}}});
  ASSERT_TRUE(pr.is_ok());
  EXPECT_TRUE(store->complete_reads(std::move(pr).value()).front().is_ok());
  std::vector<std::byte> joined;
  for (const auto* v : {&a, &b, &c, &e}) joined.insert(joined.end(), v->begin(), v->end());
  EXPECT_EQ(joined, bytes);
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(DiskStore, BadConfigNamesTheField) {
  TempDir dir;
  auto c = small_config(dir.store());
  c.budget_bytes = 100;
  EXPECT_NE(DiskStore::open(c).status().message().find("budget_bytes"), std::string::npos);
  c = small_config(dir.store());
  c.fingerprint.page_tokens = 0;
  EXPECT_NE(DiskStore::open(c).status().message().find("page_tokens"), std::string::npos);
  c = small_config(dir.store());
  c.fingerprint.model_id.clear();
  EXPECT_NE(DiskStore::open(c).status().message().find("model_id"), std::string::npos);
  c = small_config(dir.store(), 2);  // a snapshot needs 4 slots
  EXPECT_NE(DiskStore::open(c).status().message().find("snapshot"), std::string::npos);
  c = small_config(dir.store());
  c.io.slice_bytes = 1000;
  EXPECT_NE(DiskStore::open(c).status().message().find("slice_bytes"), std::string::npos);
  // A NUL would cut the path short: the store opened (and created) another directory.
  TempDir fresh;
  c = small_config(fresh.store());
  c.directory = c.directory + std::string("\0x", 2);
  auto nul = DiskStore::open(c);
  ASSERT_FALSE(nul);
  EXPECT_EQ(nul.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(nul.status().message().find("NUL"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(fresh.store())) << "nothing was created";
}

TEST(DiskStore, BudgetFullIsOutOfMemoryAndErasedSlotsWaitForTheSync) {
  TempDir dir;
  auto c = small_config(dir.store(), 6);
  c.journal_batch = 1000;  // no automatic sync
  auto store = open_ok(c);
  ASSERT_TRUE(store);
  std::vector<RecordId> ids;
  for (int i = 0; i < 6; ++i) {
    RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(i, 4));
    auto id = store->put(d, expected_bytes(d, 4096));
    ASSERT_TRUE(id.is_ok());
    ids.push_back(*id);
  }
  RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(99, 4));
  auto full = store->put(d, expected_bytes(d, 4096));
  EXPECT_EQ(full.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(full.status().message().find("disk budget"), std::string::npos);
  ASSERT_TRUE(store->erase(ids[0]).is_ok());
  // Until the free entry is durable a crash would bring record 0 back: its slot waits.
  EXPECT_EQ(store->stats().freeing_slots, 1u);
  EXPECT_EQ(store->put(d, expected_bytes(d, 4096)).status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(store->check_invariants(), "");
  ASSERT_TRUE(store->sync().is_ok());
  EXPECT_EQ(store->stats().free_slots, 1u);
  EXPECT_TRUE(store->put(d, expected_bytes(d, 4096)).is_ok());
  EXPECT_EQ(check_every_byte(*store), "");
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(DiskStore, UnsyncedCommitsAreInvisibleToTheNextOpenAfterACrashButSyncedOnesStay) {
  TempDir dir;
  auto c = small_config(dir.store());
  c.journal_batch = 1000;
  {
    auto store = open_ok(c);
    ASSERT_TRUE(store);
    write_chain(*store, 3, 4, 0);
    ASSERT_TRUE(store->sync().is_ok());
    write_chain(*store, 4, 3, 0);
    EXPECT_EQ(store->stats().unsynced_entries, 3u);
    EXPECT_EQ(store->records().size(), 7u);
    // The destructor syncs; a crash would not: copy the files before it runs.
    std::filesystem::copy(c.directory, dir.path() + "/crashed");
  }
  auto cc = c;
  cc.directory = dir.path() + "/crashed";
  std::filesystem::remove(cc.directory + "/lock");
  auto crashed = open_ok(cc);
  ASSERT_TRUE(crashed);
  EXPECT_EQ(crashed->records().size(), 4u);
  EXPECT_EQ(check_every_byte(*crashed), "");
  auto clean = open_ok(c);
  ASSERT_TRUE(clean);
  EXPECT_EQ(clean->records().size(), 7u);
}

TEST(DiskStore, EraseWhileReadingIsRefused) {
  TempDir dir;
  auto store = open_ok(small_config(dir.store()));
  ASSERT_TRUE(store);
  auto ids = write_chain(*store, 5, 1, 0);
  std::vector<std::byte> out(4096);
  auto pr = store->submit_reads({{ids[0], out, {}}});
  ASSERT_TRUE(pr.is_ok());
  EXPECT_EQ(store->erase(ids[0]).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store->check_invariants(), "");
  EXPECT_TRUE(store->complete_reads(std::move(pr).value()).front().is_ok());
  EXPECT_TRUE(store->erase(ids[0]).is_ok());
  EXPECT_EQ(store->check_invariants(), "");
}

TEST(DiskStore, AnotherFingerprintIsRefusedOrWiped) {
  TempDir dir;
  const auto c = small_config(dir.store());
  {
    auto store = open_ok(c);
    ASSERT_TRUE(store);
    write_chain(*store, 1, 3, 0);
  }
  auto other = [&](auto change) {
    auto x = c;
    change(x.fingerprint);
    return x;
  };
  const std::pair<const char*, DiskStoreConfig> cases[] = {
      {"page_tokens", other([](ModelFingerprint& f) { f.page_tokens = 8; })},
      {"page_bytes", other([](ModelFingerprint& f) { f.page_bytes = 8192; })},
      {"snapshot_bytes", other([](ModelFingerprint& f) { f.snapshot_bytes = 4096; })},
      {"model_id", other([](ModelFingerprint& f) { f.model_id = "another-model"; })},
      {"weights_version", other([](ModelFingerprint& f) { f.weights_version = "v2"; })},
  };
  for (const auto& [field, cfg] : cases) {
    auto r = DiskStore::open(cfg);
    ASSERT_FALSE(r.is_ok()) << field;
    EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
  {
    auto same = open_ok(c);  // refusals changed nothing
    ASSERT_TRUE(same);
    EXPECT_EQ(same->records().size(), 3u);
  }
  auto wipe = other([](ModelFingerprint& f) { f.weights_version = "v2"; });
  wipe.on_mismatch = OnMismatch::kWipe;
  auto store = open_ok(wipe);
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->recovery().wiped);
  EXPECT_NE(store->recovery().wipe_reason.find("weights_version"), std::string::npos);
  EXPECT_TRUE(store->records().empty());
  store.reset();
  EXPECT_EQ(DiskStore::open(c).status().code(), ErrorCode::kFailedPrecondition);  // now v2's
}

TEST(DiskStore, OneProcessPerStore) {
  TempDir dir;
  auto a = open_ok(small_config(dir.store()));
  ASSERT_TRUE(a);
  auto b = DiskStore::open(small_config(dir.store()));
  EXPECT_EQ(b.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("open in another"), std::string::npos);
}

TEST(DiskStore, CompactionKeepsRecordsAndIdsAreNeverReused) {
  TempDir dir;
  auto c = small_config(dir.store(), 16);
  c.compact_slack = 20;
  std::set<std::uint64_t> seen;
  std::uint64_t compactions = 0;
  for (int round = 0; round < 3; ++round) {
    auto store = open_ok(c);
    ASSERT_TRUE(store);
    for (int i = 0; i < 40; ++i) {
      RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(round * 100 + i, 4));
      auto id = store->put(d, expected_bytes(d, 4096));
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      EXPECT_TRUE(seen.insert(id->value()).second) << "id " << id->value() << " reused";
      if (i % 8 != 0) {
        ASSERT_TRUE(store->erase(*id).is_ok());
      }
      if (store->stats().free_slots == 0) {
        ASSERT_TRUE(store->sync().is_ok());
      }
    }
    ASSERT_TRUE(store->sync().is_ok());
    compactions += store->stats().compactions;
    EXPECT_EQ(check_every_byte(*store), "");
    EXPECT_EQ(store->check_invariants(), "");
  }
  EXPECT_GT(compactions, 0u);
  auto store = open_ok(c);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->records().size(), 15u);  // one in eight of each round survived
  EXPECT_EQ(check_every_byte(*store), "");
}

TEST(DiskStore, ASmallerBudgetDropsTheRecordsBeyondIt) {
  TempDir dir;
  {
    auto store = open_ok(small_config(dir.store(), 32));
    ASSERT_TRUE(store);
    write_chain(*store, 1, 20, 0);
  }
  auto store = open_ok(small_config(dir.store(), 10));
  ASSERT_TRUE(store);
  EXPECT_EQ(store->recovery().dropped_over_budget, 10u);
  EXPECT_LE(std::filesystem::file_size(dir.store() + "/data"), 10u * 4096);
  EXPECT_EQ(store->records().size(), 10u);
  EXPECT_EQ(store->check_invariants(), "");
  EXPECT_EQ(check_every_byte(*store), "");
}

struct FaultyStore {
  std::unique_ptr<DiskStore> store;
  testing::FaultyIoEngine* engine = nullptr;
};

FaultyStore open_faulty(const DiskStoreConfig& c) {
  auto inner = make_io_engine(c.io);
  EXPECT_TRUE(inner.is_ok());
  auto engine = std::make_unique<testing::FaultyIoEngine>(std::move(inner).value());
  FaultyStore out;
  out.engine = engine.get();
  out.store = open_ok(c, std::move(engine));
  return out;
}

TEST(DiskStore, AFailedOrFullWriteCommitsNothing) {
  TempDir dir;
  const auto c = small_config(dir.store());
  auto [store, engine] = open_faulty(c);
  ASSERT_TRUE(store);
  RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(1, 4));
  const auto bytes = expected_bytes(d, 4096);
  const auto before = store->stats();
  engine->fail_next_wait(io_error(ENOSPC, "pwrite"));
  auto full = store->put(d, bytes);
  EXPECT_EQ(full.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(full.status().message().find("disk full"), std::string::npos);
  engine->fail_next_wait(io_error(EIO, "pwrite"));
  EXPECT_EQ(store->put(d, bytes).status().code(), ErrorCode::kTransferFailed);
  engine->fail_next_submit({ErrorCode::kTransferFailed, "refused"});
  EXPECT_EQ(store->put(d, bytes).status().code(), ErrorCode::kTransferFailed);
  EXPECT_EQ(store->stats().records, before.records);
  EXPECT_EQ(store->stats().free_slots, before.free_slots);
  EXPECT_EQ(store->stats().unsynced_entries, 0u);
  EXPECT_EQ(store->stats().write_failures, 2u);
  EXPECT_EQ(store->check_invariants(), "");
  EXPECT_TRUE(store->put(d, bytes).is_ok());  // the store still works
  store.reset();
  auto reopened = open_ok(c);
  ASSERT_TRUE(reopened);
  EXPECT_EQ(reopened->records().size(), 1u);
  EXPECT_EQ(check_every_byte(*reopened), "");
}

TEST(DiskStore, AReadIoErrorKeepsTheRecordAndATruncationLosesIt) {
  TempDir dir;
  auto [store, engine] = open_faulty(small_config(dir.store()));
  ASSERT_TRUE(store);
  auto ids = write_chain(*store, 2, 2, 0);
  std::vector<std::byte> out(4096);
  engine->fail_next_wait(io_error(EIO, "pread"));
  Status s = store->get(ids[0], out);
  EXPECT_EQ(s.code(), ErrorCode::kTransferFailed);
  EXPECT_NE(store->find(ids[0]), nullptr);  // maybe transient: kept
  EXPECT_TRUE(store->get(ids[0], out).is_ok());
  EXPECT_EQ(out, expected_bytes(store->find(ids[0])->desc, 4096));
  engine->fail_next_wait({ErrorCode::kDataLoss, "short read: the file ends early"});
  s = store->get(ids[1], out);
  EXPECT_EQ(s.code(), ErrorCode::kDataLoss);
  EXPECT_EQ(store->find(ids[1]), nullptr);  // lost: erased
  EXPECT_EQ(store->stats().records_lost, 1u);
  EXPECT_EQ(store->stats().read_failures, 1u);
  EXPECT_EQ(store->check_invariants(), "");
}

}  // namespace
}  // namespace radixtier::disk
