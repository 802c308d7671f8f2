// The token-faithful trace replay (sim/trace_replay.hpp): the parent rule, hubs, the prompts
// it builds (the previous turn's prompt + the output the executor generates + the request's
// own tokens), the in-order builder against the recursive one, and the token-level reuse.
#include "sim/trace_replay.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "sim/cost_executor.hpp"
#include "sim/cost_model.hpp"
#include "sim/model_config.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

TraceRequest req(std::uint64_t t, std::uint64_t in, std::uint64_t out,
                 std::vector<std::uint64_t> ids) {
  return TraceRequest{t, in, out, std::move(ids)};
}

// A conversation: turn 1 (1000 tokens: block 10 full, 11 partial) outputs 100; turn 2 (1300:
// 10, 20, 21) continues it; turn 3 (2000) continues turn 2. An unrelated request in between.
std::vector<TraceRequest> conversation() {
  return {req(0, 1000, 100, {10, 11}), req(1, 700, 5, {30, 31}), req(2, 1300, 50, {10, 20, 21}),
          req(3, 2000, 10, {10, 20, 22, 23})};
}

TEST(TraceReplay, ParentIsTheEarlierTurnWhoseFullBlocksPrefixAndWhoseOutputFits) {
  const auto t = conversation();
  const TraceParents p = find_trace_parents(t);
  EXPECT_EQ(p.parent, (std::vector<std::int64_t>{-1, -1, 0, 2}));
  EXPECT_EQ(p.with_parent, 2u);
}

TEST(TraceReplay, APromptShorterThanParentPlusOutputHasNoParent) {
  // 1099 < 1000 + 100: the trace's turn cannot contain the previous turn's whole output.
  const std::vector<TraceRequest> t = {req(0, 1000, 100, {10, 11}), req(1, 1099, 5, {10, 20, 21})};
  EXPECT_EQ(find_trace_parents(t).parent, (std::vector<std::int64_t>{-1, -1}));
}

TEST(TraceReplay, LongestSharedPrefixFirstThenTheLatest) {
  const std::vector<TraceRequest> t = {
      req(0, 600, 10, {1, 2}),      // full blocks [1]
      req(1, 1100, 10, {1, 2, 3}),  // full blocks [1, 2]
      req(2, 1100, 10, {1, 2, 4}),  // full blocks [1, 2]: later than 1
      req(3, 3000, 10, {1, 2, 5, 6, 7, 8})};
  const TraceParents p = find_trace_parents(t);
  EXPECT_EQ(p.parent[1], 0);
  EXPECT_EQ(p.parent[2], 0);  // 1's full blocks [1, 2] are 2's, but 1100 < 1100 + 10
  EXPECT_EQ(p.parent[3], 2);  // both 1 and 2 share two blocks: the latest
}

TEST(TraceReplay, AHubEndsNoParent) {
  // Block 1 is a system prompt followed by many different blocks: a request whose full
  // blocks end there is no conversation's turn.
  std::vector<TraceRequest> t = {req(0, 600, 10, {1, 2})};
  for (std::uint64_t k = 0; k < kHubSuccessors; ++k) {
    t.push_back(req(1 + k, 1100, 10, {1, 100 + k, 200 + k}));
  }
  // Block 1 is followed by 2 and 100..107: kHubSuccessors + 1 different blocks.
  const TraceParents p = find_trace_parents(t);
  EXPECT_EQ(p.with_parent, 0u);
  EXPECT_EQ(p.hub_blocks, 1u);
  EXPECT_EQ(p.hub_refusals, 1u);
  // One successor fewer: not a hub, request 0 is everyone's parent (no other is: their full
  // blocks [1, 100 + k] are not a prefix of the others').
  t.pop_back();
  const TraceParents q = find_trace_parents(t);
  EXPECT_EQ(q.hub_blocks, 0u);
  EXPECT_EQ(q.with_parent, kHubSuccessors - 1);
}

