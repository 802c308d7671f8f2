// Power loss, not only kill -9: the disk store and the cache over it run on PowerCutFs (a
// model of the page cache, power_cut_fs.hpp), and after every operation k of a random
// workload the test builds the files a power cut there could leave and opens them:
//   - open succeeds (a lying disk: or refuses with a clear Status);
//   - every record durable at a completed sync and not erased since is there; nothing erased
//     durably, nothing never committed comes back; every live record reads its own bytes
//     (a lying disk: its own bytes or kDataLoss, never another's);
//   - the store's invariants hold; a cut during that recovery (chained crashes) too.
// Workloads: puts completed in and out of order, erases, syncs, compactions, restarts, on the
// thread pool and on io_uring. Cache workloads: serving, persist() and restarts; the cache
// reopened from any cut serves only right bytes, and all it persisted when the cut follows
// persist().
//
// Seeds: RADIXTIER_POWER_CUT_SEEDS (default 8 per test in CI; `make soak` runs 200).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "cache_disk_process.hpp"
#include "disk_harness.hpp"
#include "power_cut_fs.hpp"
#include "radixtier/disk/disk_store.hpp"

namespace radixtier::disk {
namespace {

using testing::CutMode;
using testing::CutOptions;
using testing::expected_bytes;
using testing::page_tokens_for;
using testing::PowerCutFs;
using testing::TempDir;

/// Where the tests' directories go: memory (/dev/shm) where there is one. Durability is the
/// model's business here, and thousands of crash images a run cost 10x less off the disk.
std::filesystem::path scratch() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  return std::filesystem::temp_directory_path();
}

/// A TempDir under scratch().
struct ScratchDir : TempDir {
  ScratchDir() : TempDir(scratch()) {}
};

int seeds() {
  const char* env = std::getenv("RADIXTIER_POWER_CUT_SEEDS");
  return env ? std::max(1, std::atoi(env)) : 8;
}

/// What the workload was told, by operation count of the model: a cut at k has the first k
/// operations behind it.
struct Timeline {
  std::map<std::uint64_t, RecordDesc> committed;       ///< every id complete_writes returned
  std::map<std::uint64_t, std::size_t> durable_at;     ///< its commit durable from here
  std::map<std::uint64_t, std::size_t> erase_called;   ///< erase() called here
  std::map<std::uint64_t, std::size_t> erase_durable;  ///< its free entry durable from here
  std::vector<std::uint64_t> unsynced_commits, unsynced_erases;

