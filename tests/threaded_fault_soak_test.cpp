// Threaded fault soak: the reference scheduler drives the cache over the threaded host engine
// (copies really run on the engine's worker thread) while a second thread delays, resumes and
// fails copies as they are queued. The executor writes into every page and snapshot the bytes
// of its prefix (tests/cache_harness.hpp's pattern) and checks, at every forward, every page
// the request reads and the snapshot it resumed from. At least 10^5 cache operations per
// policy (RADIXTIER_SOAK_OPS raises it); ThreadSanitizer runs it in CI (preset tsan), so a
// copy touching a page the scheduler uses is also a reported data race.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "cache_harness.hpp"
#include "radixtier/scheduler/scheduler.hpp"

namespace radixtier {
namespace {

using sched::RequestId;
using testing::expected_byte;
using testing::prefix_hash;

constexpr std::uint8_t kPageSalt = 0x11, kStateSalt = 0x77;

/// The state after `prefix`: what a snapshot of that prefix must hold.
std::vector<std::byte> state_of(std::span<const Token> prefix, std::size_t bytes) {
  std::vector<std::byte> s(bytes);
  const std::uint64_t h = prefix_hash(prefix);
  for (std::size_t i = 0; i < bytes; ++i) s[i] = expected_byte(h, i, kStateSalt);
  return s;
}

/// An Executor without a model: forward() writes each page it completes with the pattern of
/// its prefix and checks every complete page it reads; the live state is the pattern of the
/// prefix forwarded so far, so a restored snapshot is checked at the first forward.
class PatternExecutor final : public sched::Executor {
 public:
  PatternExecutor(HostArenas& memory, std::uint32_t page_size)
      : memory_(memory), page_size_(page_size) {}

  void expect(RequestId id, std::vector<Token> prompt) { prompts_[id] = std::move(prompt); }
  std::uint64_t pages_checked() const { return pages_checked_; }
  std::uint64_t snapshots_checked() const { return snapshots_checked_; }
  const std::vector<std::string>& errors() const { return errors_; }

  std::size_t state_bytes() const override { return memory_.snapshot_bytes(); }

  Status begin(RequestId id, std::optional<GpuSlotId> restore_from) override {
    auto p = prompts_.find(id);
    if (p == prompts_.end() || live_.count(id)) return invalid_argument("begin: bad request");
    Live l;
    l.seq = p->second;
    if (restore_from) {
      if (restore_from->value() >= memory_.gpu_slots()) return invalid_argument("begin: slot");
      auto s = memory_.gpu_snapshot(*restore_from);
      l.state.assign(s.begin(), s.end());  // a copy: the cached slot is only read (rule 6)
      l.restored = true;
    }
    live_.emplace(id, std::move(l));
    return Status::ok();
  }

  Result<double> forward(RequestId id, std::span<const Token> tokens, std::size_t pos,
                         std::span<const GpuPageId> table) override {
    return forward_capturing(id, tokens, pos, table, {});
  }

