// `radixtier demo --scenario shared` (issue 22, item 7): two processes of the tiny model on
// one real Redis Cluster; the second starts empty, resumes the first's prefixes from the
// shared tier, and every output is bit-identical to the no-reuse run.
#include <gtest/gtest.h>

#include "demo/scenarios.hpp"

namespace radixtier::demo {
namespace {

TEST(SharedDemo, TheSecondProcessResumesTheFirstsPrefixAndIsIdentical) {
  auto w = make_scenario("shared", sched::SnapshotPolicy::adaptive());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const ScenarioReport r = run_scenario(*w);
  ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
  EXPECT_TRUE(r.all_identical);
  ASSERT_EQ(r.rows.size(), 5u);
  ASSERT_TRUE(r.shared.ran);
  EXPECT_GT(r.shared.published_keys, 0u);
  EXPECT_EQ(r.shared.values_rejected, 0u);
  // Process 2's turn 2 and document question resume from what process 1 published; its
  // unrelated request shares nothing.
  EXPECT_GE(r.rows[2].shared_tokens, 1408u);
  EXPECT_GE(r.rows[2].cached_tokens, r.rows[2].shared_tokens);
  EXPECT_GT(r.rows[3].shared_tokens, 0u);
  EXPECT_EQ(r.rows[4].shared_tokens, 0u);
  EXPECT_EQ(r.rows[4].cached_tokens, 0u);
  for (const Row& row : r.rows) EXPECT_TRUE(row.identical) << row.label << " " << row.error;
}

}  // namespace
}  // namespace radixtier::demo