  /// After any store call: with nothing left unsynced, what was queued is durable by now.
  void note_synced(const DiskStore& store, std::size_t now) {
    if (store.stats().unsynced_entries != 0) return;
    for (std::uint64_t id : unsynced_commits) durable_at.emplace(id, now);
    for (std::uint64_t id : unsynced_erases) erase_durable.emplace(id, now);
    unsynced_commits.clear();
    unsynced_erases.clear();
  }
};

DiskStoreConfig workload_config(const std::string& dir, bool uring,
                                std::shared_ptr<FileSystem> fs) {
  DiskStoreConfig c = testing::small_config(dir, 24);  // small: slots are reused all the time
  c.journal_batch = 3;
  c.compact_slack = 6;  // compaction (a rename) every few syncs
  c.io.kind = uring ? IoEngineKind::kAuto : IoEngineKind::kThreadPool;
  c.file_system = std::move(fs);
  return c;
}

/// Random store work on `fs`: batches of puts (two in flight at times, completed in either
/// order), erases, syncs and restarts. Returns the timeline, continuing `t` (the records an
/// earlier generation left, durable from the start).
Timeline run_store_workload(const DiskStoreConfig& c, PowerCutFs& fs, std::uint64_t seed, int steps,
                            Timeline t = {}) {
  std::mt19937_64 rng(seed);
  auto opened = DiskStore::open(c);
  EXPECT_TRUE(opened.is_ok()) << opened.status().to_string();
  if (!opened) return t;
  std::unique_ptr<DiskStore> store = std::move(opened).value();
  std::vector<std::vector<std::byte>> keep;  // bytes of writes in flight
  auto make_batch = [&]() {
    std::vector<WriteRequest> reqs;
    const int n = 1 + static_cast<int>(rng() % 3);
    std::vector<RecordInfo> live = store->records();
    for (int i = 0; i < n; ++i) {
      const RecordDesc d = testing::random_desc(rng, live);
      keep.push_back(expected_bytes(d, store->record_bytes(d.kind)));
      reqs.push_back({d, keep.back(), {}});
    }
    return reqs;
  };
  auto complete = [&](PendingWrites&& p) {
    auto ids = store->complete_writes(std::move(p));
    EXPECT_TRUE(ids.is_ok()) << ids.status().to_string();
    if (!ids) return;
    for (RecordId id : *ids) {
      t.committed.emplace(id.value(), store->find(id)->desc);
      t.unsynced_commits.push_back(id.value());
    }
  };
  for (int step = 0; step < steps; ++step) {
    const auto dice = rng() % 20;
    if (dice < 10) {
      auto a = store->submit_writes(make_batch());
      if (!a) {
        EXPECT_EQ(a.status().code(), ErrorCode::kOutOfMemory) << a.status().to_string();
      } else if (dice < 3) {  // a second batch in flight, completed first
        auto b = store->submit_writes(make_batch());
        if (b) complete(std::move(b).value());
        complete(std::move(a).value());
      } else {
        complete(std::move(a).value());
      }
    } else if (dice < 16) {
      const std::vector<RecordInfo> live = store->records();
      if (!live.empty()) {
        const RecordId id = live[rng() % live.size()].id;
        t.erase_called.emplace(id.value(), fs.operations());
        EXPECT_TRUE(store->erase(id).is_ok());
        t.unsynced_erases.push_back(id.value());
      }
    } else if (dice < 19) {
      EXPECT_TRUE(store->sync().is_ok());
    } else {  // a clean restart: the destructor syncs
      store.reset();
    }
    if (store == nullptr) {
      for (std::uint64_t id : t.unsynced_commits) t.durable_at.emplace(id, fs.operations());
      for (std::uint64_t id : t.unsynced_erases) t.erase_durable.emplace(id, fs.operations());
      t.unsynced_commits.clear();
      t.unsynced_erases.clear();
      auto again = DiskStore::open(c);
      EXPECT_TRUE(again.is_ok()) << again.status().to_string();
      if (!again) return t;
      store = std::move(again).value();
    }
    t.note_synced(*store, fs.operations());
    keep.clear();
  }
  return t;
}

/// Opens the store a cut left in `dir` (with the kernel's file system) and checks it against
/// the timeline of the cut at `cut`; "" or what is wrong. `records` counts what it read.
std::string check_cut(const DiskStoreConfig& base, const std::string& dir, const Timeline& t,
                      std::size_t cut, bool lying, std::uint64_t* records = nullptr) {
  DiskStoreConfig c = base;
  c.directory = dir;
  c.file_system = testing::unsynced_file_system();  // the image's own flushes: not tested
  c.io.kind = IoEngineKind::kThreadPool;
  auto opened = DiskStore::open(c);
  if (!opened) {
    if (lying && !opened.status().message().empty()) return "";  // refused, clearly
    return "open failed: " + opened.status().to_string();
  }
  DiskStore& store = **opened;
  if (std::string e = store.check_invariants(); !e.empty()) return "invariants: " + e;
  std::set<std::uint64_t> present;
  for (const RecordInfo& r : store.records()) {
    present.insert(r.id.value());
    auto it = t.committed.find(r.id.value());
    if (it == t.committed.end()) {
      return "record " + std::to_string(r.id.value()) + " was never committed";
    }
    if (it->second.node_path() != r.desc.node_path() || it->second.kind != r.desc.kind ||
        it->second.boundary != r.desc.boundary) {
      return "record " + std::to_string(r.id.value()) + " came back as another record";
    }
    auto erased = t.erase_durable.find(r.id.value());
    if (!lying && erased != t.erase_durable.end() && erased->second <= cut) {
      return "record " + std::to_string(r.id.value()) + " was erased durably and came back";
    }
  }
  std::uint64_t lost = 0;
  if (std::string e = testing::check_every_byte(store, &lost); !e.empty()) return e;
  if (lost > 0 && !lying) return std::to_string(lost) + " records lost their bytes";
  if (records) *records += present.size();
  if (lying) return "";
  for (const auto& [id, at] : t.durable_at) {
    if (at > cut || present.count(id) != 0) continue;
    auto erase = t.erase_called.find(id);
    if (erase != t.erase_called.end() && erase->second < cut) continue;  // maybe erased
    return "record " + std::to_string(id) + ", durable since operation " + std::to_string(at) +
           ", is missing";
  }
  return "";
}

/// A fresh directory for one crash image: `root`/img<n>.
std::string image_dir(const std::string& root, std::size_t n) {
  const std::string d = root + "/img" + std::to_string(n);
  std::filesystem::create_directories(d);
  return d;
}

struct CutStats {
  std::uint64_t cuts = 0, chained = 0, records = 0;
};

/// Every cut of the workload's log (and, every `chain_every` cuts, every cut of the recovery
/// from it), each image drawn under `options`. Stops at the first failure.
void check_every_cut(const PowerCutFs& fs, const DiskStoreConfig& c, const Timeline& t,
                     CutOptions options, std::uint64_t seed, std::size_t chain_every,
                     CutStats& stats) {
  std::mt19937_64 rng(seed);
  const std::size_t ops = fs.operations();
  for (std::size_t cut = 0; cut <= ops; ++cut) {
    ScratchDir scratch;
    const std::string img = image_dir(scratch.path(), 0);
    fs.write_image(cut, options, rng, img);
    const std::string store = img + "/store";
    ++stats.cuts;
    if (std::string e = check_cut(c, store, t, cut, options.lying_disk, &stats.records);
        !e.empty()) {
      ADD_FAILURE() << "cut after operation " << cut << " of " << ops
                    << " (last: " << (cut > 0 ? fs.describe(cut - 1) : "none") << ", seed " << seed
                    << "): " << e;
      return;
    }
    if (chain_every == 0 || cut % chain_every != 0) continue;
    // Chained: a fresh image, recovered on a model of its own, cut anywhere in that recovery.
    const std::string img2 = image_dir(scratch.path(), 1);
    fs.write_image(cut, options, rng, img2);
    auto fs2 = std::make_shared<PowerCutFs>(img2);
    {
      DiskStoreConfig c2 = c;
      c2.directory = img2 + "/store";
      c2.file_system = fs2;
      auto recovering = DiskStore::open(c2);
      if (!recovering && !options.lying_disk) {
        ADD_FAILURE() << "recovery failed at cut " << cut << ": "
                      << recovering.status().to_string();
        return;
      }
    }
    for (std::size_t cut2 = 0; cut2 <= fs2->operations(); ++cut2) {
      const std::string img3 = image_dir(scratch.path(), 2 + cut2);
      fs2->write_image(cut2, options, rng, img3);
      ++stats.chained;
      if (std::string e = check_cut(c, img3 + "/store", t, cut, options.lying_disk); !e.empty()) {
        ADD_FAILURE() << "cut after operation " << cut2 << " of the recovery from the cut after "
                      << "operation " << cut << " (seed " << seed << "): " << e;
        return;
      }
    }
  }
}

void run_store_cuts(CutOptions options, bool uring, std::uint64_t base_seed) {
  CutStats stats;
  std::mt19937_64 seeder(base_seed);
  const int n = seeds();
  for (int s = 0; s < n && !::testing::Test::HasFailure(); ++s) {
    const std::uint64_t seed = seeder();
    ScratchDir dir;
    auto fs = std::make_shared<PowerCutFs>(dir.path());
    const DiskStoreConfig c = workload_config(dir.store(), uring, fs);
    const Timeline t = run_store_workload(c, *fs, seed, 60);
    ASSERT_FALSE(::testing::Test::HasFailure());
    ASSERT_GT(t.durable_at.size(), 0u);
    check_every_cut(*fs, c, t, options, seed, 16, stats);
  }
  std::cout << n << " workloads, " << stats.cuts << " cuts and " << stats.chained
            << " chained cuts, " << stats.records << " records read back\n";
}

TEST(DiskPowerCut, GenerationsOfCutsAndRecoveriesKeepTheJournalHonest) {
  // Each generation works on the image a random cut of the previous one left, so recovery
  // (its torn tails cut, its appends after them) is itself cut at every operation; batches of
  // 8 entries span journal sectors, so torn tails with later entries persisted are common,
  // and without compaction the bytes after a cut tail stay in the file.
  constexpr std::size_t kGenerations = 16;
  CutStats stats;
  std::uint64_t torn_tails = 0;
  std::mt19937_64 rng(0x6E4E);
  const int runs = std::max(10, seeds());
  for (int s = 0; s < runs && !::testing::Test::HasFailure(); ++s) {
    ScratchDir root;
    std::string dir = image_dir(root.path(), 0);
    Timeline base;
    for (std::size_t g = 0; g < kGenerations; ++g) {
      const std::uint64_t seed = rng();
      auto fs = std::make_shared<PowerCutFs>(dir);
      DiskStoreConfig c = workload_config(dir + "/store", false, fs);
      c.journal_batch = 8;
      c.compact_slack = 4096;  // no compaction: a journal's tail lives on across generations
      const Timeline t = run_store_workload(c, *fs, seed, 30, base);
      ASSERT_FALSE(::testing::Test::HasFailure());
      check_every_cut(*fs, c, t, {CutMode::kSectors, false}, seed, 0, stats);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "generation " << g;
      // The next generation starts from a random cut; what its recovery keeps is durable.
      const std::string next = image_dir(root.path(), g + 1);
      // Half the time right after a journal append: a torn tail, maybe with later entries.
      const std::vector<std::size_t> torn = fs->cuts_after_writes_to("journal");
      const std::size_t cut = !torn.empty() && rng() % 2 == 0 ? torn[rng() % torn.size()]
                                                              : rng() % (fs->operations() + 1);
      fs->write_image(cut, {CutMode::kSectors, false}, rng, next);
      const std::string probe = image_dir(root.path(), 100 + g);
      std::filesystem::copy(next, probe, std::filesystem::copy_options::recursive);
      DiskStoreConfig pc = c;
      pc.directory = probe + "/store";
      pc.file_system = testing::unsynced_file_system();
      auto kept = DiskStore::open(pc);
      ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
      torn_tails += (*kept)->recovery().torn_tail_bytes > 0;
      base = Timeline{};
      for (const RecordInfo& r : (*kept)->records()) {
        base.committed.emplace(r.id.value(), r.desc);
        base.durable_at.emplace(r.id.value(), 0);
      }
      dir = next;
    }
  }
  std::cout << stats.cuts << " cuts over " << runs << " x " << kGenerations << " generations ("
            << torn_tails << " began with a torn journal tail), " << stats.records
            << " records read back\n";
}

// ---- the model itself ------------------------------------------------------------------

TEST(PowerCutFs, KeepsWhatWasSyncedAndCanLoseTheRest) {
  ScratchDir dir;
  PowerCutFs fs(dir.path());
  const std::string f = dir.path() + "/f";
  const int fd = fs.open(f.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  const std::vector<std::byte> a(1000, std::byte{0xAA}), b(1000, std::byte{0xBB});
  ASSERT_EQ(fs.pwrite(fd, a.data(), a.size(), 0), 1000);
  ASSERT_EQ(fs.fdatasync(fd), 0);
  ASSERT_EQ(fs.pwrite(fd, b.data(), b.size(), 500), 1000);
  ASSERT_EQ(fs.close(fd), 0);
  std::mt19937_64 rng(1);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  {  // The file's directory entry was never synced: strictly, the file is gone.
    ScratchDir img;
    fs.write_image(fs.operations(), {CutMode::kDurableOnly, false}, rng, img.path());
    EXPECT_FALSE(std::filesystem::exists(img.path() + "/f"));
  }
  const int dfd = fs.open(dir.path().c_str(), O_RDONLY | O_DIRECTORY, 0);
  ASSERT_EQ(fs.fsync(dfd), 0);
  fs.close(dfd);
  {  // Now it is there with the synced bytes only.
    ScratchDir img;
    fs.write_image(fs.operations(), {CutMode::kDurableOnly, false}, rng, img.path());
    EXPECT_EQ(read(img.path() + "/f"), std::string(1000, '\xAA'));
  }
  // Sector by sector the unsynced write lands in part: over many draws, images with only
  // some of its sectors appear, and every image is made of those two writes.
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    ScratchDir img;
    fs.write_image(fs.operations(), {CutMode::kSectors, false}, rng, img.path());
    const std::string got = read(img.path() + "/f");
    ASSERT_TRUE(got.size() == 1000 || got.size() == 1500) << got.size();
    for (std::size_t k = 0; k < got.size(); ++k) {
      ASSERT_TRUE(got[k] == '\xAA' || got[k] == '\xBB' || (k >= 1000 && got[k] == '\0'));
    }
    seen.insert(got);
  }
  EXPECT_GT(seen.size(), 3u) << "sector-wise images should vary";
}

// ---- the two directory-fsync gaps ---------------------------------------------------------

/// Opens the store on `fs` (in `dir`), puts one page, syncs and closes it; then checks the
/// strictest image (only what was fsynced) still has that page: "" or what is wrong.
std::string synced_page_survives(const std::string& dir, std::shared_ptr<PowerCutFs> fs) {
  const DiskStoreConfig c = workload_config(dir, false, fs);
  Timeline t;
  {
    auto store = DiskStore::open(c);
    if (!store) return "open: " + store.status().to_string();
    const RecordDesc d = RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(7, 4));
    auto id = (*store)->put(d, expected_bytes(d, (*store)->record_bytes(d.kind)));
    if (!id) return "put: " + id.status().to_string();
    if (Status s = (*store)->sync(); !s) return "sync: " + s.to_string();
    t.committed.emplace(id->value(), d);
    t.durable_at.emplace(id->value(), fs->operations());
  }
  std::mt19937_64 rng(2);
  ScratchDir img;
  fs->write_image(fs->operations(), {CutMode::kDurableOnly, false}, rng, img.path());
  return check_cut(c, img.path() + "/store", t, fs->operations(), false);
}