  /// Captures after any token: each slot gets the pattern of the prefix before its position.
  std::size_t capture_granularity() const override { return 1; }
  Result<double> forward_capturing(RequestId id, std::span<const Token> tokens, std::size_t pos,
                                   std::span<const GpuPageId> table,
                                   std::span<const sched::StateCapture> captures) override {
    if (Status s = sched::check_captures(captures, pos, tokens.size(), 1); !s) return s;
    for (const sched::StateCapture& c : captures) {
      if (c.slot.value() >= memory_.gpu_slots()) return invalid_argument("capture: slot");
    }
    auto it = live_.find(id);
    if (it == live_.end()) return invalid_argument("forward: unknown request");
    Live& l = it->second;
    const std::span<const Token> seq(l.seq);
    if (pos + tokens.size() > seq.size() ||
        !std::equal(tokens.begin(), tokens.end(), seq.begin() + static_cast<std::ptrdiff_t>(pos)))
      return error("forward: tokens are not the request's sequence at their positions");
    if (!l.started) {
      l.started = true;
      if (l.restored) {
        ++snapshots_checked_;
        if (l.state != state_of(seq.first(pos), state_bytes()))
          return error("the restored snapshot is not the state after the cached prefix");
      } else if (pos != 0) {
        return error("forward: resumed at a cached prefix without its snapshot");
      }
    } else if (pos != l.done) {
      return error("forward: positions skipped or repeated");
    }
    if ((pos + tokens.size() + page_size_ - 1) / page_size_ > table.size())
      return error("forward: the page table does not cover the new positions");
    for (std::size_t i = 0; (i + 1) * page_size_ <= pos; ++i) {  // the K/V this forward reads
      ++pages_checked_;
      if (!page_holds(table[i], seq, i))
        return error("page " + std::to_string(i) + " does not hold its prefix's bytes");
    }
    l.done = pos + tokens.size();
    for (std::size_t i = pos / page_size_; (i + 1) * page_size_ <= l.done; ++i) {
      auto bytes = memory_.gpu_page(table[i]);
      const std::uint64_t h = prefix_hash(seq.first((i + 1) * page_size_));
      for (std::size_t b = 0; b < bytes.size(); ++b) bytes[b] = expected_byte(h, b, kPageSalt);
    }
    l.state = state_of(seq.first(l.done), state_bytes());
    for (const sched::StateCapture& c : captures) {
      write_slot(c.slot, state_of(seq.first(c.position), state_bytes()));
    }
    return 1e-6 * static_cast<double>(tokens.size());
  }

  std::span<const float> last_logits(RequestId) const override { return {}; }

  Result<Token> next_token(RequestId id) override {
    auto it = live_.find(id);
    if (it == live_.end()) return invalid_argument("next_token: unknown request");
    auto& seq = it->second.seq;
    seq.push_back(Token(1 + prefix_hash(seq) % 3));
    return seq.back();
  }

  Status save_snapshot(RequestId id, GpuSlotId slot) override {
    auto it = live_.find(id);
    if (it == live_.end()) return invalid_argument("save_snapshot: unknown request");
    write_slot(slot, it->second.state);
    return Status::ok();
  }

  Status checkpoint(RequestId id) override {
    auto it = live_.find(id);
    if (it == live_.end()) return invalid_argument("checkpoint: unknown request");
    it->second.checkpoint = it->second.state;
    return Status::ok();
  }

  Status save_checkpoint(RequestId id, GpuSlotId slot) override {
    auto it = live_.find(id);
    if (it == live_.end() || it->second.checkpoint.empty())
      return Status(ErrorCode::kFailedPrecondition, "save_checkpoint: no checkpoint");
    write_slot(slot, it->second.checkpoint);
    return Status::ok();
  }

  void end(RequestId id) override { live_.erase(id); }

 private:
  struct Live {
    std::vector<Token> seq;  ///< prompt, then every token next_token() produced
    std::vector<std::byte> state, checkpoint;
    std::size_t done = 0;
    bool restored = false, started = false;
  };

  Status error(std::string what) {
    if (errors_.size() < 10) errors_.push_back(what);
    return Status(ErrorCode::kFailedPrecondition, std::move(what));
  }
  bool page_holds(GpuPageId id, std::span<const Token> seq, std::size_t page) const {
    auto bytes = memory_.gpu_page(id);
    const std::uint64_t h = prefix_hash(seq.first((page + 1) * page_size_));
    for (std::size_t b = 0; b < bytes.size(); ++b)
      if (bytes[b] != expected_byte(h, b, kPageSalt)) return false;
    return true;
  }
  void write_slot(GpuSlotId slot, const std::vector<std::byte>& state) {
    auto bytes = memory_.gpu_snapshot(slot);
    std::copy(state.begin(), state.end(), bytes.begin());
  }

  HostArenas& memory_;
  std::uint32_t page_size_;
  std::map<RequestId, std::vector<Token>> prompts_;
  std::map<RequestId, Live> live_;
  std::uint64_t pages_checked_ = 0, snapshots_checked_ = 0;
  std::vector<std::string> errors_;
};

/// Forwards every call to the cache and counts them (the soak's operations).
class CountingCache final : public CacheBackend {
 public:
  explicit CountingCache(PrefixCache& c) : c_(c) {}
  std::uint64_t calls() const { return calls_; }

