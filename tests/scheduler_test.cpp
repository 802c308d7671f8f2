// The reference scheduler against the node-residency cache: every request served with reuse
// gives the same output tokens and logits, bit for bit, as the request computed from scratch;
// plus the compaction, churn, pressure, failure and clock cases of issue #3.
#include <gtest/gtest.h>

#include <stdexcept>

#include "demo/scenarios.hpp"
#include "model/model_executor.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/scheduler/no_reuse_cache.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "workload/shapes.hpp"

namespace radixtier::sched {
namespace {

model::TinyModelConfig small_model() {
  model::TinyModelConfig m;
  m.vocab = 61;
  m.d_model = 16;
  m.layers = "GAG";
  m.heads = 2;
  m.head_dim = 8;
  m.kv_heads = 1;
  m.mlp_dim = 32;
  m.page_size = 8;
  return m;
}

std::vector<Token> tokens(std::uint64_t seed, std::size_t n, std::uint32_t vocab = 61) {
  std::vector<Token> out(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& t : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<Token>(x % vocab);
  }
  return out;
}

using workload::cat;

/// Arenas sized for `m` with `gpu_pages` pages of 8 tokens and `slots` snapshot slots.
CacheConfig arena_config(const model::TinyHybridModel& m, std::uint32_t gpu_pages,
                         std::uint32_t slots) {
  CacheConfig cc;
  cc.page_size = 8;
  cc.gpu_pages = gpu_pages;
  cc.gpu_snapshot_slots = slots;
  cc.page_bytes = m.page_bytes();
  cc.snapshot_bytes = m.state_bytes();
  return cc;
}

demo::Workload workload(const std::string& policy = "end-only") {
  demo::Workload w;
  w.name = "test";
  w.model = small_model();
  w.cache.page_size = 8;
  w.cache.gpu_pages = 64;
  w.cache.host_pages = 128;
  w.cache.gpu_snapshot_slots = 4;
  w.cache.host_snapshot_slots = 16;
  w.cache.slice_pages = 4;
  w.sched.chunk_tokens = 32;
  w.sched.max_running = 1;
  w.sched.policy = *SnapshotPolicy::parse(policy);
  w.sched.check_invariants = true;
  return w;
}

void add(demo::Workload& w, std::vector<Token> prompt, std::size_t out, double at = 0) {
  w.requests.push_back(Request{w.requests.size() + 1, std::move(prompt), out, at});
}

/// Runs with the cache, checks every request against the from-scratch reference.
demo::RunOutcome run_exact(const demo::Workload& w) {
  const model::TinyHybridModel m(w.model);
  demo::RunOutcome out = demo::run_workload(w, m, true);
  EXPECT_TRUE(out.status) << out.status.to_string();
  for (const auto& req : w.requests) {
    auto it = out.results.find(req.id);
    EXPECT_NE(it, out.results.end()) << "request " << req.id;
    if (it == out.results.end()) continue;
    EXPECT_TRUE(it->second.status) << "request " << req.id << ": " << it->second.status.to_string();
    EXPECT_TRUE(demo::same_answer(it->second, demo::reference_run(m, req)))
        << "request " << req.id << " differs from its from-scratch computation";
  }
  return out;
}

TEST(SchedulerConfig, RejectsNonsenseNamingTheField) {
  SchedulerConfig c;
  c.chunk_tokens = 12;
  Status s = c.validate(8);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk_tokens"), std::string::npos);
  c.chunk_tokens = 0;
  EXPECT_FALSE(c.validate(8));
  c.chunk_tokens = 16;
  EXPECT_TRUE(c.validate(8));
  c.max_running = 0;
  EXPECT_NE(c.validate(8).message().find("max_running"), std::string::npos);
  c.max_running = 1;
  c.policy = SnapshotPolicy::interval(12);
  EXPECT_NE(c.validate(8).message().find("policy"), std::string::npos);
  c.policy = SnapshotPolicy::interval(24);
  EXPECT_TRUE(c.validate(8));
  c.forward_tokens = 24;  // not a multiple of chunk_tokens (16)
  EXPECT_NE(c.validate(8).message().find("forward_tokens"), std::string::npos);
  c.forward_tokens = 64;
  EXPECT_TRUE(c.validate(8));

  NoReuseCache cache(8, 16, 2);
  const model::TinyHybridModel m(small_model());
  const CacheConfig cc = arena_config(m, 16, 2);
  HostArenas mem(cc);
  ModelExecutor exec(m, mem);
  c.chunk_tokens = 5;
  EXPECT_FALSE(Scheduler::create(cache, exec, c));
  EXPECT_THROW(Scheduler(cache, exec, c), std::invalid_argument);
}

TEST(Scheduler, SubmitRejectsEmptyPromptAndDuplicateId) {
  NoReuseCache cache(8, 16, 2);
  const model::TinyHybridModel m(small_model());
  const CacheConfig cc = arena_config(m, 16, 2);
  HostArenas mem(cc);
  ModelExecutor exec(m, mem);
  SchedulerConfig c;
  c.chunk_tokens = 16;
  Scheduler s(cache, exec, c);
  EXPECT_EQ(s.submit(Request{1, {}, 1, 0}).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(s.submit(Request{1, tokens(1, 20), 3, 0}));
  EXPECT_EQ(s.submit(Request{1, tokens(2, 20), 3, 0}).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(s.run_until_idle());
  ASSERT_NE(s.result(1), nullptr);
  EXPECT_TRUE(
      demo::same_answer(*s.result(1), demo::reference_run(m, Request{1, tokens(1, 20), 3, 0})));
  EXPECT_TRUE(cache.check_invariants().empty());
}

TEST(Scheduler, SharedPrefixesAreReusedExactly) {
  for (const char* policy : {"end-only", "every-chunk", "interval:16", "budgeted"}) {
    SCOPED_TRACE(policy);
    auto w = workload(policy);
    const auto a = tokens(1, 100);
    add(w, a, 5);
    add(w, cat(a, tokens(2, 30)), 5);  // extends A: resumes at A's final snapshot
    add(w, a, 3);                      // the same prompt again: all but the last token
    add(w, {a.begin(), a.begin() + 70}, 2);
    auto out = run_exact(w);
    EXPECT_EQ(out.results[2].cached_tokens, 96u);
    EXPECT_EQ(out.results[2].recomputed_tokens, 34u);
    EXPECT_EQ(out.results[3].cached_tokens, 96u);
  }
}

// Issue 15 item 8: the scheduler admits each request in its own key namespace, so the same
// prompt under another adapter or tenant recomputes (and stays exact) instead of reusing.
TEST(Scheduler, RequestsReuseOnlyWithinTheirNamespace) {
  auto w = workload();
  const auto a = tokens(1, 100);
  add(w, a, 5);
  add(w, a, 5);
  w.requests.back().ns = NamespaceId(1);
  w.requests.back().priority = 80;
  add(w, a, 3);
  w.requests.back().ns = NamespaceId(1);
  add(w, a, 3);  // the default namespace again
  auto out = run_exact(w);
  EXPECT_EQ(out.results[2].cached_tokens, 0u);
  EXPECT_EQ(out.results[3].cached_tokens, 96u);
  EXPECT_EQ(out.results[4].cached_tokens, 96u);
}

TEST(Scheduler, TurnTwoResumesAtTheFinishBoundary) {
  auto w = workload();
  const model::TinyHybridModel m(small_model());
  const auto turn1 = tokens(3, 75);
  add(w, turn1, 10);
  const auto ref = demo::reference_run(m, w.requests[0]);
  add(w, cat(cat(turn1, ref.output), tokens(4, 9)), 4);
  auto out = run_exact(w);
  // 75 prompt + 9 forwarded outputs = 84 positions: finish boundary 80.
  EXPECT_EQ(out.results[2].cached_tokens, 80u);
  EXPECT_EQ(out.results[1].snapshot_boundaries, (std::vector<std::size_t>{72, 80}));
}

TEST(Scheduler, CompactionReplayRecomputesAtMostOneInterval) {
  for (std::size_t end : {150u, 203u, 257u, 311u}) {
    SCOPED_TRACE(end);
    auto w = workload("interval:48");
    w.cache.gpu_snapshot_slots = 2;  // most intermediate snapshots go to host
    const auto prompt = tokens(5, 400);
    add(w, prompt, 2);
    add(w, cat({prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(end)}, tokens(6, 3)),
        2);
    auto out = run_exact(w);
    const std::size_t replay = end + 3;
    // The deepest snapshot at or below the replay's end (all but its last token).
    EXPECT_EQ(out.results[2].cached_tokens, (replay - 1) / 48 * 48);
    EXPECT_LE(out.results[2].recomputed_tokens, 48u + 3u);
  }
  // End-only keeps nothing below the end: the replay recomputes everything.
  auto w = workload("end-only");
  const auto prompt = tokens(5, 400);
  add(w, prompt, 2);
  add(w, cat({prompt.begin(), prompt.begin() + 257}, tokens(6, 3)), 2);
  EXPECT_EQ(run_exact(w).results[2].cached_tokens, 0u);
}

TEST(Scheduler, AdaptivePlacementSpendsFreeHostBytesOnIntermediateSnapshots) {
  // A replay that ends inside a 400-token prompt. With a host tier that holds the prompt's KV
  // many times over, adaptive keeps a snapshot at every chunk end (32 tokens): the replay
  // recomputes less than a chunk. With a host tier that holds only the KV, the 1/8 budget
  // keeps fewer, and the replay recomputes more.
  const auto prompt = tokens(5, 400);
  std::size_t recomputed[2] = {0, 0};
  for (std::uint32_t host_pages : {1024u, 60u}) {
    SCOPED_TRACE(host_pages);
    auto w = workload("adaptive");
    w.cache.host_pages = host_pages;
    w.cache.host_snapshot_slots = 1;
    add(w, prompt, 2);
    add(w, cat({prompt.begin(), prompt.begin() + 257}, tokens(6, 3)), 2);
    auto out = run_exact(w);
    recomputed[host_pages == 60u] = out.results[2].recomputed_tokens;
    if (host_pages == 1024u) {
      EXPECT_EQ(out.results[2].cached_tokens, 256u);
      EXPECT_GE(out.results[1].snapshots_kept, 12u);  // 11 chunk ends + the prompt end
    }
  }
  EXPECT_LT(recomputed[0], 32u);
  EXPECT_GT(recomputed[1], recomputed[0]);
}

TEST(Scheduler, TailKeepsTheLastChunkBoundaryBelowThePromptAndStaysExact) {
  // 100-token prompt, pages of 8, chunks of 32: final boundary 96, tail boundary 64.
  const auto a = tokens(1, 100);
  for (const char* policy : {"end-only", "end-only+tail", "budgeted+tail"}) {
    SCOPED_TRACE(policy);
    auto w = workload(policy);
    add(w, a, 5);
    add(w, cat({a.begin(), a.begin() + 70}, tokens(2, 10)), 3);  // diverges inside the tail
    auto out = run_exact(w);
    if (std::string(policy) == "end-only") {
      EXPECT_EQ(out.results[1].snapshot_boundaries, (std::vector<std::size_t>{96, 104}));
      EXPECT_EQ(out.results[2].cached_tokens, 0u);
    } else {
      // 100 prompt + 4 forwarded outputs = finish boundary 104.
      EXPECT_EQ(out.results[1].snapshot_boundaries, (std::vector<std::size_t>{64, 96, 104}));
      EXPECT_EQ(out.results[2].cached_tokens, 64u);
      EXPECT_EQ(out.results[2].recomputed_tokens, 16u);
    }
  }
}

TEST(Scheduler, BranchKeepsASnapshotWhereThePromptLeavesCachedKv) {
  const auto shared = tokens(1, 70);
  for (const char* policy : {"end-only", "end-only+branch"}) {
    SCOPED_TRACE(policy);
    auto w = workload(policy);
    for (std::uint64_t i = 0; i < 3; ++i) add(w, cat(shared, tokens(10 + i, 30)), 2);
    auto out = run_exact(w);
    // The second prompt follows the first one's KV for 8 pages (64 tokens), no snapshot there.
    EXPECT_EQ(out.results[2].cached_tokens, 0u);
    EXPECT_EQ(out.results[2].kv_tokens, 64u);
    const bool branch = std::string(policy) != "end-only";
    EXPECT_EQ(out.results[3].cached_tokens, branch ? 64u : 0u);
    EXPECT_EQ(out.results[2].snapshot_boundaries.front(), branch ? 64u : 96u);
  }
}

// Cost-aware eviction: the conversation's snapshots (120 tokens of recompute each) outrank the
// auxiliary calls' (20 tokens) for the two GPU slots, so turn 2 resumes at turn 1's finish
// boundary with a host tier or without one.
TEST(Scheduler, ChurnKeepsTheConversationSnapshot) {
  for (std::uint32_t host_slots : {16u, 0u}) {
    SCOPED_TRACE(host_slots);
    auto w = workload();
    w.cache.gpu_snapshot_slots = 2;
    w.cache.host_snapshot_slots = host_slots;
    // Which snapshot the order keeps in two slots: the watermark would keep one of the two
    // free ahead of need (ceil of 2%), demoting the conversation's to host early.
    w.cache.gpu_free_low_watermark = w.cache.gpu_free_high_watermark = 0;
    const model::TinyHybridModel m(small_model());
    const auto turn1 = tokens(7, 120);
    add(w, turn1, 4);
    const auto ref = demo::reference_run(m, w.requests[0]);
    for (int i = 0; i < 6; ++i) add(w, tokens(100 + i, 20), 2);
    add(w, cat(cat(turn1, ref.output), tokens(8, 10)), 3);
    auto out = run_exact(w);
    const auto& turn2 = out.results[w.requests.back().id];
    EXPECT_EQ(turn2.cached_tokens, 120u);  // 123 forwarded: finish boundary 120
    EXPECT_FALSE(turn2.snapshot_from_host);
  }
}

TEST(Scheduler, MemoryPressurePreemptsAndStaysExact) {
  auto w = workload("every-chunk");
  w.cache.gpu_pages = 24;  // 192 tokens for three requests of ~100 tokens
  w.cache.host_pages = 16;
  w.sched.max_running = 3;
  const auto shared = tokens(9, 48);
  for (int i = 0; i < 6; ++i) add(w, cat(shared, tokens(20 + i, 40 + 5 * i)), 12);
  auto out = run_exact(w);
  EXPECT_GT(out.sched.stalls + out.sched.preemptions, 0u);
  EXPECT_GT(out.cache.kv_pages_demoted + out.cache.kv_pages_dropped_gpu, 0u);
}

TEST(Scheduler, ARequestThatCannotFitFailsClearlyAndOthersRun) {
  auto w = workload();
  w.cache.gpu_pages = 8;  // 64 tokens
  add(w, tokens(10, 30), 2);
  add(w, tokens(11, 100), 2);  // never fits
  add(w, tokens(12, 30), 2);
  const model::TinyHybridModel m(w.model);
  auto out = demo::run_workload(w, m, true);
  ASSERT_TRUE(out.status) << out.status.to_string();
  EXPECT_EQ(out.results[2].status.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(out.results[2].status.message().find("does not fit"), std::string::npos);
  EXPECT_TRUE(demo::same_answer(out.results[1], demo::reference_run(m, w.requests[0])));
  EXPECT_TRUE(demo::same_answer(out.results[3], demo::reference_run(m, w.requests[2])));
}

TEST(Scheduler, FailedTransfersDegradeToRecompute) {
  for (std::uint64_t first : {0u, 1u, 2u, 3u, 5u}) {
    SCOPED_TRACE(first);
    auto w = workload("interval:32");
    w.cache.gpu_pages = 20;
    w.cache.gpu_snapshot_slots = 2;
    w.engine_mode = HostTransferEngine::Mode::kManual;
    for (std::uint64_t n = first; n < 40; n += 3) w.failing_submissions.push_back(n);
    const auto a = tokens(13, 90);
    add(w, a, 3);
    add(w, tokens(14, 70), 3);
    add(w, cat(a, tokens(15, 12)), 3);
    add(w, {a.begin(), a.begin() + 66}, 3);
    auto out = run_exact(w);
    EXPECT_GT(out.cache.transfers_failed, 0u);
  }
}

TEST(Scheduler, ArrivalTimesDriveTheVirtualClock) {
  auto w = workload();
  add(w, tokens(16, 40), 2, 5.0);
  add(w, tokens(17, 40), 2, 0.5);
  const model::TinyHybridModel m(w.model);
  auto out = demo::run_workload(w, m, true);
  ASSERT_TRUE(out.status);
  EXPECT_DOUBLE_EQ(out.results[2].admitted_s, 0.5);
  EXPECT_DOUBLE_EQ(out.results[1].admitted_s, 5.0);  // idle: the clock jumped to its arrival
  EXPECT_GT(out.results[1].first_token_s, 5.0);
  EXPECT_NEAR(out.results[1].prefill_s, 40 * 1e-4, 1e-12);  // the demo's modeled clock
  EXPECT_NEAR(out.results[1].queue_s(), 0.0, 1e-12);
}

TEST(Scheduler, SeveralRequestsInFlightTakeTurns) {
  auto w = workload("every-chunk");
  w.sched.max_running = 3;
  const auto shared = tokens(18, 64);
  for (int i = 0; i < 5; ++i) add(w, cat(shared, tokens(30 + i, 20 + i)), 6);
  auto out = run_exact(w);
  // Three start together (no reuse among them), the later two reuse the shared prefix.
  EXPECT_EQ(out.results[1].cached_tokens, 0u);
  EXPECT_EQ(out.results[4].cached_tokens, 64u);
  EXPECT_LT(out.results[2].first_token_s, out.results[1].finished_s);
}

/// A ModelExecutor that cannot capture (the Executor's default forward_capturing): a forward
/// ends wherever the scheduler needs a state. With `claims` > 0 it says it can capture at that
/// granularity all the same and refuses every capture: the scheduler then ends the forward at
/// the first one.
class NoCaptureExecutor final : public Executor {
 public:
  explicit NoCaptureExecutor(ModelExecutor& inner, std::size_t claims = 0)
      : inner_(inner), claims_(claims) {}
  std::size_t capture_granularity() const override { return claims_; }
  std::size_t state_bytes() const override { return inner_.state_bytes(); }
  Status begin(RequestId r, std::optional<GpuSlotId> from) override {
    return inner_.begin(r, from);
  }
  Result<double> forward(RequestId r, std::span<const Token> t, std::size_t pos,
                         std::span<const GpuPageId> table) override {
    return inner_.forward(r, t, pos, table);
  }
  std::span<const float> last_logits(RequestId r) const override { return inner_.last_logits(r); }
  Result<Token> next_token(RequestId r) override { return inner_.next_token(r); }
  Status save_snapshot(RequestId r, GpuSlotId slot) override {
    return inner_.save_snapshot(r, slot);
  }
  Status checkpoint(RequestId r) override { return inner_.checkpoint(r); }
  Status save_checkpoint(RequestId r, GpuSlotId slot) override {
    return inner_.save_checkpoint(r, slot);
  }
  void end(RequestId r) override { inner_.end(r); }

 private:
  ModelExecutor& inner_;
  std::size_t claims_;
};

// Forwards of several chunks (an engine's own chunked-prefill size) keep the snapshots that
// chunk-sized forwards keep, at the same boundaries: the states inside a forward are captured
// on the way (or, by an executor that cannot capture, the forward ends there). Every request,
// including replays that resume from a captured state, stays bit-identical to recompute. The
// GPU holds 4 snapshot slots, so a forward of 12 chunks cannot capture all 11 inside it at
// once: it ends where the slots run out. (adaptive is left out of the boundary comparison:
// its plan reads the free host bytes at admission, which the threaded engine's timing moves.)
TEST(Scheduler, LongForwardsCaptureTheSnapshotsChunkedForwardsKeep) {
  const auto prompt = tokens(5, 400);
  const auto shared = tokens(7, 150);
  for (const char* policy : {"every-chunk", "interval:48", "end-only+tail+branch", "adaptive"}) {
    SCOPED_TRACE(policy);
    const bool compare = std::string(policy) != "adaptive";
    auto w = workload(policy);
    add(w, prompt, 3);
    add(w, cat({prompt.begin(), prompt.begin() + 257}, tokens(6, 3)), 2);  // ends inside
    add(w, cat(shared, tokens(8, 90)), 2);
    add(w, cat(shared, tokens(9, 90)), 2);  // leaves the cached KV at 150: a branch point
    add(w, cat(shared, tokens(10, 90)), 2);
    const model::TinyHybridModel m(w.model);
    std::map<RequestId, RequestResult> chunked;
    for (std::size_t forward : {0u, 128u, 384u}) {
      SCOPED_TRACE(forward);
      w.sched.forward_tokens = forward;
      auto out = run_exact(w);
      EXPECT_EQ(out.sched.snapshot_slot_misses, 0u);
      if (forward == 0) {
        chunked = out.results;
        continue;
      }
      EXPECT_GT(out.sched.snapshots_captured, 0u);
      for (const auto& [id, res] : chunked) {
        if (!compare) break;
        EXPECT_EQ(out.results[id].snapshot_boundaries, res.snapshot_boundaries) << id;
        EXPECT_EQ(out.results[id].cached_tokens, res.cached_tokens) << id;
      }
      // Without captures (an executor that cannot capture, or one that refuses them): the
      // same snapshots, each from the live state at a forward's end.
      for (std::size_t claims : {0u, 1u}) {
        SCOPED_TRACE(claims);
        CacheConfig c = w.cache;
        c.page_bytes = m.page_bytes();
        c.snapshot_bytes = m.state_bytes();
        SchedulerConfig sc = w.sched;
        sc.kv_bytes_per_token = c.page_bytes / c.page_size;
        HostArenas mem(c);
        HostTransferEngine engine(mem, c.slice_pages);
        auto cache = PrefixCache::create(c, engine);
        ASSERT_TRUE(cache);
        ModelExecutor inner(m, mem);
        NoCaptureExecutor exec(inner, claims);
        Scheduler sched(**cache, exec, sc);
        for (const auto& req : w.requests) ASSERT_TRUE(sched.submit(req));
        ASSERT_TRUE(sched.run_until_idle());
        EXPECT_EQ(sched.stats().snapshots_captured, 0u);
        EXPECT_EQ(sched.stats().snapshot_slot_misses, 0u);
        for (const auto& [id, res] : chunked) {
          const RequestResult* r = sched.result(id);
          ASSERT_NE(r, nullptr);
          EXPECT_TRUE(demo::same_answer(*r, demo::reference_run(m, w.requests[id - 1]))) << id;
          if (compare) {
            EXPECT_EQ(r->snapshot_boundaries, res.snapshot_boundaries) << id;
          }
        }
      }
    }
  }
}

TEST(ModelExecutor, CapturesAreTheStatesASplitForwardSaves) {
  const model::TinyHybridModel m(small_model());
  const CacheConfig cc = arena_config(m, 8, 4);
  HostArenas mem(cc);
  ModelExecutor exec(m, mem);
  EXPECT_EQ(exec.capture_granularity(), 1u);
  std::vector<GpuPageId> table;
  for (std::uint32_t i = 0; i < 8; ++i) table.emplace_back(i);
  const auto p = tokens(21, 40);
  auto bytes = [&](std::uint32_t slot) {
    const auto s = mem.gpu_snapshot(GpuSlotId(slot));
    return std::vector<std::byte>(s.begin(), s.end());
  };
  // Request 1: forwards of 9, 15 and 16 tokens, saving after the first two.
  ASSERT_TRUE(exec.begin(1, std::nullopt));
  ASSERT_TRUE(exec.forward(1, std::span<const Token>(p).first(9), 0, table));
  ASSERT_TRUE(exec.save_snapshot(1, GpuSlotId(0)));
  ASSERT_TRUE(exec.forward(1, std::span<const Token>(p).subspan(9, 15), 9, table));
  ASSERT_TRUE(exec.save_snapshot(1, GpuSlotId(1)));
  ASSERT_TRUE(exec.forward(1, std::span<const Token>(p).subspan(24), 24, table));
  // Request 2: one forward of 40 capturing at 9 and 24.
  ASSERT_TRUE(exec.begin(2, std::nullopt));
  const StateCapture bad_order[] = {{24, GpuSlotId(2)}, {9, GpuSlotId(3)}};
  const StateCapture at_end[] = {{40, GpuSlotId(2)}};
  const StateCapture bad_slot[] = {{9, GpuSlotId(9)}};
  for (std::uint32_t slot : {2u, 3u}) {
    const auto s = mem.gpu_snapshot(GpuSlotId(slot));
    std::fill(s.begin(), s.end(), std::byte{0x5A});
  }
  const auto sentinel = bytes(2);
  for (auto bad : {std::span<const StateCapture>(bad_order), std::span<const StateCapture>(at_end),
                   std::span<const StateCapture>(bad_slot)}) {
    EXPECT_EQ(exec.forward_capturing(2, p, 0, table, bad).status().code(),
              ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(bytes(2), sentinel);  // a refused call writes nothing
  EXPECT_EQ(bytes(3), sentinel);
  const StateCapture good[] = {{9, GpuSlotId(2)}, {24, GpuSlotId(3)}};
  ASSERT_TRUE(exec.forward_capturing(2, p, 0, table, good));  // the bad calls changed nothing
  EXPECT_EQ(bytes(2), bytes(0));
  EXPECT_EQ(bytes(3), bytes(1));
  const auto l1 = exec.last_logits(1), l2 = exec.last_logits(2);
  EXPECT_TRUE(std::equal(l1.begin(), l1.end(), l2.begin(), l2.end()));
  ASSERT_TRUE(exec.save_snapshot(1, GpuSlotId(0)));
  ASSERT_TRUE(exec.save_snapshot(2, GpuSlotId(1)));
  EXPECT_EQ(bytes(0), bytes(1));
}

TEST(ModelExecutor, RestoreCopiesTheSnapshotAndLeavesItUntouched) {
  const model::TinyHybridModel m(small_model());
  const CacheConfig cc = arena_config(m, 8, 2);
  HostArenas mem(cc);
  ModelExecutor exec(m, mem);
  std::vector<GpuPageId> table;
  for (std::uint32_t i = 0; i < 8; ++i) table.emplace_back(i);
  const auto p = tokens(19, 24);
  ASSERT_TRUE(exec.begin(1, std::nullopt));
  ASSERT_TRUE(exec.forward(1, std::span<const Token>(p).first(16), 0, table));
  ASSERT_TRUE(exec.save_snapshot(1, GpuSlotId(0)));
  const auto snap = std::vector<std::byte>(mem.gpu_snapshot(GpuSlotId(0)).begin(),
                                           mem.gpu_snapshot(GpuSlotId(0)).end());
  ASSERT_TRUE(exec.forward(1, std::span<const Token>(p).subspan(16), 16, table));
  ASSERT_TRUE(exec.begin(2, GpuSlotId(0)));
  ASSERT_TRUE(exec.forward(2, std::span<const Token>(p).subspan(16), 16, table));
  EXPECT_TRUE(std::equal(snap.begin(), snap.end(), mem.gpu_snapshot(GpuSlotId(0)).begin()));
  const auto l1 = exec.last_logits(1), l2 = exec.last_logits(2);
  EXPECT_TRUE(std::equal(l1.begin(), l1.end(), l2.begin(), l2.end()));
  EXPECT_EQ(*exec.next_token(1), *exec.next_token(2));
  EXPECT_EQ(exec.begin(2, std::nullopt).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(exec.save_checkpoint(2, GpuSlotId(1)).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(exec.save_snapshot(2, GpuSlotId(7)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(exec.forward(9, p, 0, table).status().code(), ErrorCode::kNotFound);
  exec.end(1);
  exec.end(2);
  EXPECT_EQ(exec.live_requests(), 0u);
}

}  // namespace
}  // namespace radixtier::sched