TEST(DiskPowerCut, AStoreDirectoryMadeByOpenSurvivesAPowerCut) {
  ScratchDir dir;  // open makes dir.store() itself
  EXPECT_EQ(synced_page_survives(dir.store(), std::make_shared<PowerCutFs>(dir.path())), "");
}

TEST(DiskPowerCut, ADataFileRecreatedByRecoverySurvivesAPowerCut) {
  ScratchDir dir;
  {
    auto store = DiskStore::open(workload_config(dir.store(), false, nullptr));
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  }
  std::filesystem::remove(dir.store() + "/data");  // lost (a bad disk, an operator)
  // Recovery makes a new, empty data file.
  EXPECT_EQ(synced_page_survives(dir.store(), std::make_shared<PowerCutFs>(dir.path())), "");
}

// ---- store workloads, a cut after every operation -------------------------------------

TEST(DiskPowerCut, EveryCutOfAStoreWorkloadRecovers_Sectors) {
  run_store_cuts({CutMode::kSectors, false}, false, 0x5EC7);
}

TEST(DiskPowerCut, EveryCutOfAStoreWorkloadRecovers_Prefix) {
  run_store_cuts({CutMode::kPrefix, false}, false, 0x9EF1);
}

TEST(DiskPowerCut, EveryCutOfAStoreWorkloadRecovers_DurableOnly) {
  run_store_cuts({CutMode::kDurableOnly, false}, false, 0xD0);
}

