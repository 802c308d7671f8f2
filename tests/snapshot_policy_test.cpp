// Snapshot placement policies: parsing, validation and the keep() decisions.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "radixtier/scheduler/placement_learner.hpp"
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

TEST(SnapshotPolicy, ParsesTheTailAndBranchModifiersAndRoundTrips) {
  auto p = SnapshotPolicy::parse("budgeted+tail+branch");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind(), SnapshotPolicy::Kind::kBudgeted);
  EXPECT_TRUE(p->tail());
  EXPECT_TRUE(p->branch());
  EXPECT_EQ(*p, SnapshotPolicy::budgeted().with_tail().with_branch());
  EXPECT_EQ(*SnapshotPolicy::parse("interval:512+branch"),
            SnapshotPolicy::interval(512).with_branch());
  EXPECT_EQ(*SnapshotPolicy::parse("budgeted:2M+tail"),
            SnapshotPolicy::budgeted(2u << 20).with_tail());
  // Either order; name() puts tail first.
  EXPECT_EQ(SnapshotPolicy::parse("end-only+branch+tail")->name(), "end-only+tail+branch");
  EXPECT_FALSE(SnapshotPolicy::end_only().tail());
  EXPECT_NE(SnapshotPolicy::end_only(), SnapshotPolicy::end_only().with_tail());
  for (const char* text : {"end-only+tail", "every-chunk+branch", "interval:48+tail+branch",
                           "budgeted+tail", "budgeted:99+tail+branch"}) {
    EXPECT_EQ(SnapshotPolicy::parse(text)->name(), text);
    EXPECT_EQ(*SnapshotPolicy::parse(SnapshotPolicy::parse(text)->name()),
              *SnapshotPolicy::parse(text));
  }
  for (const char* text : {"end-only+", "+tail", "end-only+sideways", "end-only+tail+tail",
                           "bogus+tail", "interval:0+tail", "end-only+Tail", "tail"}) {
    auto bad = SnapshotPolicy::parse(text);
    ASSERT_FALSE(bad) << text;
    EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument) << text;
  }
  EXPECT_NE(SnapshotPolicy::parse("end-only+x").status().message().find("+tail"),
            std::string::npos);
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
  EXPECT_EQ(iv.next_cut(query(0), 0), 256u);
  EXPECT_EQ(iv.next_cut(query(0), 256), 512u);
  EXPECT_EQ(iv.next_cut(query(0), 300), 512u);
  EXPECT_FALSE(SnapshotPolicy::every_chunk().next_cut(query(0), 0));
}

TEST(SnapshotPolicy, TailKeepsTheLastChunkBoundaryBelowTheFinalPromptBoundary) {
  // 1000 tokens, pages of 16, chunks of 64: final boundary 992, tail boundary 960.
  const auto tail = SnapshotPolicy::end_only().with_tail();
  EXPECT_EQ(SnapshotPolicy::tail_boundary(query(0)), 960u);
  EXPECT_TRUE(tail.keep(query(960)));
  EXPECT_FALSE(SnapshotPolicy::end_only().keep(query(960)));
  EXPECT_FALSE(tail.keep(query(896)));
  EXPECT_TRUE(tail.keep(query(992)));  // the final boundary, as always
  // A final boundary on a chunk multiple: the tail is the chunk below it.
  EXPECT_EQ(SnapshotPolicy::tail_boundary(query(0, 1030)), 960u);
  EXPECT_TRUE(tail.keep(query(960, 1030)));
  // A prompt shorter than a page has no tail; one shorter than a chunk has none above 0.
  EXPECT_EQ(SnapshotPolicy::tail_boundary(query(0, 10)), 0u);
  EXPECT_EQ(SnapshotPolicy::tail_boundary(query(0, 40)), 0u);
  EXPECT_FALSE(tail.keep(query(0, 40)));
  // The modifier adds to the base answer, it takes nothing away.
  const auto iv = SnapshotPolicy::interval(256).with_tail();
  EXPECT_TRUE(iv.keep(query(512)));
  EXPECT_TRUE(iv.keep(query(960)));
  EXPECT_FALSE(iv.keep(query(576)));
  EXPECT_EQ(iv.next_cut(query(0), 300), 512u);
}

