// The simulator pieces: cost executor, hybrid-free ideal, scenario generators, the
// +tail/+branch policy modifiers end to end, SVG charts, and small end-to-end runs (churn: the
// node cache beats the index tier).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "sim/block_lru_ideal.hpp"
#include "sim/cost_executor.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"
#include "sim/svg.hpp"

namespace radixtier::sim {
namespace {

HardwarePreset gen4() {
  return *find_hardware("consumer-gen4");
}
ModelGeometry qwen() {
  return *find_model("qwen3-next-80b");
}

TEST(CostExecutor, PrefillChunksCostTheFormulaAndDecodeTheBatchShare) {
  CostExecutorOptions o;
  o.decode_step_s = 0.04;
  o.decode_batch = 4;
  o.gpu_slots = 4;
  CostExecutor ex(gen4(), 1234, o);
  EXPECT_EQ(ex.state_bytes(), 1234u);
  ASSERT_TRUE(ex.begin(1, std::nullopt));
  const std::vector<Token> chunk(2048, 7);
  const std::vector<GpuPageId> table(64, GpuPageId(0));
  auto s1 = ex.forward(1, chunk, 0, table);
  ASSERT_TRUE(s1.is_ok());
  EXPECT_DOUBLE_EQ(*s1, prefill_seconds(gen4(), 0, 2048));
  auto s2 = ex.forward(1, chunk, 2048, table);
  ASSERT_TRUE(s2.is_ok());
  EXPECT_DOUBLE_EQ(*s2, prefill_seconds(gen4(), 2048, 4096));
  EXPECT_GT(*s2, *s1);  // b > 0: later tokens attend to more
  // A gap in positions is a scheduler bug: rejected.
  EXPECT_FALSE(ex.forward(1, chunk, 9000, table).is_ok());
  auto t = ex.next_token(1);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(*t, CostExecutor::synth_token(7, 4096));
  const Token tok = *t;
  auto d = ex.forward(1, std::span<const Token>(&tok, 1), 4096, table);
  ASSERT_TRUE(d.is_ok());
  EXPECT_DOUBLE_EQ(*d, 0.01);
  EXPECT_DOUBLE_EQ(ex.decode_seconds_total(), 0.01);
}

TEST(CostExecutor, SnapshotCallsCheckArgumentsOnly) {
  CostExecutorOptions o;
  o.gpu_slots = 2;
  CostExecutor ex(gen4(), 10, o);
  EXPECT_FALSE(ex.begin(1, GpuSlotId(2)));  // out of range
  ASSERT_TRUE(ex.begin(1, GpuSlotId(1)));
  EXPECT_FALSE(ex.begin(1, std::nullopt));  // already exists
  EXPECT_TRUE(ex.save_snapshot(1, GpuSlotId(0)));
  EXPECT_FALSE(ex.save_snapshot(2, GpuSlotId(0)));
  EXPECT_EQ(ex.save_checkpoint(1, GpuSlotId(0)).code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(ex.checkpoint(1));
  EXPECT_TRUE(ex.save_checkpoint(1, GpuSlotId(0)));
  EXPECT_FALSE(ex.next_token(1).is_ok());  // no forward yet
  ex.end(1);
  EXPECT_EQ(ex.live_requests(), 0u);
}

// A chunked GDN kernel has the state at every 64-token sub-chunk of a forward: captures there
// are accepted and cost nothing on the clock (save_snapshot does not either); anywhere else,
// out of order, in decode or into a bad slot they are refused and nothing moves.
TEST(CostExecutor, CapturesAtSubChunksAreFreeAndOthersAreRefused) {
  CostExecutorOptions o;
  o.gpu_slots = 4;
  CostExecutor ex(gen4(), 10, o);
  EXPECT_EQ(ex.capture_granularity(), 64u);
  ASSERT_TRUE(ex.begin(1, std::nullopt));
  const std::vector<Token> chunk(8192, 7);
  const std::vector<GpuPageId> table(128, GpuPageId(0));
  using sched::StateCapture;
  const std::vector<std::vector<StateCapture>> bad = {
      {{2000, GpuSlotId(0)}},                        // not 64 x k from the start
      {{4096, GpuSlotId(0)}, {2048, GpuSlotId(1)}},  // out of order
      {{8192, GpuSlotId(0)}},                        // the forward's end: save_snapshot's
      {{2048, GpuSlotId(4)}}};                       // no such slot
  for (const auto& c : bad) {
    EXPECT_EQ(ex.forward_capturing(1, chunk, 0, table, c).status().code(),
              ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(ex.captures(), 0u);
  const std::vector<StateCapture> good = {
      {2048, GpuSlotId(0)}, {4096, GpuSlotId(1)}, {6144, GpuSlotId(2)}};
  auto secs = ex.forward_capturing(1, chunk, 0, table, good);
  ASSERT_TRUE(secs.is_ok());
  EXPECT_DOUBLE_EQ(*secs, prefill_seconds(gen4(), 0, 8192));
  EXPECT_EQ(ex.captures(), 3u);
  const Token tok = *ex.next_token(1);
  const std::vector<StateCapture> in_decode = {{8256, GpuSlotId(0)}};
  const std::vector<Token> more(128, tok);
  EXPECT_FALSE(ex.forward_capturing(1, more, 8192, table, in_decode).is_ok());
  EXPECT_TRUE(ex.forward(1, std::span<const Token>(&tok, 1), 8192, table).is_ok());
}

TEST(CostExecutor, ContinuationIsWhatDecodeProduces) {
  const std::vector<Token> prompt = synth_tokens(9, 100);
  const auto seq = CostExecutor::continuation(prompt, 5);
  ASSERT_EQ(seq.size(), 105u);
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), seq.begin()));
  for (std::size_t i = 100; i < 105; ++i) {
    EXPECT_EQ(seq[i], CostExecutor::synth_token(seq[i - 1], i));
  }
}

TraceRequest req(std::uint64_t input, std::vector<std::uint64_t> ids, std::uint64_t ts = 0) {
  TraceRequest r;
  r.timestamp_ms = ts;
  r.input_length = input;
  r.output_length = 2;
  r.hash_ids = std::move(ids);
  return r;
}

TEST(BlockLruIdeal, HitsLeadingBlocksCappedLikeAdmission) {
  BlockLruIdeal ideal(100, 64);
  EXPECT_EQ(ideal.access(req(1200, {1, 2, 3})), 0u);
  // Leading blocks 1, 2 are cached, 4 is not: 1,024 tokens.
  EXPECT_EQ(ideal.access(req(1100, {1, 2, 4})), 1024u);
  // The whole prompt is cached: all but the last token, floored to a page.
  EXPECT_EQ(ideal.access(req(1200, {1, 2, 3})), 1152u);
  EXPECT_EQ(ideal.input_tokens(), 3500u);
  EXPECT_EQ(ideal.hit_tokens(), 2176u);
}

TEST(BlockLruIdeal, EvictsLeastRecentTailsFirst) {
  BlockLruIdeal ideal(3, 1);
  ideal.access(req(1536, {1, 2, 3}));
  ideal.access(req(1024, {7, 8}));  // evicts 3 and then 2: the tail of the older prefix
  EXPECT_EQ(ideal.blocks(), 3u);
  EXPECT_EQ(ideal.evictions(), 2u);
  EXPECT_EQ(ideal.access(req(1024, {1, 9})), 512u);  // block 1 survived
  BlockLruIdeal none(0, 64);
  EXPECT_EQ(none.access(req(1024, {1, 2})), 0u);
  EXPECT_EQ(none.access(req(1024, {1, 2})), 0u);
}

TEST(Scenarios, ChurnMatchesWorkloads) {
  auto s = make_scenario("churn", qwen());
  ASSERT_TRUE(s.is_ok());
  ASSERT_EQ(s->requests.size(), 12u);
  const auto& t1 = s->requests.front().request;
  const auto& t2 = s->requests.back().request;
  EXPECT_EQ(t1.prompt.size(), 24'000u);
  EXPECT_EQ(t1.max_new_tokens, 200u);
  EXPECT_EQ(t2.prompt.size(), 24'500u);
  for (std::size_t i = 1; i <= 10; ++i) EXPECT_EQ(s->requests[i].request.prompt.size(), 1'500u);
  // Turn 2 continues turn 1 through the output the executor will generate.
  const auto cont = CostExecutor::continuation(t1.prompt, 200);
  EXPECT_TRUE(std::equal(cont.begin(), cont.end(), t2.prompt.begin()));
  EXPECT_EQ(s->requests.back().reusable_tokens, 24'192u);
  EXPECT_EQ(s->requests[1].reusable_tokens, 0u);
  const CacheConfig c = cache_config(s->budget, qwen(), s->page_size);
  EXPECT_EQ(c.gpu_pages, 512u);
  EXPECT_EQ(c.gpu_snapshot_slots, 4u);
  EXPECT_EQ(c.host_snapshot_slots, 32u);
  EXPECT_EQ(c.host_pages, 16 * kGiB / (64 * 24'576));
  EXPECT_EQ(c.snapshot_bytes, 77'266'944u);
  EXPECT_FALSE(make_scenario("nope", qwen()).is_ok());
}

TEST(Scenarios, CompactionVariantsCutWhereWorkloadsSays) {
  auto c = make_scenario("compaction", qwen());
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->requests.front().request.prompt.size(), 985'577u);
  const auto& replay = c->requests.back().request.prompt;
  EXPECT_EQ(replay.size(), 760'534u + 600u);
  EXPECT_EQ(c->requests.back().reusable_tokens, 760'512u);
  auto t = make_scenario("compaction-turns", qwen());
  ASSERT_TRUE(t.is_ok());
  bool cut = false;
  for (const auto& r : t->requests) cut = cut || r.request.prompt.size() == 760'534u;
  EXPECT_TRUE(cut);
  EXPECT_EQ(t->requests[t->requests.size() - 2].request.prompt.size(), 985'577u);
  EXPECT_EQ(t->requests.back().reusable_tokens, 760'512u);
}

TEST(Scenarios, TraceBudgetSplitsHostBytes) {
  ScenarioOptions o;
  o.trace_host_bytes = 16 * kGiB;
  const Scenario s = trace_scenario({req(1200, {1, 2, 3})}, qwen(), o);
  EXPECT_TRUE(s.is_trace());
  EXPECT_EQ(s.budget.host_kv_bytes, 14 * kGiB);
  EXPECT_EQ(s.budget.host_snapshot_bytes, 2 * kGiB);
  EXPECT_EQ(cache_config(s.budget, qwen(), s.page_size).host_snapshot_slots,
            2 * kGiB / 77'266'944u);
  const auto r = trace_request(s, 0);
  EXPECT_EQ(r.prompt.size(), 1200u);
  EXPECT_EQ(r.max_new_tokens, 2u);
}

TEST(SimPolicy, TakesSnapshotPolicyTextAndRejectsUnknownModifiers) {
  const Scenario s = make_scenario("churn", qwen()).value();
  SimOptions o;
  o.policy = "end-only+sideways";
  auto bad = simulate(s, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  o.policy = "bogus";
  EXPECT_FALSE(simulate(s, o).is_ok());
}

/// Two requests: the second shares all but the last partial chunk of the first.
Scenario diverging() {
  Scenario s;
  s.name = "diverging";
  s.budget.gpu_kv_tokens = 16'384;
  s.budget.gpu_snapshot_slots = 4;
  s.budget.host_kv_bytes = 1 * kGiB;
  const auto a = synth_tokens(1, 5'000);
  ScenarioRequest r1, r2;
  r1.request.id = 1;
  r1.request.prompt = a;
  r1.request.max_new_tokens = 4;
  r2.request.id = 2;
  r2.request.prompt.assign(a.begin(), a.begin() + 4'200);
  const auto tail = synth_tokens(2, 300);
  r2.request.prompt.insert(r2.request.prompt.end(), tail.begin(), tail.end());
  r2.request.max_new_tokens = 4;
  s.requests = {r1, r2};
  compute_reusable(s);
  return s;
}

TEST(SimPolicy, TailKeepsTheLastChunkBoundaryBelowThePromptEnd) {
  const Scenario s = diverging();
  SimOptions o;
  o.check_invariants = true;
  o.policy = "end-only";
  auto plain = simulate(s, o);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_EQ(plain->rows.back().cached_tokens, 0u);
  o.policy = "end-only+tail";
  auto tail = simulate(s, o);
  ASSERT_TRUE(tail.is_ok());
  EXPECT_TRUE(tail->status.empty()) << tail->status;
  EXPECT_EQ(tail->rows.back().cached_tokens, 4'096u);
  EXPECT_EQ(tail->policy, "end-only+tail");
  // Real snapshot slots now (no placeholders): no more offers than the policy keeps.
  EXPECT_EQ(tail->sched.snapshots_offered, tail->sched.snapshots_kept);
}

/// Three requests share a 5,000-token prefix and then go their own ways.
Scenario branching() {
  Scenario s;
  s.name = "branching";
  s.budget.gpu_kv_tokens = 32'768;
  s.budget.gpu_snapshot_slots = 8;
  s.budget.host_kv_bytes = 1 * kGiB;
  const auto shared = synth_tokens(1, 5'000);
  for (std::uint64_t i = 0; i < 3; ++i) {
    ScenarioRequest r;
    r.request.id = i + 1;
    r.request.prompt = shared;
    const auto own = synth_tokens(10 + i, 1'000);
    r.request.prompt.insert(r.request.prompt.end(), own.begin(), own.end());
    r.request.max_new_tokens = 4;
    s.requests.push_back(std::move(r));
  }
  compute_reusable(s);
  return s;
}

TEST(SimPolicy, BranchKeepsASnapshotWhereTheSecondRequestLeavesTheSharedPath) {
  const Scenario s = branching();
  SimOptions o;
  o.check_invariants = true;
  o.policy = "end-only";
  auto plain = simulate(s, o);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_EQ(plain->rows[1].cached_tokens, 0u);
  EXPECT_EQ(plain->rows[2].cached_tokens, 0u);
  o.policy = "end-only+branch";
  auto branch = simulate(s, o);
  ASSERT_TRUE(branch.is_ok());
  EXPECT_TRUE(branch->status.empty()) << branch->status;
  EXPECT_EQ(branch->policy, "end-only+branch");
  // The second request follows cached KV to 4,992 (a page below the shared 5,000) and keeps
  // a snapshot at the chunk boundary 4,096 below it: the third one resumes there.
  EXPECT_EQ(branch->rows[1].cached_tokens, 0u);
  EXPECT_EQ(branch->rows[2].cached_tokens, 4'096u);
}

TEST(Simulator, ChurnNodeCacheBeatsTheIndexTier) {
  auto s = make_scenario("churn", qwen());
  ASSERT_TRUE(s.is_ok());
  SimOptions o;
  o.check_invariants = true;
  std::map<CacheKind, SimResult> r;
  for (CacheKind k : {CacheKind::kNode, CacheKind::kIndex, CacheKind::kGpuOnly}) {
    o.cache = k;
    auto x = simulate(*s, o);
    ASSERT_TRUE(x.is_ok()) << x.status().to_string();
    EXPECT_TRUE(x->status.empty()) << x->status;
    EXPECT_EQ(x->failed, 0u);
    EXPECT_EQ(x->requests, 12u);
    r[k] = std::move(*x);
  }
  const SimResult& node = r[CacheKind::kNode];
  EXPECT_GE(node.cached_tokens_last, 23'936u);
  EXPECT_LE(node.ttft_s_last, 1.2 * node.floor_s_last);
  EXPECT_LT(node.ttft_s_last, r[CacheKind::kIndex].ttft_s_last);
  EXPECT_LT(r[CacheKind::kIndex].ttft_s_last, r[CacheKind::kGpuOnly].ttft_s_last);
  EXPECT_EQ(r[CacheKind::kGpuOnly].cached_tokens_last, 0u);
  EXPECT_LT(node.bytes_d2h, r[CacheKind::kIndex].bytes_d2h);
  // The JSON object carries the fields issue #5 asks for.
  const auto j = nlohmann::json::parse(to_json(node));
  for (const char* key : {"requests", "input_tokens", "cached_tokens", "hit_ratio",
                          "recomputed_tokens", "ttft_s_total", "ttft_s_last", "bytes_h2d",
                          "bytes_d2h", "host_bytes_peak", "snapshots_kept"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["cached_tokens"], node.cached_tokens);
  EXPECT_EQ(j["config"]["kv_bytes_per_token"], 24'576u);
}

TEST(Simulator, TraceReplayHonoursArrivalsAndTheIdealIsAnUpperReference) {
  std::vector<TraceRequest> t;
  for (std::uint64_t i = 0; i < 12; ++i) {
    // Three conversations, each turn extending the previous one's blocks.
    const std::uint64_t conv = i % 3, turn = i / 3;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t b = 0; b < 4 + 2 * turn; ++b) ids.push_back(conv * 1000 + b);
    t.push_back(req(ids.size() * 512 - 100, ids, 1000 * i));
  }
  ScenarioOptions so;
  so.trace_host_bytes = 4 * kGiB;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(t, qwen(), so);
  SimOptions o;
  o.hardware = "h200-gen5";
  o.check_invariants = true;
  o.policy = "budgeted+tail";
  auto node = simulate(s, o);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  EXPECT_TRUE(node->status.empty()) << node->status;
  EXPECT_EQ(node->failed, 0u);
  EXPECT_GT(node->hit_ratio, 0.0);
  for (std::size_t i = 0; i < node->rows.size(); ++i) EXPECT_GE(node->rows[i].ttft_s, 0.3);
  EXPECT_GE(node->sim_clock_s, 11.0);  // the last request arrives at 11 s
  o.cache = CacheKind::kIdeal;
  auto ideal = simulate(s, o);
  ASSERT_TRUE(ideal.is_ok());
  EXPECT_GE(ideal->hit_ratio, node->hit_ratio);
  // The ideal keys hash ids: its ceiling is the hash-id one. The node cache replays the
  // token-faithful prompts, whose token-level ceiling bounds it.
  EXPECT_LE(ideal->hit_ratio, ideal->ceiling_blocks_ratio);
  EXPECT_LE(node->hit_ratio, node->ceiling_ratio);
  o.cache = CacheKind::kIdeal;
  auto churn = make_scenario("churn", qwen());
  ASSERT_TRUE(churn.is_ok());
  EXPECT_FALSE(simulate(*churn, o).is_ok());  // the ideal is for traces only
}

// Adaptive placement end to end: in a block-hashed trace a turn shares only the earlier
// prompt's full blocks, so the learner finds G = 512 from the branch points and the later
// conversations resume at the last full block of their first turn; end-only never does.
TEST(Simulator, AdaptivePlacementLearnsTheBlockAlignmentOfATrace) {
  std::vector<TraceRequest> t;
  for (std::uint64_t c = 0; c < 48; ++c) {
    // Turn 1: 4 or 5 blocks, the last one partial; turn 2 shares its full blocks (3 or 4).
    const std::uint64_t base = 1000 * (c + 1), full = 3 + c % 2;
    std::vector<std::uint64_t> first, second;
    for (std::uint64_t b = 0; b <= full; ++b) first.push_back(base + b);
    for (std::uint64_t b = 0; b < full; ++b) second.push_back(base + b);
    for (std::uint64_t b = 0; b < 3; ++b) second.push_back(base + 500 + b);
    t.push_back(req(first.size() * 512 - 100, first, 2000 * c));
    t.push_back(req(second.size() * 512 - 100, second, 2000 * c + 1000));
  }
  ScenarioOptions so;
  so.trace_host_bytes = 8 * kGiB;
  so.trace_max_running = 2;
  so.trace_hash_only = true;  // block-hashed prompts: turn 2 has its own tokens after the blocks
  const Scenario s = trace_scenario(t, qwen(), so);
  SimOptions o;
  o.hardware = "h200-gen5";
  o.instances = 1;
  o.check_invariants = true;
  auto adaptive = simulate(s, o);
  ASSERT_TRUE(adaptive.is_ok()) << adaptive.status().to_string();
  EXPECT_TRUE(adaptive->status.empty()) << adaptive->status;
  EXPECT_EQ(adaptive->placement_alignment, 512u);
  EXPECT_FALSE(adaptive->keep_finish);  // no turn ever shares an output
  // The pool's content, sampled: tree KV and the cached snapshots turn 2 resumes from.
  EXPECT_GT(adaptive->gpu_kv_share, 0.0);
  EXPECT_GT(adaptive->gpu_snapshot_share, 0.0);
  EXPECT_LE(adaptive->gpu_kv_share + adaptive->gpu_snapshot_share, 1.0);
  o.policy = "end-only";
  auto end_only = simulate(s, o);
  ASSERT_TRUE(end_only.is_ok());
  for (std::size_t i = 80; i < adaptive->rows.size(); i += 2) {
    const std::size_t turn2 = i + 1, full = 3 + (i / 2) % 2;
    EXPECT_EQ(adaptive->rows[turn2].cached_tokens, full * 512) << turn2;
    EXPECT_EQ(end_only->rows[turn2].cached_tokens, 0u) << turn2;
  }
  EXPECT_GT(adaptive->hit_ratio, end_only->hit_ratio);
  o.cache = CacheKind::kVllmLike;  // not built on PrefixCache: nothing sampled
  auto vllm = simulate(s, o);
  ASSERT_TRUE(vllm.is_ok());
  EXPECT_EQ(vllm->gpu_kv_share, 0.0);
  EXPECT_EQ(vllm->gpu_snapshot_share, 0.0);
}

TEST(Svg, ChartsNameTheirSeries) {
  const std::string bars = svg::bar_chart({"t", "x", "y", true}, {"a", "b"},
                                          {{"node", {1, 10}, false}, {"index", {0, 100}, false}});
  EXPECT_NE(bars.find("<svg"), std::string::npos);
  EXPECT_NE(bars.find("node"), std::string::npos);
  EXPECT_NE(bars.find("</svg>"), std::string::npos);
  const std::string lines =
      svg::line_chart({"t", "x", "y", false}, {"16", "64"}, {{"ideal", {0.2, 0.3}, true}});
  EXPECT_NE(lines.find("polyline"), std::string::npos);
  EXPECT_NE(lines.find("stroke-dasharray"), std::string::npos);
}

}  // namespace
}  // namespace radixtier::sim

namespace radixtier::sim {
namespace {

// Issue 13 item 5: a wait on a copy inside alloc_pages is charged to the virtual clock, and
// the default watermarks remove those waits on the agent scenario without losing reuse.
TEST(Simulator, CopyWaitsAreChargedAndTheWatermarksRemoveThem) {
  auto s = make_scenario("agent", qwen());
  ASSERT_TRUE(s.is_ok());
  SimOptions o;
  o.check_invariants = true;
  o.gpu_free_low_watermark = o.gpu_free_high_watermark = 0;
  auto off = simulate(*s, o);
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  EXPECT_GT(off->stats.alloc_copy_waits, 0u);
  EXPECT_GT(off->sched.copy_wait_s, 0.0);
  o.gpu_free_low_watermark = CacheConfig{}.gpu_free_low_watermark;
  o.gpu_free_high_watermark = CacheConfig{}.gpu_free_high_watermark;
  auto on = simulate(*s, o);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  EXPECT_EQ(on->stats.alloc_copy_waits, 0u);
  EXPECT_EQ(on->sched.copy_wait_s, 0.0);
  EXPECT_GT(on->stats.background_evictions, 0u);
  EXPECT_GE(on->cached_tokens, off->cached_tokens);
  EXPECT_LT(on->ttft_s_total, off->ttft_s_total);
}

}  // namespace
}  // namespace radixtier::sim