  std::uint32_t page_size() const override { return c_.page_size(); }
  Result<Admission> admit(std::span<const Token> prompt) override {
    ++calls_;
    return c_.admit(prompt);
  }
  Result<TransferState> poll(LockId lock) override {
    ++calls_;
    return c_.poll(lock);
  }
  Result<std::size_t> wait(LockId lock) override {
    ++calls_;
    return c_.wait(lock);
  }
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override {
    ++calls_;
    return c_.path_pages(lock);
  }
  Result<GpuSlotId> path_snapshot(LockId lock) const override {
    ++calls_;
    return c_.path_snapshot(lock);
  }
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override {
    ++calls_;
    return c_.alloc_pages(lock, n);
  }
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override {
    ++calls_;
    return c_.alloc_snapshot_slot(lock);
  }
  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override {
    ++calls_;
    return c_.free_pages(lock, pages);
  }
  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override {
    ++calls_;
    return c_.free_snapshot_slot(lock, slot);
  }
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override {
    ++calls_;
    return c_.insert(lock, tokens, pages, snapshot);
  }
  Status release(LockId lock) override {
    ++calls_;
    return c_.release(lock);
  }
  CacheStats stats() const override { return c_.stats(); }
  std::string check_invariants() const override { return c_.check_invariants(); }

 private:
  PrefixCache& c_;
  mutable std::uint64_t calls_ = 0;
};

/// The second thread: decides once for every copy it sees queued whether to fail it (1/12),
/// delay it (1/4; resumed after ~200 us) or leave it, until stopped; then resumes the rest.
class FaultThread {
 public:
  explicit FaultThread(HostTransferEngine& engine) : engine_(engine), thread_([this] { run(); }) {}
  ~FaultThread() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::uint64_t failed() const { return failed_; }
  std::uint64_t delayed() const { return delayed_; }
  std::uint64_t resumed() const { return resumed_; }

