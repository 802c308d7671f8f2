// The demo scenarios are library code: every built-in scenario runs, and every request served
// with the cache is identical to the no-reuse run (what `make demo` prints).
#include <gtest/gtest.h>

#include "demo/scenarios.hpp"

namespace radixtier::demo {
namespace {

TEST(Demo, UnknownScenarioNamesTheKnownOnes) {
  auto w = make_scenario("nope", sched::SnapshotPolicy::end_only());
  ASSERT_FALSE(w);
  EXPECT_NE(w.status().message().find("churn"), std::string::npos);
}

TEST(Demo, ChurnKeepsTheConversationAndIsIdentical) {
  auto w = make_scenario("churn", sched::SnapshotPolicy::end_only());
  ASSERT_TRUE(w);
  const auto rep = run_scenario(*w);
  ASSERT_TRUE(rep.status) << rep.status.to_string();
  EXPECT_TRUE(rep.all_identical) << format_table(rep);
  const Row& turn2 = rep.rows.back();
  EXPECT_EQ(turn2.label, "turn 2");
  EXPECT_EQ(turn2.cached_tokens, 1504u);  // 1,500 + 11 forwarded outputs -> boundary 1,504
  EXPECT_EQ(turn2.baseline_recomputed, turn2.prompt_tokens);
  EXPECT_GT(rep.cache.snapshots_demoted, 0u);
}

TEST(Demo, CompactionResumesBelowTheReplayEndOnlyWithIntermediateSnapshots) {
  // (end-only at this scale is in the demo; scheduler_test checks it at small scale.)
  for (const char* policy : {"budgeted"}) {
    SCOPED_TRACE(policy);
    auto w = make_scenario("compaction", *sched::SnapshotPolicy::parse(policy));
    ASSERT_TRUE(w);
    const auto rep = run_scenario(*w);
    ASSERT_TRUE(rep.status) << rep.status.to_string();
    EXPECT_TRUE(rep.all_identical) << format_table(rep);
    const Row& replay = rep.rows.back();
    if (std::string(policy) == "end-only") {
      EXPECT_EQ(replay.cached_tokens, 0u);
    } else {
      EXPECT_GE(replay.cached_tokens, 2986u / 256 * 256);
      EXPECT_GT(replay.host_cached_tokens, 0u);
    }
  }
}

TEST(Demo, RestartServesTurn2FromDiskAndIsIdentical) {
  auto w = make_scenario("restart", sched::SnapshotPolicy::end_only());
  ASSERT_TRUE(w);
  const auto rep = run_scenario(*w);
  ASSERT_TRUE(rep.status) << rep.status.to_string();
  EXPECT_TRUE(rep.all_identical) << format_table(rep);
  ASSERT_TRUE(rep.restarted);
  const Row& turn2 = rep.rows.back();
  EXPECT_EQ(turn2.cached_tokens, 1504u);  // as churn: the whole of turn 1 and its output
  EXPECT_EQ(turn2.baseline_recomputed, turn2.prompt_tokens);
  EXPECT_GT(rep.before_restart.kv_pages_stored, 0u);
  EXPECT_GT(rep.before_restart.snapshots_stored, 0u);
  EXPECT_EQ(rep.cache.restored_kv_pages, rep.before_restart.kv_pages_stored);
  EXPECT_GT(rep.cache.restored_snapshots, 0u);
  EXPECT_EQ(rep.cache.hit_tokens_store, 1504u);  // none of it survived anywhere but on disk
  EXPECT_NE(format_table(rep).find("1504 prompt tokens came from disk"), std::string::npos)
      << format_table(rep);
}

TEST(Demo, AgentIsIdentical) {
  for (const char* name : {"agent"}) {
    SCOPED_TRACE(name);
    auto w = make_scenario(name, sched::SnapshotPolicy::budgeted());
    ASSERT_TRUE(w);
    const auto rep = run_scenario(*w);
    ASSERT_TRUE(rep.status) << rep.status.to_string();
    EXPECT_TRUE(rep.all_identical) << format_table(rep);
    EXPECT_GT(rep.total.cached_tokens, 0u);
  }
  const auto json = format_json({});
  EXPECT_NE(json.find("\"scenarios\""), std::string::npos);
}

}  // namespace
}  // namespace radixtier::demo