TEST(TraceReplay, PromptIsParentPromptPlusGeneratedOutputPlusOwnTokens) {
  const auto t = conversation();
  const TraceParents p = find_trace_parents(t);
  const auto turn1 = faithful_prompt(t, p, 0);
  EXPECT_EQ(turn1, synthesize_tokens(t[0]));
  const auto turn2 = faithful_prompt(t, p, 2);
  ASSERT_EQ(turn2.size(), 1300u);
  const auto cont = CostExecutor::continuation(turn1, 100);  // what the executor generates
  ASSERT_EQ(cont.size(), 1100u);
  EXPECT_TRUE(std::equal(cont.begin(), cont.end(), turn2.begin()));
  for (std::size_t pos = 1100; pos < 1300; ++pos) {
    EXPECT_EQ(turn2[pos], trace_token(t[2].hash_ids[pos / 512], pos % 512)) << pos;
  }
  // Hash-only: turn 2 shares only block 10 with turn 1.
  const auto hash_only = synthesize_tokens(t[2]);
  EXPECT_NE(hash_only[1000], turn2[1000]);
}

TEST(TraceReplay, InOrderBuilderEqualsRecursiveInAnyOrder) {
  const auto t = conversation();
  const TraceParents p = find_trace_parents(t);
  TracePrompts in_order(t, &p);
  for (std::size_t i = 0; i < t.size(); ++i)
    EXPECT_EQ(in_order.prompt(i), faithful_prompt(t, p, i));
  TracePrompts shuffled(t, &p);
  for (std::size_t i : {3u, 0u, 3u, 2u, 1u, 2u})
    EXPECT_EQ(shuffled.prompt(i), faithful_prompt(t, p, i));
  TracePrompts hash_only(t, nullptr);
  EXPECT_EQ(hash_only.prompt(2), synthesize_tokens(t[2]));
}

TEST(TraceReplay, TokenReuseReachesThePreviousTurnsOutput) {
  const auto t = conversation();
  const TraceParents p = find_trace_parents(t);
  TracePrompts faithful(t, &p);
  const auto r = token_reuse(t, faithful, 64);
  // Turn 2 reuses turn 1's prompt and all but its last output token (the tokens with KV).
  EXPECT_EQ(r, (std::vector<std::uint64_t>{0, 0, 1099, 1349}));
  TracePrompts hash_only(t, nullptr);
  EXPECT_EQ(token_reuse(t, hash_only, 64), (std::vector<std::uint64_t>{0, 0, 512, 1024}));
}

TEST(TraceReplay, ScenarioIsFaithfulByDefaultAndCountsTokenReuse) {
  const ModelGeometry qwen = *find_model("qwen3-next-80b");
  const Scenario s = trace_scenario(conversation(), qwen, ScenarioOptions{});
  ASSERT_TRUE(s.trace_parents);
  EXPECT_EQ(s.trace_parents->with_parent, 2u);
  EXPECT_EQ(trace_request(s, 3).prompt, faithful_prompt(s.trace, *s.trace_parents, 3));
  EXPECT_EQ(trace_token_ceiling(s).hit_tokens, 1099u + 1349u);
  ScenarioOptions o;
  o.trace_hash_only = true;
  const Scenario h = trace_scenario(conversation(), qwen, o);
  EXPECT_FALSE(h.trace_parents);
  EXPECT_EQ(trace_request(h, 3).prompt, synthesize_tokens(h.trace[3]));
  EXPECT_EQ(trace_token_ceiling(h).hit_tokens, 512u + 1024u);
}

TEST(TraceReplay, TraceRowsCarryReusableTokensAndTheirFloor) {
  const ModelGeometry qwen = *find_model("qwen3-next-80b");
  const Scenario s = trace_scenario(conversation(), qwen, ScenarioOptions{});
  SimOptions o;
  o.instances = 1;
  o.hardware = "h200-gen5";
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->trace_construction, "faithful");
  EXPECT_EQ(r->rows[2].reusable_tokens, 1088u);  // 1099 floored to a 64-token page
  EXPECT_GT(r->rows[2].floor_s, 0.0);
  EXPECT_LT(r->rows[2].floor_s, r->rows[0].floor_s * 1.5);  // not a full prefill of 1300
  EXPECT_GT(r->ceiling_ratio, r->ceiling_blocks_ratio);
}

}  // namespace
}  // namespace radixtier::sim
