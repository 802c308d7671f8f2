// Corruption of the store's files: flipped bits, truncated files, a wrong or missing header,
// a foreign journal. Each gives a lost record or a clear refusal, never wrong bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "disk_harness.hpp"
#include "radixtier/disk/disk_store.hpp"

namespace radixtier::disk {
namespace {

using testing::check_every_byte;
using testing::expected_bytes;
using testing::page_tokens_for;
using testing::small_config;
using testing::TempDir;
namespace fs = std::filesystem;

/// A store of `pages` chained KV pages with a snapshot every other page, synced and closed.
std::vector<RecordInfo> make_store(const DiskStoreConfig& c, int pages) {
  auto store = DiskStore::open(c);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  PathHash parent = PathHash::root();
  for (int i = 0; i < pages; ++i) {
    RecordDesc d = RecordDesc::kv_page(parent, (i + 1) * 4, page_tokens_for(i, 4));
    EXPECT_TRUE((*store)->put(d, expected_bytes(d, 4096)).is_ok());
    parent = d.node_path();
    if (i % 2 == 1) {
      RecordDesc s = RecordDesc::snapshot(parent, (i + 1) * 4);
      EXPECT_TRUE((*store)->put(s, expected_bytes(s, (*store)->record_bytes(s.kind))).is_ok());
    }
  }
  EXPECT_TRUE((*store)->sync().is_ok());
  return (*store)->records();
}

void flip_bit(const std::string& path, std::uint64_t byte, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(byte));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(byte));
  f.write(&c, 1);
}

TEST(DiskCorruption, AFlippedBitInARecordLosesThatRecordOnly) {
  TempDir dir;
  const auto c = small_config(dir.store());
  const auto records = make_store(c, 6);
  const RecordInfo& victim = records[3];
  flip_bit(c.directory + "/data", victim.slots.back().value() * 4096 + 17, 5);
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok());
    std::vector<std::byte> out((*store)->record_bytes(victim.desc.kind));
    Status s = (*store)->get(victim.id, out);
    EXPECT_EQ(s.code(), ErrorCode::kDataLoss);
    EXPECT_NE(s.message().find("lost"), std::string::npos);
    EXPECT_EQ((*store)->find(victim.id), nullptr);
    EXPECT_EQ(check_every_byte(**store), "");
    EXPECT_EQ((*store)->records().size(), records.size() - 1);
    EXPECT_EQ((*store)->check_invariants(), "");
  }
  auto store = DiskStore::open(c);  // the loss was journaled: the record stays gone
  ASSERT_TRUE(store.is_ok());
  EXPECT_EQ((*store)->find(victim.id), nullptr);
  EXPECT_EQ((*store)->records().size(), records.size() - 1);
}

TEST(DiskCorruption, ScrubFindsEveryFlippedRecord) {
  TempDir dir;
  const auto c = small_config(dir.store());
  const auto records = make_store(c, 8);
  for (std::size_t i : {1u, 4u, 7u}) {
    flip_bit(c.directory + "/data", records[i].slots[0].value() * 4096 + 100 * i, 0);
  }
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  auto lost = (*store)->scrub();
  ASSERT_TRUE(lost.is_ok());
  EXPECT_EQ(*lost, 3u);
  EXPECT_EQ((*store)->records().size(), records.size() - 3);
  EXPECT_EQ(check_every_byte(**store), "");
}

TEST(DiskCorruption, AFlippedBitInTheJournalEndsItThere) {
  TempDir dir;
  const auto c = small_config(dir.store());
  const auto records = make_store(c, 6);
  const auto size = fs::file_size(c.directory + "/journal");
  flip_bit(c.directory + "/journal", size / 2, 3);
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  EXPECT_GT((*store)->recovery().torn_tail_bytes, 0u);
  EXPECT_LT((*store)->records().size(), records.size());
  EXPECT_GT((*store)->records().size(), 0u);
  for (const RecordInfo& r : (*store)->records()) {
    // A prefix of what was committed: the same records under the same ids.
    EXPECT_EQ(r.desc.node_path(), records[r.id.value()].desc.node_path());
  }
  EXPECT_EQ(check_every_byte(**store), "");
  EXPECT_EQ((*store)->check_invariants(), "");
}

TEST(DiskCorruption, TruncatedFilesDropTheRecordsTheyCut) {
  TempDir dir;
  const auto c = small_config(dir.store());
  const auto records = make_store(c, 8);
  fs::resize_file(c.directory + "/data", fs::file_size(c.directory + "/data") / 2);
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok());
    EXPECT_GT((*store)->recovery().dropped_truncated, 0u);
    EXPECT_EQ((*store)->records().size() + (*store)->recovery().dropped_truncated, records.size());
    EXPECT_EQ(check_every_byte(**store), "");
  }
  const auto jsize = fs::file_size(c.directory + "/journal");
  fs::resize_file(c.directory + "/journal", jsize - 7);  // the last entry is torn
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  EXPECT_GT((*store)->recovery().torn_tail_bytes, 0u);
  EXPECT_EQ(check_every_byte(**store), "");
  EXPECT_EQ((*store)->check_invariants(), "");
}