TEST(SnapshotPolicy, BranchKeepsTheChunkBoundaryWhereThePromptLeavesCachedKv) {
  const auto branch = SnapshotPolicy::end_only().with_branch();
  SnapshotQuery q = query(0);
  q.cached_tokens = 128;
  q.branch_tokens = 600;  // cached KV follows the prompt to 600: chunk boundary 576
  EXPECT_EQ(SnapshotPolicy::branch_boundary(q), 576u);
  q.boundary = 576;
  EXPECT_TRUE(branch.keep(q));
  EXPECT_FALSE(SnapshotPolicy::end_only().keep(q));
  EXPECT_FALSE(SnapshotPolicy::end_only().with_tail().keep(q));
  q.boundary = 640;
  EXPECT_FALSE(branch.keep(q));
  // Nothing beyond the usable match: no branch point to mark.
  q.branch_tokens = 128;
  q.boundary = 128;
  EXPECT_EQ(SnapshotPolicy::branch_boundary(q), 0u);
  EXPECT_FALSE(branch.keep(q));
  q.branch_tokens = 0;
  q.cached_tokens = 0;
  q.boundary = 64;
  EXPECT_FALSE(branch.keep(q));
  // Both modifiers together keep both boundaries.
  const auto both = SnapshotPolicy::end_only().with_tail().with_branch();
  q.branch_tokens = 300;
  q.boundary = 256;
  EXPECT_TRUE(both.keep(q));
  q.boundary = 960;
  EXPECT_TRUE(both.keep(q));
  q.boundary = 320;
  EXPECT_FALSE(both.keep(q));
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

// ---------------------------------------------------------------------------------------
// adaptive placement and its learner

TEST(SnapshotPolicy, AdaptiveKeepsTheAlignedTailAndTheBranchPointAndCutsThere) {
  const auto a = *SnapshotPolicy::parse("adaptive");
  EXPECT_EQ(a, SnapshotPolicy::adaptive());
  EXPECT_EQ(a.name(), "adaptive");
  // 1000 tokens, pages of 16: final boundary 992. Learned alignment 128: tail 896.
  SnapshotQuery q = query(0);
  q.alignment = 128;
  EXPECT_EQ(SnapshotPolicy::aligned_tail(q), 896u);
  q.boundary = 896;
  EXPECT_TRUE(a.keep(q));
  q.boundary = 960;
  EXPECT_EQ(SnapshotPolicy::tail_boundary(q), 960u);
  EXPECT_TRUE(a.keep(q));  // the chunk tail (issue 21: eviction weighs it in the one GPU pool)
  q.boundary = 832;
  EXPECT_FALSE(a.keep(q));  // a chunk end, but no reason to keep it
  // One page of alignment (natural text): the tail is the prompt end, nothing extra.
  q.alignment = 16;
  EXPECT_EQ(SnapshotPolicy::aligned_tail(q), 0u);
  // The branch point at page granularity (not floored to a chunk as +branch does).
  q.cached_tokens = 128;
  q.branch_tokens = 600;
  EXPECT_EQ(SnapshotPolicy::branch_point(q), 592u);
  q.boundary = 592;
  EXPECT_TRUE(a.keep(q));
  EXPECT_FALSE(SnapshotPolicy::end_only().with_branch().keep(q));
  // The scheduler cuts a chunk at both, in order.
  q.alignment = 128;
  EXPECT_EQ(a.next_cut(q, 128), 592u);
  EXPECT_EQ(a.next_cut(q, 592), 896u);
  EXPECT_FALSE(a.next_cut(q, 896));
  EXPECT_FALSE(SnapshotPolicy::end_only().next_cut(q, 128));
  // The finish boundary only while finish snapshots are resumed from; the prompt end always.
  SnapshotQuery fin = query(1008);
  fin.at_finish = true;
  EXPECT_TRUE(a.keep(fin));
  fin.keep_finish = false;
  EXPECT_FALSE(a.keep(fin));
  EXPECT_TRUE(SnapshotPolicy::end_only().keep(fin));
  EXPECT_TRUE(a.keep(query(992)));
}

TEST(SnapshotPolicy, AdaptiveSpendsTheHostBytesThatWouldStayFreeOnIntermediateSnapshots) {
  const auto a = SnapshotPolicy::adaptive();
  // 1000 tokens computed, 256 B of KV each: 256,000 B of KV. No free host bytes (or a backend
  // that does not say): 1/8 of that, three snapshots of 8,704 B.
  SnapshotQuery q = query(0);
  EXPECT_EQ(a.budget_for(q), 32000u);
  EXPECT_EQ(a.plan(q).size(), 3u);
  // A host tier that holds this prompt's KV with 100,000 B to spare: those bytes (11).
  q.host_free_bytes = 256000 + 100000;
  EXPECT_EQ(a.budget_for(q), 100000u);
  EXPECT_EQ(a.plan(q).size(), 11u);
  // Room for everything: every chunk end below the prompt end (15 of them).
  q.host_free_bytes = std::uint64_t{1} << 30;
  EXPECT_EQ(a.plan(q).size(), 15u);
  // Less to spare than 1/8 of the KV: never below the 1/8.
  q.host_free_bytes = 256000 + 1000;
  EXPECT_EQ(a.budget_for(q), 32000u);
  // The budgeted policy's budget is its own (1/8 of the prompt's KV, or what it was given).
  EXPECT_EQ(SnapshotPolicy::budgeted().budget_for(q), 32000u);
  // Only the tokens this request computes count: a cached 900-token prefix leaves 100.
  q.cached_tokens = 896;
  q.host_free_bytes = 256000;
  EXPECT_EQ(a.budget_for(q), 256000u - 104 * 256);
}

std::vector<Token> tokens(std::uint64_t seed, std::size_t n) {
  std::vector<Token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<Token>((seed * 7919 + i * 31) % 50021);
  return t;
}

TEST(PlacementLearner, LearnsTheAlignmentOfBranchPoints) {
  PlacementLearner blocks(16);
  EXPECT_EQ(blocks.alignment(), 16u);  // nothing seen yet: one page
  const auto prompt = tokens(1, 4000);
  // 9 in 10 branch points on 512-token blocks, the rest anywhere: G = 512.
  for (std::size_t i = 0; i < 100; ++i) {
    const std::size_t branch = i % 10 == 9 ? 16 * (3 + i % 50) : 512 * (1 + i % 6);
    blocks.observe_admission(prompt, 0, branch);
  }
  EXPECT_EQ(blocks.alignment(), 512u);
  EXPECT_EQ(blocks.branch_samples(), 100u);
  // Natural text: branch points at any page. G = one page.
  PlacementLearner text(16);
  for (std::size_t i = 0; i < 100; ++i) text.observe_admission(prompt, 0, 16 * (1 + i * 7 % 200));
  EXPECT_EQ(text.alignment(), 16u);
  // A prompt that ends inside the cached path (a replay) is no branch point.
  PlacementLearner replay(16);
  for (std::size_t i = 0; i < 100; ++i) replay.observe_admission(prompt, 0, 3984);
  EXPECT_EQ(replay.branch_samples(), 0u);
}

TEST(PlacementLearner, LearnsTheAlignmentFromItsFirstBranchPoints) {
  const auto prompt = tokens(1, 4000);
  // Block-hashed traffic, 16-token pages, 512-token blocks. The first branch point, at 2,048
  // tokens, allows any G up to 128 pages: the largest is the guess (a tail too coarse lands
  // below the right boundary, one too fine misses it), not one page until many are seen.
  PlacementLearner blocks(16);
  blocks.observe_admission(prompt, 0, 2048);
  EXPECT_EQ(blocks.alignment(), 2048u);
  blocks.observe_admission(prompt, 0, 1536);  // 96 pages: gcd 32 pages
  EXPECT_EQ(blocks.alignment(), 512u);
  for (std::size_t i = 0; i < 20; ++i) blocks.observe_admission(prompt, 0, 512 * (1 + i % 7));
  EXPECT_EQ(blocks.alignment(), 512u);
  // Natural text: branch points at any page; one page from the first odd one on.
  PlacementLearner text(16);
  for (std::size_t i = 0; i < 8; ++i) {
    text.observe_admission(prompt, 0, 16 * (1 + i * 7 % 200));
    EXPECT_EQ(text.alignment(), 16u);
  }
  // A few outliers among many aligned points do not undo it; too many do.
  PlacementLearner mixed(16);
  for (std::size_t i = 0; i < 20; ++i) {
    mixed.observe_admission(prompt, 0, i % 10 == 9 ? 16 * (5 + 2 * i) : 1024 * (1 + i % 3));
  }
  EXPECT_EQ(mixed.alignment(), 1024u);
  for (std::size_t i = 0; i < 10; ++i) mixed.observe_admission(prompt, 0, 16 * (7 + 2 * i));
  EXPECT_EQ(mixed.alignment(), 16u);
}

TEST(PlacementLearner, KeepsFinishSnapshotsOnlyWhileContinuationsShareTheOutput) {
  PlacementLearnerOptions o;
  o.finish_window = 8;
  PlacementLearner l(16, o);
  const auto turn = tokens(2, 200);  // prompt + output of an earlier request
  EXPECT_TRUE(l.keep_finish());
  // Requests that share the prompt but never the output: finish snapshots stop paying.
  l.observe_finish(std::span<const Token>(turn).first(192));
  for (int i = 0; i < 8; ++i) {
    auto p = tokens(3 + i, 300);
    std::copy(turn.begin(), turn.begin() + 150, p.begin());
    l.observe_admission(p, 128, 144);
  }
  EXPECT_FALSE(l.keep_finish());
  EXPECT_EQ(l.finish_continuations(), 0u);
  // A continuation of the whole prompt + output: keep them again.
  auto next = turn;
  next.insert(next.end(), 50, Token{7});
  l.observe_admission(next, 128, 192);
  EXPECT_TRUE(l.keep_finish());
  EXPECT_EQ(l.finish_continuations(), 1u);
}

// Issue 36: conversations that continue from their outputs credit finishes; prompt ends,
// tails and chunk ends stop being kept after a window without a credit, and come back.
TEST(PlacementLearner, StopsKeepingPromptBoundariesThatConversationsNeverResumeFrom) {
  PlacementLearnerOptions o;
  o.finish_window = 8;
  PlacementLearner l(16, o);
  EXPECT_TRUE(l.keep(BoundaryKind::kPromptEnd));
  EXPECT_TRUE(l.keep(BoundaryKind::kTail));
  EXPECT_TRUE(l.keep(BoundaryKind::kChunk));
  // A conversation: each turn is the previous turn's prompt + output + a new message.
  auto seq = tokens(5, 300);
  for (int turn = 0; turn < 10; ++turn) {
    l.observe_admission(seq, 0, 0);
    l.observe_prompt(seq, 64, 0);
    auto out = tokens(100 + turn, 40);
    seq.insert(seq.end(), out.begin(), out.end());
    l.observe_finish(std::span<const Token>(seq).first(seq.size() / 16 * 16));
    auto msg = tokens(200 + turn, 70);
    seq.insert(seq.end(), msg.begin(), msg.end());
  }
  EXPECT_EQ(l.credits(BoundaryKind::kFinish), 9u);  // every turn but the first
  EXPECT_EQ(l.credits(BoundaryKind::kPromptEnd), 0u);
  EXPECT_TRUE(l.keep_finish());
  EXPECT_FALSE(l.keep(BoundaryKind::kPromptEnd));
  EXPECT_FALSE(l.keep(BoundaryKind::kTail));
  EXPECT_FALSE(l.keep(BoundaryKind::kChunk));
  EXPECT_TRUE(l.keep(BoundaryKind::kBranch));  // never dropped
  // A replay of an earlier prompt's exact prefix (a regenerated turn) credits its prompt end
  // (recorded although no snapshot was kept there): prompt ends are kept again.
  const auto first = tokens(5, 300);
  auto regen = first;
  regen.push_back(Token{9});
  l.observe_admission(regen, 0, 288);
  EXPECT_EQ(l.credits(BoundaryKind::kPromptEnd), 1u);
  EXPECT_TRUE(l.keep(BoundaryKind::kPromptEnd));
  EXPECT_FALSE(l.keep(BoundaryKind::kChunk));
}

TEST(PlacementLearner, AJunctionManyRequestsLeaveCreditsTheBranchNotTheChunks) {
  PlacementLearner l(16);
  // Requests on one 128-token system prompt (two 64-token chunks), each with its own message.
  const auto system = tokens(1, 128);
  for (int i = 0; i < 5; ++i) {
    auto p = system;
    auto msg = tokens(50 + i, 200);
    p.insert(p.end(), msg.begin(), msg.end());
    l.observe_admission(p, i == 0 ? 0 : 128, i == 0 ? 0 : 128);
    l.observe_prompt(p, 64, i == 0 ? 0 : 128);
  }
  // The second request's resume point was only a chunk end of the first prompt; from the
  // third on it is a recorded branch point.
  EXPECT_EQ(l.credits(BoundaryKind::kChunk), 1u);
  EXPECT_EQ(l.credits(BoundaryKind::kBranch), 3u);
}

TEST(SnapshotPolicy, AdaptiveSkipsTheKindsTheLearnerDropped) {
  const auto a = SnapshotPolicy::adaptive();
  SnapshotQuery q = query(992);
  EXPECT_TRUE(a.keep(q));
  q.keep_prompt_end = false;
  EXPECT_FALSE(a.keep(q));
  EXPECT_TRUE(SnapshotPolicy::end_only().keep(q));  // only adaptive learns
  q = query(0);
  q.alignment = 128;
  q.boundary = 896;  // the aligned tail
  q.keep_tail = false;
  EXPECT_FALSE(a.keep(q));
  q.boundary = 960;  // the chunk tail
  EXPECT_FALSE(a.keep(q));
  q.cached_tokens = 128;
  q.branch_tokens = 600;
  q.boundary = 592;  // the branch point: always
  q.keep_chunks = false;
  EXPECT_TRUE(a.keep(q));
  // Budgeted intermediates only while chunk ends are resumed from.
  q = query(0);
  q.boundary = 512;
  const auto plan = a.plan(q);
  ASSERT_FALSE(plan.empty());
  q.boundary = plan.front();
  EXPECT_TRUE(a.keep(q));
  q.keep_chunks = false;
  EXPECT_FALSE(a.keep(q));
}

}  // namespace
}  // namespace radixtier::sched
