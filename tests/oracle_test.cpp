// The oracle (src/sim/oracle_cache.hpp): hand-built traces whose optimum is counted by hand,
// the pages it reads from a trace, and end to end on the committed conversation trace: at the
// same bytes it is at or above the node cache and the attention-only twin, and its free-
// snapshot run (the bound) is at or above it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "sim/oracle_cache.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"
#include "sim/trace_replay.hpp"

namespace radixtier::sim {
namespace {

constexpr std::uint32_t kPs = 4;  // tokens per page of the hand-built traces

// A hand-built trace: each request's page ids (equal ids = equal prefixes) and cap.
OracleTrace hand(std::vector<std::vector<std::uint64_t>> pages, std::vector<std::uint32_t> caps) {
  OracleTrace t;
  t.page_size = kPs;
  t.pages = std::move(pages);
  t.cap_pages = std::move(caps);
  for (std::uint32_t c : t.cap_pages) t.input_tokens.push_back((c + 1) * kPs);
  return t;
}

TEST(Oracle, FreeSnapshotsIsBeladysMinOnPages) {
  // One-page requests a b c a b c, room for 2 pages: the optimum hits 2 (any two of the last
  // three; LRU would hit none). MIN keeps a and b after c (c's next use is the farthest).
  const OracleTrace t = hand({{1}, {2}, {3}, {1}, {2}, {3}}, {1, 1, 1, 1, 1, 1});
  const OracleStats st = run_oracle(t, 2, 1, 0);
  EXPECT_EQ(st.hit_tokens, (std::vector<std::uint64_t>{0, 0, 0, kPs, kPs, 0}));
  EXPECT_EQ(st.hits, 2 * kPs);
  EXPECT_EQ(st.snapshots_placed, 0u);
  // Without limit every repeat hits.
  EXPECT_EQ(run_oracle(t, 1000, 1, 0).hits, 3 * kPs);
}

TEST(Oracle, ResumesOnlyWhereASnapshotIsResident) {
  // r0 computes pages 1 2; r1 continues it (target: page 2, its depth 2); r2 shares page 1
  // only (target: page 1). Pages cost 1 byte, snapshots 2.
  const OracleTrace t = hand({{1, 2}, {1, 2, 3}, {1, 5}}, {0, 2, 1});
  // Unlimited: both targets get a snapshot from r0; r1 hits 2 pages, r2 one.
  const OracleStats all = run_oracle(t, 1000, 1, 2);
  EXPECT_EQ(all.hit_tokens, (std::vector<std::uint64_t>{0, 2 * kPs, kPs}));
  EXPECT_EQ(all.snapshots_placed, 2u);
  EXPECT_EQ(all.reusable_tokens, 3 * kPs);
  // 5 bytes: pages 1 2 and one snapshot. By hand the optimum is 2 pages: keep the snapshot
  // at 2 (r1 hits 2, r2 none: r1 resumed past page 1 and cannot take a state there), or the
  // one at 1 (r1 and r2 hit 1 each). The snapshot at 1 is the farther use per token resumed.
  const OracleStats five = run_oracle(t, 5, 1, 2);
  EXPECT_EQ(five.hits, 2 * kPs);
  EXPECT_EQ(five.hit_tokens[1], 2 * kPs);
  EXPECT_EQ(five.snapshots_placed, 2u);  // r1 does not place one below its hit
  EXPECT_LE(five.peak_bytes, 5u);
  // The same bytes with free snapshots: every resident boundary resumes, 3 pages.
  EXPECT_EQ(run_oracle(t, 5, 1, 0).hits, 3 * kPs);
}

TEST(Oracle, PricesASnapshotByTheTokensItResumes) {
  // Two conversations: A (r0, 8 pages) comes back at r3 resuming all 8; B (r1, 2 pages)
  // comes back sooner, at r2, resuming 2. Pages cost 1 byte, snapshots 6; after r1 they hold
  // 22 bytes in 16. By hand: dropping B's snapshot loses 2 pages and keeps 8 (the optimum,
  // 8 pages); dropping A's (the farthest use) keeps 2; no page eviction frees 6 bytes
  // without losing a snapshot's use. Priced per token resumed, B's snapshot is the dearest.
  const OracleTrace t =
      hand({{1, 2, 3, 4, 5, 6, 7, 8}, {11, 12}, {11, 12, 13}, {1, 2, 3, 4, 5, 6, 7, 8, 9}},
           {0, 0, 2, 8});
  const OracleStats st = run_oracle(t, 16, 1, 6);
  EXPECT_EQ(st.hit_tokens, (std::vector<std::uint64_t>{0, 0, 0, 8 * kPs}));
  EXPECT_EQ(st.hits, 8 * kPs);
  EXPECT_LE(st.peak_bytes, 16u);
}

TEST(Oracle, NothingFitsNothingHits) {
  const OracleTrace t = hand({{1, 2}, {1, 2, 3}}, {0, 2});
  EXPECT_EQ(run_oracle(t, 0, 1, 2).hits, 0u);
  EXPECT_EQ(run_oracle(t, 0, 1, 0).hits, 0u);
  // Room for the pages but not their snapshot: the hybrid hits nothing, the bound hits.
  EXPECT_EQ(run_oracle(t, 3, 1, 2).hits, 0u);
  EXPECT_EQ(run_oracle(t, 3, 1, 0).hits, 2 * kPs);
}

TEST(Oracle, PagesOfATraceArePromptAndOutput) {
  TraceRequest a, b;
  a.hash_ids = {1, 2};
  a.input_length = 1024;
  a.output_length = 65;  // 64 output tokens with KV: one more page
  b.hash_ids = {1, 2, 3};
  b.input_length = 1536;
  b.output_length = 1;
  std::vector<TraceRequest> trace{a, b};
  TracePrompts prompts(trace, nullptr);  // hash-only prompts
  const OracleTrace t = oracle_trace(trace, prompts, 64);
  ASSERT_EQ(t.pages.size(), 2u);
  EXPECT_EQ(t.pages[0].size(), 17u);  // 1024 + 64 tokens
  EXPECT_EQ(t.cap_pages[0], 15u);     // all but the last prompt token
  EXPECT_EQ(t.pages[1].size(), 24u);
  EXPECT_EQ(t.cap_pages[1], 23u);
  for (std::size_t k = 0; k < 16; ++k) EXPECT_EQ(t.pages[0][k], t.pages[1][k]) << k;
  EXPECT_NE(t.pages[0][16], t.pages[1][16]);  // a's output is not b's third block
  const OracleStats st = run_oracle(t, 1000, 1, 1);
  EXPECT_EQ(st.hit_tokens[1], 1024u);  // resumes at the shared 16 pages
}

std::string source_path(const std::string& relative) {
  return (std::filesystem::path(__FILE__).parent_path() / relative).string();
}

TEST(Oracle, AtOrAboveNodeAndTheTwinOnConversations) {
  auto trace = load_trace(source_path("data/conversation_trace.jsonl"));
  ASSERT_TRUE(trace) << trace.status().message();
  trace->resize(400);
  ScenarioOptions so;
  so.trace_host_bytes = 0;
  so.trace_gpu_kv_tokens = 256 * 1024;  // under pressure: the 400 requests hold ~4M tokens
  const ModelGeometry m = *find_model("qwen3-next-80b");
  const Scenario s = trace_scenario(*trace, m, so);
  auto run = [&](CacheKind k) {
    SimOptions o;
    o.cache = k;
    o.hardware = "h200-gen5";
    o.instances = 1;
    auto r = simulate(s, o);
    EXPECT_TRUE(r) << r.status().message();
    return *r;
  };
  const SimResult node = run(CacheKind::kNode);
  const SimResult twin = run(CacheKind::kAttentionOnly);
  const SimResult oracle = run(CacheKind::kOracle);
  EXPECT_EQ(oracle.total_budget_bytes, node.total_budget_bytes);
  EXPECT_GT(node.hit_ratio, 0.1);
  EXPECT_GE(oracle.hit_ratio, node.hit_ratio);
  EXPECT_GE(oracle.hit_ratio, twin.hit_ratio);
  EXPECT_GE(oracle.oracle_bound_ratio, oracle.hit_ratio);
  EXPECT_LE(oracle.oracle_bound_ratio, oracle.oracle_page_ceiling_ratio);
  EXPECT_LT(oracle.oracle_bound_ratio, oracle.oracle_page_ceiling_ratio);  // pressure bites
  std::printf("node %.4f twin %.4f oracle %.4f bound %.4f ceiling %.4f\n", node.hit_ratio,
              twin.hit_ratio, oracle.hit_ratio, oracle.oracle_bound_ratio,
              oracle.oracle_page_ceiling_ratio);
}

TEST(Oracle, RefusesAScenarioThatIsNotATrace) {
  auto s = make_scenario("churn", *find_model("qwen3-next-80b"));
  ASSERT_TRUE(s);
  SimOptions o;
  o.cache = CacheKind::kOracle;
  auto r = simulate(*s, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("oracle"), std::string::npos);
  EXPECT_EQ(parse_cache_kind("oracle").value(), CacheKind::kOracle);
}

}  // namespace
}  // namespace radixtier::sim