TEST(DiskPowerCut, EveryCutOfAStoreWorkloadOnIoUringRecovers) {
  run_store_cuts({CutMode::kSectors, false}, true, 0x0121);
}

TEST(DiskPowerCut, ALyingDiskLosesRecordsButNeverServesAWrongByte) {
  run_store_cuts({CutMode::kSectors, true}, false, 0x1E);
}

// ---- cache workloads ------------------------------------------------------------------

TEST(DiskPowerCut, ACacheReopenedAfterAnyCutServesOnlyRightBytes) {
  using radixtier::testing::extended;
  using radixtier::testing::kPrompts;
  using radixtier::testing::kPromptTokens;
  using radixtier::testing::kSnapshotAtEnd;
  using radixtier::testing::Process;
  using radixtier::testing::prompt;
  const CacheConfig cc = radixtier::testing::tiny_config();
  std::mt19937_64 seeder(0xCAC4E);
  std::uint64_t cuts = 0, from_disk = 0;
  for (int s = 0; s < seeds(); ++s) {
    const std::uint64_t seed = seeder();
    std::mt19937_64 rng(seed);
    ScratchDir dir;
    auto fs = std::make_shared<PowerCutFs>(dir.path());
    auto d = radixtier::testing::store_config(dir.store(), cc);
    d.journal_batch = 4;
    d.budget_bytes = 40 * cc.page_bytes;  // room for three of the six prompts
    d.compact_slack = 16;
    d.file_system = fs;
    // persist() points: the operation count when it returned OK, and the prompts then
    // wholly on the store (KV of every page and the snapshot at the end).
    std::vector<std::pair<std::size_t, std::vector<std::size_t>>> persisted;
    {
      auto p = std::make_unique<Process>(cc, d);
      ASSERT_TRUE(p->created) << p->created.to_string();
      for (int op = 0; op < 40; ++op) {
        const std::size_t i = rng() % kPrompts;
        const auto r =
            rng() % 2 ? p->h->serve(prompt(i), kSnapshotAtEnd) : p->h->serve(extended(i), {});
        ASSERT_TRUE(r.bytes_ok);
        if (rng() % 6 == 0 && p->cache().persist().is_ok()) {
          std::vector<std::size_t> whole;
          for (std::size_t k = 0; k < kPrompts; ++k) {
            const auto nodes = p->cache().inspect(prompt(k));
            bool all = !nodes.empty() && nodes.back().boundary == kPromptTokens &&
                       nodes.back().snapshot_on_store;
            for (const NodeInfo& n : nodes) all = all && n.kv_on_store;
            if (all) whole.push_back(k);
          }
          persisted.push_back({fs->operations(), whole});
        }
        if (rng() % 10 == 0) {  // a restart
          p.reset();
          p = std::make_unique<Process>(cc, d);
          ASSERT_TRUE(p->created) << p->created.to_string();
        }
      }
    }
    const std::size_t ops = fs->operations();
    std::vector<std::size_t> points;
    for (std::size_t k = 0; k <= ops; k += 1 + ops / 60) points.push_back(k);
    for (const auto& [at, whole] : persisted) points.push_back(at);
    for (std::size_t cut : points) {
      ScratchDir img;
      fs->write_image(cut, {CutMode::kSectors, false}, rng, img.path());
      auto dc = d;
      dc.directory = img.path() + "/store";
      dc.file_system = testing::unsynced_file_system();
      Process p(cc, dc);
      ASSERT_TRUE(p.created) << "cut " << cut << ": " << p.created.to_string();
      ASSERT_EQ(p.cache().check_invariants(), "") << "cut " << cut;
      ASSERT_EQ(p.store->check_invariants(), "") << "cut " << cut;
      std::vector<std::size_t> must;
      for (const auto& [at, whole] : persisted) {
        if (at == cut) must = whole;
      }
      for (std::size_t i = 0; i < kPrompts; ++i) {
        const auto r = p.h->serve(extended(i), {});
        ASSERT_TRUE(r.error.empty()) << "cut " << cut << ", prompt " << i << ": " << r.error;
        ASSERT_TRUE(r.bytes_ok) << "cut " << cut << ", prompt " << i;
        if (std::find(must.begin(), must.end(), i) != must.end()) {
          ASSERT_EQ(r.cached, kPromptTokens)
              << "cut right after persist() at " << cut << ": prompt " << i << " is not back";
        }
        p.drain();
      }
      from_disk += p.cache().stats().hit_tokens_store;
      ++cuts;
    }
  }
  std::cout << cuts << " cuts of cache workloads, " << from_disk
            << " tokens served from disk after them, 0 wrong\n";
  EXPECT_GT(from_disk, 0u);
}

}  // namespace
}  // namespace radixtier::disk
