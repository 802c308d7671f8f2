// Crash consistency: a child process writes, erases and syncs random records on one store
// directory and is SIGKILLed at a random moment; the parent reopens the directory and checks
// (1) every record it serves has exactly its bytes, (2) every record the child reported as
// durable (its sync returned) is there, (3) every erase reported durable stuck, (4) the
// store's invariants. The directory carries over from one kill to the next, so recovery is
// also tested on stores that earlier recoveries wrote.
//
// Kill points: RADIXTIER_DISK_CRASH_KILLS (default 200; `make soak` runs 10,000).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>

#include "disk_harness.hpp"
#include "radixtier/disk/disk_store.hpp"

namespace radixtier::disk {
namespace {

using testing::check_every_byte;
using testing::expected_bytes;
using testing::page_tokens_for;
using testing::TempDir;

struct Event {
  // 1: committed and durable; 2: erased and durable; 3: about to erase (sent before the
  // erase, so a durable erase whose report the kill cut off is still known as possible).
  std::uint64_t type;
  std::uint64_t id;
};

DiskStoreConfig crash_config(const std::string& dir, bool uring) {
  DiskStoreConfig c = testing::small_config(dir, 48);
  c.journal_batch = 6;
  c.compact_slack = 64;  // compaction happens often, and is killed too
  c.io.kind = uring ? IoEngineKind::kAuto : IoEngineKind::kThreadPool;
  return c;
}

/// The child: random work until killed (or 400 operations). Never returns.
[[noreturn]] void child_workload(const DiskStoreConfig& c, std::uint64_t seed, int fd) {
  std::mt19937_64 rng(seed);
  auto store = DiskStore::open(c);
  if (!store.is_ok()) _exit(3);
  std::vector<RecordInfo> live = (*store)->records();
  std::vector<Event> unsynced;
  auto report = [&] {
    if ((*store)->stats().unsynced_entries != 0 || unsynced.empty()) return;
    for (const Event& e : unsynced) {
      if (::write(fd, &e, sizeof e) != static_cast<ssize_t>(sizeof e)) _exit(4);
    }
    unsynced.clear();
  };
  for (int op = 0; op < 400; ++op) {
    const auto dice = rng() % 10;
    if (dice < 6) {  // a batch of 1-4 records: pages extending a live page, or snapshots
      std::vector<RecordDesc> descs;
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) descs.push_back(testing::random_desc(rng, live));
      std::vector<std::vector<std::byte>> bytes;
      std::vector<WriteRequest> reqs;
      for (const RecordDesc& d : descs)
        bytes.push_back(expected_bytes(d, (*store)->record_bytes(d.kind)));
      for (std::size_t i = 0; i < descs.size(); ++i) reqs.push_back({descs[i], bytes[i], {}});
      auto pending = (*store)->submit_writes(std::move(reqs));
      if (pending.is_ok()) {
        auto ids = (*store)->complete_writes(std::move(pending).value());
        if (!ids.is_ok()) _exit(5);
        for (RecordId id : *ids) {
          unsynced.push_back({1, id.value()});
          live.push_back(*(*store)->find(id));
        }
      } else if (pending.status().code() != ErrorCode::kOutOfMemory) {
        _exit(6);
      }
    } else if (dice < 9 && !live.empty()) {
      const std::size_t at = rng() % live.size();
      const Event intent{3, live[at].id.value()};
      if (::write(fd, &intent, sizeof intent) != static_cast<ssize_t>(sizeof intent)) _exit(4);
      if (!(*store)->erase(live[at].id).is_ok()) _exit(7);
      unsynced.push_back({2, live[at].id.value()});
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    } else {
      if (!(*store)->sync().is_ok()) _exit(8);
    }
    report();
  }
  _exit(0);
}

int kill_points() {
  const char* env = std::getenv("RADIXTIER_DISK_CRASH_KILLS");
  return env ? std::max(1, std::atoi(env)) : 200;
}

TEST(DiskCrash, EveryKillLeavesWholeRecordsOrNone) {
  TempDir dir;
  const int kills = kill_points();
  std::mt19937_64 rng(0xC0FFEE);
  std::set<std::uint64_t> durable;  // live as far as the parent knows for sure
  std::set<std::uint64_t> erased;   // erased and durable: must never come back
  std::set<std::uint64_t> erasing;  // maybe erased: may be there or not
  std::uint64_t served = 0, finished = 0, max_records = 0;
  for (int k = 0; k < kills; ++k) {
    const bool uring = k % 2 == 0;
    const DiskStoreConfig c = crash_config(dir.store(), uring);
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::uint64_t seed = rng();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      child_workload(c, seed, fds[1]);
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) {
      ASSERT_EQ(WEXITSTATUS(status), 0) << "child failed at kill point " << k;
      ++finished;
    }
    Event e{};
    while (::read(fds[0], &e, sizeof e) == static_cast<ssize_t>(sizeof e)) {
      if (e.type == 1) {
        durable.insert(e.id);
      } else if (e.type == 2) {
        durable.erase(e.id);
        erasing.erase(e.id);
        erased.insert(e.id);
      } else {
        durable.erase(e.id);
        erasing.insert(e.id);
      }
    }
    ::close(fds[0]);

    auto store = DiskStore::open(c);
    ASSERT_TRUE(store.is_ok()) << "kill point " << k << ": " << store.status().to_string();
    ASSERT_EQ((*store)->check_invariants(), "") << "kill point " << k;
    std::uint64_t lost = 0;
    ASSERT_EQ(check_every_byte(**store, &lost), "") << "kill point " << k;
    ASSERT_EQ(lost, 0u) << "kill point " << k << ": a committed record lost its bytes";
    std::set<std::uint64_t> present;
    for (const RecordInfo& r : (*store)->records()) present.insert(r.id.value());
    for (std::uint64_t id : durable) {
      ASSERT_TRUE(present.count(id))
          << "kill point " << k << ": durable record " << id << " is missing";
    }
    for (std::uint64_t id : erased) {
      ASSERT_FALSE(present.count(id))
          << "kill point " << k << ": erased record " << id << " came back";
    }
    served += present.size();
    max_records = std::max<std::uint64_t>(max_records, present.size());
    durable = present;  // the parent's open made them durable (it syncs what it changed)
    erasing.clear();
  }
  std::cout << kills << " kill points (" << finished << " children finished first), " << served
            << " records checked byte by byte, up to " << max_records << " at once, 0 wrong\n";
  EXPECT_LT(finished, static_cast<std::uint64_t>(kills));
}

}  // namespace
}  // namespace radixtier::disk