// A torn tail (power loss mid-append) is cut at recovery, so that what is appended after it
// is found by the next recovery too (appending after the garbage would hide it).
TEST(DiskCorruption, ATornTailIsCutSoLaterCommitsSurvive) {
  TempDir dir;
  const auto c = small_config(dir.store());
  const auto records = make_store(c, 4);
  const auto jsize = fs::file_size(c.directory + "/journal");
  fs::resize_file(c.directory + "/journal", jsize - 11);
  std::size_t kept = 0;
  std::vector<RecordId> later;
  {
    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok());
    EXPECT_GT((*store)->recovery().torn_tail_bytes, 0u);
    kept = (*store)->records().size();
    EXPECT_EQ(kept, records.size() - 1);
    for (int i = 0; i < 3; ++i) {
      RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(900 + i, 4));
      auto id = (*store)->put(d, expected_bytes(d, 4096));
      ASSERT_TRUE(id.is_ok());
      later.push_back(*id);
    }
    ASSERT_TRUE((*store)->sync().is_ok());
  }
  auto store = DiskStore::open(c);
  ASSERT_TRUE(store.is_ok());
  EXPECT_EQ((*store)->recovery().torn_tail_bytes, 0u);
  EXPECT_EQ((*store)->records().size(), kept + later.size());
  for (RecordId id : later) EXPECT_NE((*store)->find(id), nullptr);
  EXPECT_EQ(check_every_byte(**store), "");
}

TEST(DiskCorruption, AnUnreadableOrMissingHeaderIsRefusedUnlessWiped) {
  TempDir dir;
  auto c = small_config(dir.store());
  make_store(c, 3);
  flip_bit(c.directory + "/header", 20, 1);
  auto r = DiskStore::open(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("kWipe"), std::string::npos);
  fs::resize_file(c.directory + "/header", 10);
  EXPECT_NE(DiskStore::open(c).status().message().find("truncated"), std::string::npos);
  fs::remove(c.directory + "/header");
  r = DiskStore::open(c);
  EXPECT_EQ(r.status().code(), ErrorCode::kDataLoss);
  EXPECT_NE(r.status().message().find("missing"), std::string::npos);
  c.on_mismatch = OnMismatch::kWipe;
  auto wiped = DiskStore::open(c);
  ASSERT_TRUE(wiped.is_ok());
  EXPECT_TRUE((*wiped)->recovery().wiped);
  EXPECT_TRUE((*wiped)->records().empty());
}

TEST(DiskCorruption, AnotherStoresJournalIsRefused) {
  TempDir dir;
  auto a = small_config(dir.path() + "/a");
  auto b = small_config(dir.path() + "/b");
  make_store(a, 2);
  make_store(b, 3);
  fs::copy_file(b.directory + "/journal", a.directory + "/journal",
                fs::copy_options::overwrite_existing);
  auto r = DiskStore::open(a);
  EXPECT_EQ(r.status().code(), ErrorCode::kDataLoss);
  EXPECT_NE(r.status().message().find("another store"), std::string::npos);
}

// Random damage to a copy of a store, many times: the open either refuses with a clear
// status or serves records whose every byte is right (some may be lost, none wrong).
TEST(DiskCorruption, RandomDamageNeverServesWrongBytes) {
  TempDir dir;
  const auto ref = small_config(dir.path() + "/ref", 64);
  const auto records = make_store(ref, 12);
  std::mt19937_64 rng(2026);
  int opened = 0, refused = 0;
  std::uint64_t lost = 0;
  for (int iter = 0; iter < 150; ++iter) {
    auto c = ref;
    c.directory = dir.path() + "/copy";
    fs::remove_all(c.directory);
    fs::copy(ref.directory, c.directory);
    const char* files[] = {"data", "journal", "header"};
    const int damages = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < damages; ++d) {
      const std::string f = c.directory + "/" + files[rng() % (iter % 10 == 0 ? 3 : 2)];
      const auto size = fs::file_size(f);
      if (size == 0) continue;
      if (rng() % 4 == 0) {
        fs::resize_file(f, rng() % size);
      } else {
        flip_bit(f, rng() % size, static_cast<int>(rng() % 8));
      }
    }
    auto store = DiskStore::open(c);
    if (!store.is_ok()) {
      ++refused;
      const ErrorCode code = store.status().code();
      EXPECT_TRUE(code == ErrorCode::kDataLoss || code == ErrorCode::kFailedPrecondition)
          << store.status().to_string();
      continue;
    }
    ++opened;
    EXPECT_EQ((*store)->check_invariants(), "") << "iteration " << iter;
    EXPECT_EQ(check_every_byte(**store, &lost), "") << "iteration " << iter;
    for (const RecordInfo& r : (*store)->records()) {
      ASSERT_LT(r.id.value(), records.size());
      EXPECT_EQ(r.desc.node_path(), records[r.id.value()].desc.node_path());
    }
  }
  EXPECT_GT(opened, 50);
  EXPECT_GT(lost, 0u);
  std::cout << "random damage: " << opened << " opened, " << refused << " refused, " << lost
            << " records lost, 0 wrong\n";
}

}  // namespace
}  // namespace radixtier::disk