 private:
  void run() {
    using Clock = std::chrono::steady_clock;
    std::mt19937_64 rng(20261201);
    std::deque<std::pair<TicketId, Clock::time_point>> held;
    std::uint64_t next = 0;  // ticket ids grow: each is decided on once
    while (!stop_) {
      for (TicketId id : engine_.pending()) {
        if (id.value() < next) continue;
        next = id.value() + 1;
        const auto pick = rng() % 12;
        if (pick == 0) {
          engine_.fail_ticket(id);
          ++failed_;
        } else if (pick <= 3) {
          engine_.delay_ticket(id);
          held.emplace_back(id, Clock::now());
          ++delayed_;
        }
      }
      while (!held.empty() &&
             (Clock::now() - held.front().second > std::chrono::microseconds(200) ||
              held.size() > 8)) {
        engine_.resume(held.front().first);
        held.pop_front();
        ++resumed_;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    for (auto& [id, at] : held) engine_.resume(id);
    resumed_ += held.size();
  }

  HostTransferEngine& engine_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> failed_{0}, delayed_{0}, resumed_{0};
  std::thread thread_;
};

std::uint64_t target_ops() {
  const char* env = std::getenv("RADIXTIER_SOAK_OPS");
  return env ? std::strtoull(env, nullptr, 10) : 100'000;
}

class ThreadedFaultSoak : public ::testing::TestWithParam<WritePolicy> {};

TEST_P(ThreadedFaultSoak, SchedulerKeepsEveryByteWhileCopiesAreDelayedResumedAndFailed) {
  CacheConfig c = testing::small_config(GetParam());
  c.gpu_pages = 40;  // three running requests of up to 20 pages, and what the tree keeps
  c.host_pages = 128;
  c.gpu_snapshot_slots = 6;
  c.host_snapshot_slots = 16;
  HostArenas memory(c);
  HostTransferEngine engine(memory, c.slice_pages, HostTransferEngine::Mode::kThreaded);
  auto made = PrefixCache::create(c, engine);
  ASSERT_TRUE(made) << made.status().to_string();
  PrefixCache& cache = **made;
  CountingCache counted(cache);
  PatternExecutor executor(memory, c.page_size);
  sched::SchedulerConfig sc;
  sc.chunk_tokens = 8;
  // Write-through runs forwards of three chunks: the snapshots inside them are captures.
  sc.forward_tokens = GetParam() == WritePolicy::kWriteThrough ? 24 : 0;
  sc.max_running = 3;
  sc.policy = sched::SnapshotPolicy::every_chunk();
  sc.max_admissions = 32;
  sched::Scheduler scheduler(counted, executor, sc);

  FaultThread faults(engine);
  std::mt19937_64 rng(20261130);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::uint64_t target = target_ops();
  RequestId next_id = 1;
  std::size_t ok = 0, gave_up = 0;
  while (counted.calls() < target) {
    // A batch of requests sharing prefixes: a cut of one of six conversations, a short
    // private tail, up to 6 output tokens.
    const RequestId first = next_id;
    for (int i = 0; i < 64; ++i) {
      std::vector<Token> prompt;
      const Token base = Token(10'000 * (1 + pick(6)));
      for (std::size_t t = pick(72); t > 0; --t) prompt.push_back(base + Token(prompt.size()));
      for (std::size_t t = pick(6); t > 0; --t) prompt.push_back(Token(1 + pick(3)));
      prompt.push_back(7);
      executor.expect(next_id, prompt);
      ASSERT_TRUE(scheduler.submit({next_id, prompt, pick(7), 0.0}));
      ++next_id;
    }
    for (int steps = 0; !scheduler.idle(); ++steps) {
      Status s = scheduler.step();
      ASSERT_TRUE(s) << s.to_string();
      if (steps % 32 == 0) {
        ASSERT_EQ(cache.check_invariants(), "");
      }
    }
    for (RequestId id = first; id < next_id; ++id) {
      const sched::RequestResult* r = scheduler.result(id);
      ASSERT_NE(r, nullptr) << "request " << id;
      if (r->status) {
        ++ok;
        continue;
      }
      // The only acceptable failure: promotions kept failing (the injected faults).
      ASSERT_NE(r->status.message().find("gave up"), std::string::npos) << r->status.to_string();
      ASSERT_GT(r->transfer_failures, 0u) << r->status.to_string();
      ++gave_up;
    }
    ASSERT_EQ(executor.errors(), std::vector<std::string>());
  }
  faults.stop();
  cache.drain();
  EXPECT_EQ(cache.check_invariants(), "");
  EXPECT_EQ(executor.errors(), std::vector<std::string>());
  const CacheStats st = cache.stats();
  std::printf(
      "  %llu cache operations, %zu requests (%zu gave up), %llu pages and %llu "
      "snapshots checked; copies: %llu failed, %llu delayed, %llu resumed by the fault "
      "thread; %llu KV pages promoted\n",
      static_cast<unsigned long long>(counted.calls()), ok + gave_up, gave_up,
      static_cast<unsigned long long>(executor.pages_checked()),
      static_cast<unsigned long long>(executor.snapshots_checked()),
      static_cast<unsigned long long>(faults.failed()),
      static_cast<unsigned long long>(faults.delayed()),
      static_cast<unsigned long long>(faults.resumed()),
      static_cast<unsigned long long>(st.kv_pages_promoted));
  EXPECT_GE(counted.calls(), target);
  EXPECT_GT(executor.pages_checked(), 0u);
  EXPECT_GT(executor.snapshots_checked(), 0u);
  if (sc.forward_tokens > 0) {
    EXPECT_GT(scheduler.stats().snapshots_captured, 0u);
  }
  EXPECT_GT(faults.failed(), 0u);
  EXPECT_GT(faults.delayed(), 0u);
  EXPECT_EQ(faults.resumed(), faults.delayed());
  EXPECT_GT(st.transfers_failed, 0u);
  EXPECT_GT(st.kv_pages_promoted, 0u);
  EXPECT_GT(ok, 10 * gave_up);
}

INSTANTIATE_TEST_SUITE_P(Policies, ThreadedFaultSoak,
                         ::testing::Values(WritePolicy::kWriteBack, WritePolicy::kWriteThrough),
                         [](const auto& info) {
                           return info.param == WritePolicy::kWriteBack ? "WriteBack"
                                                                        : "WriteThrough";
                         });

}  // namespace
}  // namespace radixtier
