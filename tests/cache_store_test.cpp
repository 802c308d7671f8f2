// The cache over a real disk store, end to end: a PrefixCache on HostTransferEngine +
// DiskStoreEngine with a host pool too small for its prefixes demotes host victims to disk and
// loads them back byte-exact; after persist(), the cache, the store and the engine destroyed
// and the directory reopened (a restart), a new cache serves every prefix from disk; a flipped
// bit on disk makes that node recompute (never wrong bytes); a store of another model or
// geometry is refused with an error that names the difference; a process SIGKILLed while its
// cache demotes to and loads from the store leaves a store the next cache serves right bytes
// from.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "cache_disk_process.hpp"
#include "cache_harness.hpp"
#include "disk_harness.hpp"
#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_store_engine.hpp"

namespace radixtier {
namespace {

using testing::Harness;

using testing::extended;
using testing::fill;
using testing::kPrompts;
using testing::kPromptTokens;
using testing::kSnapshotAtEnd;
using testing::Process;
using testing::prompt;
using testing::store_config;
using testing::tiny_config;

TEST(CacheStore, HostVictimsGoToDiskAndComeBackByteExact) {
  disk::testing::TempDir dir;
  const CacheConfig c = tiny_config();
  Process p(c, store_config(dir.store(), c));
  ASSERT_TRUE(p.created) << p.created.to_string();
  fill(p);
  const CacheStats after_fill = p.cache().stats();
  EXPECT_GT(after_fill.kv_pages_stored, 0u);
  EXPECT_GT(after_fill.snapshots_stored, 0u);
  EXPECT_GT(after_fill.store_writes, 0u);
  EXPECT_EQ(after_fill.store_failures, 0u);
  EXPECT_GT(p.store->stats().records, 0u);
  // The first prompt is on disk only now (no GPU or host copy of any of its pages or of its
  // snapshot); its extension resumes from it, every byte checked.
  const auto nodes = p.cache().inspect(prompt(0));
  ASSERT_FALSE(nodes.empty());
  for (const NodeInfo& n : nodes) {
    EXPECT_EQ(n.kv, Residency::kNone) << "boundary " << n.boundary;
    EXPECT_TRUE(n.kv_on_store) << "boundary " << n.boundary;
  }
  EXPECT_EQ(nodes.back().boundary, kPromptTokens);
  EXPECT_EQ(nodes.back().snapshot, Residency::kNone);
  EXPECT_TRUE(nodes.back().snapshot_on_store);
  for (std::size_t i = 0; i < kPrompts; ++i) {
    SCOPED_TRACE(i);
    const auto s = p.h->serve(extended(i), {});
    ASSERT_TRUE(s.error.empty()) << s.error;
    EXPECT_TRUE(s.bytes_ok);
    EXPECT_EQ(s.cached, kPromptTokens);
    p.drain();
    EXPECT_EQ(p.cache().check_invariants(), "");
  }
  const CacheStats st = p.cache().stats();
  EXPECT_GT(st.kv_pages_loaded, 0u);
  EXPECT_GT(st.snapshots_loaded, 0u);
  EXPECT_GT(st.hit_tokens_store, 0u);
  EXPECT_GT(st.bytes_from_store, 0u);
  EXPECT_EQ(st.store_records_lost, 0u);
  EXPECT_EQ(p.store->check_invariants(), "");
}

TEST(CacheStore, PersistRestartServesEveryPrefixFromDisk) {
  disk::testing::TempDir dir;
  const CacheConfig c = tiny_config();
  const auto d = store_config(dir.store(), c);
  {
    Process p(c, d);
    ASSERT_TRUE(p.created) << p.created.to_string();
    fill(p);
    ASSERT_TRUE(p.cache().persist().is_ok());
    EXPECT_EQ(p.cache().check_invariants(), "");
  }
  Process p(c, d);  // a new process: new arenas, engine, store and cache on the directory
  ASSERT_TRUE(p.created) << p.created.to_string();
  const CacheStats restored = p.cache().stats();
  EXPECT_EQ(restored.restored_kv_pages, kPrompts * kPromptTokens / c.page_size);
  EXPECT_EQ(restored.restored_snapshots, kPrompts);
  EXPECT_EQ(p.cache().check_invariants(), "");
  for (std::size_t i = 0; i < kPrompts; ++i) {
    SCOPED_TRACE(i);
    const auto s = p.h->serve(extended(i), {});
    ASSERT_TRUE(s.error.empty()) << s.error;
    EXPECT_TRUE(s.bytes_ok);
    EXPECT_EQ(s.cached, kPromptTokens);
    p.drain();
  }
  EXPECT_EQ(p.cache().stats().hit_tokens_store, kPrompts * kPromptTokens);
  EXPECT_EQ(p.cache().check_invariants(), "");
}

/// Flips one bit of the disk record of page `page` of prompt `i` (found by its tokens).
void flip_bit_of_page(const disk::DiskStoreConfig& d, std::size_t i, std::size_t page) {
  std::uint64_t offset = 0;
  {
    auto store = disk::DiskStore::open(d);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    const auto q = prompt(i);
    const std::vector<Token> tokens(q.begin() + static_cast<std::ptrdiff_t>(page * 4),
                                    q.begin() + static_cast<std::ptrdiff_t>(page * 4 + 4));
    bool found = false;
    for (const auto& r : (*store)->records()) {
      if (r.desc.kind == RecordKind::kKvPage && r.desc.tokens == tokens) {
        offset = r.slots[0].value() * d.fingerprint.page_bytes + 5;
        found = true;
      }
    }
    ASSERT_TRUE(found);
  }
  std::fstream f(d.directory + "/data", std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x20);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&b, 1);
}

TEST(CacheStore, AFlippedBitOnDiskRecomputesThatNodeAndNoWrongByte) {
  disk::testing::TempDir dir;
  const CacheConfig c = tiny_config();
  const auto d = store_config(dir.store(), c);
  {
    Process p(c, d);
    ASSERT_TRUE(p.created) << p.created.to_string();
    fill(p);
    ASSERT_TRUE(p.cache().persist().is_ok());
  }
  flip_bit_of_page(d, 1, 5);  // prompt 1, page 5 of 8
  Process p(c, d);
  ASSERT_TRUE(p.created) << p.created.to_string();
  // Prompt 1's page 5 fails its checksum when loaded: no usable match reaches past it (the
  // only snapshot is at the end), so the prompt is recomputed, with its own bytes (and a new
  // snapshot at its end).
  const auto s = p.h->serve(extended(1), kSnapshotAtEnd);
  ASSERT_TRUE(s.error.empty()) << s.error;
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_LT(s.cached, kPromptTokens);
  p.drain();
  EXPECT_GE(p.cache().stats().store_records_lost, 1u);
  EXPECT_EQ(p.cache().check_invariants(), "");
  // The others still come from disk whole.
  for (std::size_t i : {0u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE(i);
    const auto o = p.h->serve(extended(i), {});
    ASSERT_TRUE(o.error.empty()) << o.error;
    EXPECT_TRUE(o.bytes_ok);
    EXPECT_EQ(o.cached, kPromptTokens);
    p.drain();
  }
  // And prompt 1, recomputed and inserted again, is served from the cache.
  const auto again = p.h->serve(extended(1), {});
  EXPECT_TRUE(again.bytes_ok);
  EXPECT_EQ(again.cached, kPromptTokens);
  EXPECT_EQ(p.cache().check_invariants(), "");
}

TEST(CacheStore, AStoreOfAnotherModelOrGeometryIsRefused) {
  disk::testing::TempDir dir;
  const CacheConfig c = tiny_config();
  const auto d = store_config(dir.store(), c);
  {
    Process p(c, d);
    ASSERT_TRUE(p.created) << p.created.to_string();
    fill(p);
    ASSERT_TRUE(p.cache().persist().is_ok());
  }
  // Other weights: the store refuses to open, naming the field and both values.
  auto other = d;
  other.fingerprint.weights_version = "v2";
  auto refused = disk::DiskStore::open(other);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("weights_version"), std::string::npos)
      << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("v2"), std::string::npos);
  // A cache of another geometry refuses the store (it was made for 48-byte pages).
  {
    CacheConfig wider = c;
    wider.page_bytes = 64;
    Process q(wider, d);
    ASSERT_FALSE(q.created.is_ok());
    EXPECT_NE(q.created.message().find("page_bytes"), std::string::npos) << q.created.to_string();
  }
  // Nothing was lost: the right model still serves everything.
  Process q(c, d);
  ASSERT_TRUE(q.created) << q.created.to_string();
  EXPECT_EQ(q.cache().stats().restored_snapshots, kPrompts);
  EXPECT_EQ(q.cache().stats().restored_kv_pages, kPrompts * kPromptTokens / c.page_size);
}

