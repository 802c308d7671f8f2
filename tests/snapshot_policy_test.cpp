// Snapshot placement policies: parsing, validation and the keep() decisions.
#include <gtest/gtest.h>

#include "radixtier/scheduler/snapshot_policy.hpp"

namespace radixtier::sched {
namespace {

SnapshotQuery query(std::size_t boundary, std::size_t prompt = 1000) {
  SnapshotQuery q;
  q.boundary = boundary;
  q.prompt_tokens = prompt;
  q.page_size = 16;
  q.chunk_tokens = 64;
  q.snapshot_bytes = 8704;
  q.kv_bytes_per_token = 256;
  q.last_prompt_chunk = boundary == prompt / 16 * 16;
  return q;
}

TEST(SnapshotPolicy, ParsesEveryFormAndRoundTrips) {
  EXPECT_EQ(*SnapshotPolicy::parse("end-only"), SnapshotPolicy::end_only());
  EXPECT_EQ(*SnapshotPolicy::parse("every-chunk"), SnapshotPolicy::every_chunk());
  EXPECT_EQ(*SnapshotPolicy::parse("interval:512"), SnapshotPolicy::interval(512));
  EXPECT_EQ(*SnapshotPolicy::parse("budgeted"), SnapshotPolicy::budgeted());
  EXPECT_EQ(*SnapshotPolicy::parse("budgeted:4096"), SnapshotPolicy::budgeted(4096));
  EXPECT_EQ(*SnapshotPolicy::parse("budgeted:2M"), SnapshotPolicy::budgeted(2u << 20));
  EXPECT_EQ(*SnapshotPolicy::parse("budgeted:1k"), SnapshotPolicy::budgeted(1024));
  for (const char* text : {"end-only", "every-chunk", "interval:48", "budgeted", "budgeted:99"}) {
    EXPECT_EQ(SnapshotPolicy::parse(text)->name(), text);
  }
}

TEST(SnapshotPolicy, RejectsBadTextWithTheAcceptedForms) {
  for (const char* text : {"", "endonly", "interval", "interval:", "interval:0", "interval:-3",
                           "interval:12x", "budgeted:", "budgeted:xM", "every-chunk:3"}) {
    auto p = SnapshotPolicy::parse(text);
    ASSERT_FALSE(p) << text;
    EXPECT_EQ(p.status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_NE(SnapshotPolicy::parse("nope").status().message().find("interval:N"), std::string::npos);
}

TEST(SnapshotPolicy, IntervalMustBeAPageMultiple) {
  EXPECT_FALSE(SnapshotPolicy::interval(24).validate(16));
  EXPECT_TRUE(SnapshotPolicy::interval(48).validate(16));
  EXPECT_TRUE(SnapshotPolicy::budgeted().validate(16));
}

TEST(SnapshotPolicy, EveryPolicyKeepsTheFinalAndFinishBoundaries) {
  for (const auto& p : {SnapshotPolicy::end_only(), SnapshotPolicy::every_chunk(),
                        SnapshotPolicy::interval(256), SnapshotPolicy::budgeted(0)}) {
    EXPECT_TRUE(p.keep(query(992))) << p.name();
    SnapshotQuery fin = query(1008);
    fin.at_finish = true;
    EXPECT_TRUE(p.keep(fin)) << p.name();
  }
}

TEST(SnapshotPolicy, EndOnlyEveryChunkAndInterval) {
  EXPECT_FALSE(SnapshotPolicy::end_only().keep(query(512)));
  EXPECT_TRUE(SnapshotPolicy::every_chunk().keep(query(64)));
  const auto iv = SnapshotPolicy::interval(256);
  EXPECT_TRUE(iv.keep(query(512)));
  EXPECT_FALSE(iv.keep(query(576)));
  EXPECT_EQ(iv.next_cut(0), 256u);
  EXPECT_EQ(iv.next_cut(256), 512u);
  EXPECT_EQ(iv.next_cut(300), 512u);
  EXPECT_FALSE(SnapshotPolicy::every_chunk().next_cut(0));
}

TEST(SnapshotPolicy, BudgetedSpendsItsBudgetWhereItSavesMost) {
  // Budget of 3 snapshots in a 1000-token prompt with 64-token chunks: spread out evenly.
  const auto p = SnapshotPolicy::budgeted(3 * 8704);
  const auto plan = p.plan(query(0));
  EXPECT_EQ(plan, (std::vector<std::size_t>{256, 512, 768}));
  EXPECT_TRUE(p.keep(query(512)));
  EXPECT_FALSE(p.keep(query(576)));
  // Half a snapshot of budget: nothing intermediate.
  EXPECT_TRUE(SnapshotPolicy::budgeted(4000).plan(query(0)).empty());
  // The cached prefix counts as kept: the plan places boundaries above it.
  SnapshotQuery q = query(0);
  q.cached_tokens = 640;
  for (std::size_t b : SnapshotPolicy::budgeted(1 << 20).plan(q)) EXPECT_GT(b, 640u);
  // Default budget: 1/8 of the prompt's KV bytes (1000 x 256 / 8 = 32000 B: 3 snapshots).
  EXPECT_EQ(SnapshotPolicy::budgeted().budget_for(query(0)), 32000u);
  EXPECT_EQ(SnapshotPolicy::budgeted().plan(query(0)).size(), 3u);
  // Never more snapshots than candidates.
  EXPECT_EQ(SnapshotPolicy::budgeted(1u << 30).plan(query(0)).size(), 15u);
}

}  // namespace
}  // namespace radixtier::sched
