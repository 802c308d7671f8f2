// The shared tier's fetch rule (fetch_plan.hpp): the deepest boundary with contiguous shared
// KV and a shared snapshot, only when fetching beats recomputing.
#include <gtest/gtest.h>

#include "radixtier/shared/fetch_plan.hpp"

namespace radixtier::shared {
namespace {

FetchPlanInput input() {
  FetchPlanInput in;
  in.page_size = 16;
  in.prompt_tokens = 16 * 10 + 1;  // 10 whole pages before the last token
  in.resume_tokens = 32;
  in.kv_tokens = 48;
  in.page_bytes = 1000;
  in.snapshot_bytes = 5000;
  in.bandwidth = 1e6;  // 1 ms per page
  in.latency_s = 0.001;
  in.recompute_s = [](std::size_t from, std::size_t to) { return double(to - from) * 1e-3; };
  return in;
}

TEST(FetchPlan, ProbesFromTheLocalKvAndResumePointToTheLastPage) {
  const ProbeRange r = probe_range(input(), 16, 1000);
  EXPECT_EQ(r.first_kv_page, 3u);
  EXPECT_EQ(r.first_snapshot_page, 2u);
  EXPECT_EQ(r.end_page, 10u);
  EXPECT_EQ(probe_range(input(), 16, 4).end_page, 7u);       // capped past the local KV
  EXPECT_TRUE(probe_range(input(), 10 * 16, 1000).empty());  // too little left to gain
}

TEST(FetchPlan, TheDeepestBoundaryWithContiguousKvAndASnapshotComesFirst) {
  const FetchPlanInput in = input();
  const ProbeRange r = probe_range(in, 16, 1000);
  // KV pages 3..9: a hole at page 7; snapshots at boundaries 3..10 pages: at 4, 6 and 9.
  const std::vector<bool> kv = {true, true, true, true, false, true, true};
  std::vector<bool> snap(8, false);
  snap[4 - 3] = snap[6 - 3] = snap[9 - 3] = true;
  const auto c = plan_fetch(in, r, kv, snap);
  ASSERT_EQ(c.size(), 2u);  // 9 is past the hole
  EXPECT_EQ(c[0].boundary_page, 6u);
  EXPECT_EQ(c[0].first_kv_page, 3u);
  EXPECT_EQ(c[0].bytes, 3u * 1000 + 5000);
  EXPECT_EQ(c[1].boundary_page, 4u);
}

// The local KV reaches past the local resume point: a shared snapshot at a boundary inside
// it is fetched alone (it once priced that boundary's KV as a negative page count, wrapped
// to a huge fetch, and never chose it).
TEST(FetchPlan, ABoundaryInsideTheLocalKvFetchesOnlyItsSnapshot) {
  FetchPlanInput in = input();
  in.kv_tokens = 16 * 8;  // local KV to page 8, usable (KV + snapshot) to page 2
  const ProbeRange r = probe_range(in, 16, 1000);
  ASSERT_EQ(r.first_kv_page, 8u);
  const std::vector<bool> kv = {false, false};  // pages 8, 9: not shared
  std::vector<bool> snap(8, false);
  snap[5 - 3] = true;  // a shared snapshot at 5 pages
  const auto c = plan_fetch(in, r, kv, snap);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].boundary_page, 5u);
  EXPECT_EQ(c[0].first_kv_page, 5u);
  EXPECT_EQ(c[0].bytes, 5000u);
}

TEST(FetchPlan, AFetchDearerThanRecomputeIsNotACandidate) {
  FetchPlanInput in = input();
  in.bandwidth = 1e3;  // a second per page
  const ProbeRange r = probe_range(in, 16, 1000);
  const std::vector<bool> kv(7, true), snap(8, true);
  EXPECT_TRUE(plan_fetch(in, r, kv, snap).empty());
}

}  // namespace
}  // namespace radixtier::shared