/// The child of the crash test: a cache rebuilt from the store, serving random prompts and
/// their extensions (demoting to disk, loading from it) until it is killed. Exit status: 0
/// when it ran out of work first, 2 when the cache could not be made, 3 on wrong bytes.
/// The child: random serving and persist() until killed; it writes one byte to `fd` after
/// its first persist() (the parent's cue, whatever the machine's speed).
[[noreturn]] void crash_child(const CacheConfig& c, const disk::DiskStoreConfig& d,
                              std::uint64_t seed, int fd) {
  std::mt19937_64 rng(seed);
  Process p(c, d);
  if (!p.created) _exit(2);
  bool told = false;
  for (int op = 0; op < 5000; ++op) {
    const std::size_t i = rng() % kPrompts;
    const auto s = rng() % 2 ? p.h->serve(prompt(i), kSnapshotAtEnd) : p.h->serve(extended(i), {});
    if (!s.bytes_ok) _exit(3);
    if (rng() % 8 == 0) {
      (void)p.cache().persist();
      if (!told && ::write(fd, "p", 1) == 1) told = true;
    }
  }
  _exit(0);
}

TEST(CacheStore, AProcessKilledAtAnyMomentLeavesAStoreThatServesOnlyRightBytes) {
  disk::testing::TempDir dir;
  const CacheConfig c = tiny_config();
  auto d = store_config(dir.store(), c);
  d.journal_batch = 4;  // syncs (and so kill points between data and journal) are frequent
  // Room for three of the six prompts (13 slots each): the cache erases records for room all
  // the time, so kills land between an erase and its durable free entry too.
  d.budget_bytes = 40 * c.page_bytes;
  std::mt19937_64 rng(0xD15C);
  std::uint64_t finished = 0, served_from_disk = 0;
  constexpr int kKills = 24;
  for (int k = 0; k < kKills; ++k) {
    const std::uint64_t seed = rng();
    int cue[2];
    ASSERT_EQ(::pipe(cue), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(cue[0]);
      crash_child(c, d, seed, cue[1]);
    }
    ::close(cue[1]);
    // Every other kill waits for the child's first persist(), so that some do land in a
    // store with records, however slow the machine (a sanitizer build, a busy CI).
    if (k % 2 == 1) {
      char b = 0;
      (void)::read(cue[0], &b, 1);
    }
    ::close(cue[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) {
      ASSERT_EQ(WEXITSTATUS(status), 0) << "kill point " << k << ": the child failed";
      ++finished;
    }
    // The next process: whatever the kill left, every byte it serves is right.
    Process p(c, d);
    ASSERT_TRUE(p.created) << "kill point " << k << ": " << p.created.to_string();
    ASSERT_EQ(p.cache().check_invariants(), "") << "kill point " << k;
    ASSERT_EQ(p.store->check_invariants(), "") << "kill point " << k;
    for (std::size_t i = 0; i < kPrompts; ++i) {
      const auto s = p.h->serve(extended(i), {});
      ASSERT_TRUE(s.error.empty()) << "kill point " << k << ", prompt " << i << ": " << s.error;
      ASSERT_TRUE(s.bytes_ok) << "kill point " << k << ", prompt " << i;
      ASSERT_TRUE(s.cached == 0 || s.cached == kPromptTokens) << s.cached;
    }
    served_from_disk += p.cache().stats().hit_tokens_store;
    ASSERT_EQ(p.cache().check_invariants(), "") << "kill point " << k;
  }
  std::cout << kKills << " kill points (" << finished << " children finished first), "
            << served_from_disk << " tokens served from disk after them, 0 wrong\n";
  EXPECT_LT(finished, static_cast<std::uint64_t>(kKills));
  EXPECT_GT(served_from_disk, 0u);
}

}  // namespace
}  // namespace radixtier
