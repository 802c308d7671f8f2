// Issue 36's goals (docs/results.md, "Conversations replayed faithfully"), asserted on the
// token-faithful replay of the committed conversation trace and of the shipped trace, on
// h200-gen5 with qwen3-next-80b at the default instance counts (ctest label `goals`).
//
// Each peer runs at its best as the yardstick defines it: sglang-like with extra_buffer (its
// better strategy on these traces; no_buffer measured 0.2699 on the conversation trace), on
// its default split pools and on the one-buffer opt-in (sglang-unified), and vllm-like, with
// HiCache / CPU offloading where a host budget is given. Where a goal is not met the test
// asserts the measured level as a regression floor, named as such.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

std::string data(const std::string& file) {
  return (std::filesystem::path(__FILE__).parent_path() / "data" / file).string();
}

Scenario trace(const std::string& file, double host_gib) {
  ScenarioOptions so;
  so.trace_path = data(file);
  so.trace_host_bytes = static_cast<std::uint64_t>(host_gib * double(kGiB));
  auto s = make_scenario("trace", *find_model("qwen3-next-80b"), so);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s ? std::move(*s) : Scenario{};
}

struct Row {
  std::string name;
  SimResult r;
};

SimResult run(const Scenario& s, CacheKind cache, bool extra_buffer = false,
              bool vllm_offload = false) {
  SimOptions o;
  o.cache = cache;
  o.hardware = "h200-gen5";
  o.sglang.extra_buffer = extra_buffer;
  o.vllm_offload = vllm_offload;
  auto r = simulate(s, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r) return {};
  EXPECT_TRUE(r->status.empty()) << r->status;
  EXPECT_EQ(r->failed, 0u);
  return std::move(*r);
}

std::vector<Row> peers(const Scenario& s, bool host) {
  std::vector<Row> out;
  out.push_back({"sglang-like extra_buffer", run(s, CacheKind::kSglangLike, true)});
  out.push_back({"sglang-unified extra_buffer", run(s, CacheKind::kSglangUnified, true)});
  out.push_back({"vllm-like", run(s, CacheKind::kVllmLike, false, host)});
  return out;
}

// node's hit ratio over the best peer's, and whether its TTFT p50 and p99 are no worse than
// every peer's (times `ttft_slack`: above 1 only where that goal is not met, as a regression
// floor).
void expect_ahead(const SimResult& node, const std::vector<Row>& peers, double ratio,
                  const char* what, double ttft_slack = 1.0) {
  double best = 0;
  std::string best_name;
  for (const Row& p : peers) {
    if (p.r.hit_ratio > best) {
      best = p.r.hit_ratio;
      best_name = p.name;
    }
    EXPECT_LE(node.ttft_s_p50, p.r.ttft_s_p50 * ttft_slack) << what << ": TTFT p50 vs " << p.name;
    EXPECT_LE(node.ttft_s_p99, p.r.ttft_s_p99 * ttft_slack) << what << ": TTFT p99 vs " << p.name;
  }
  std::printf("%s: node %.4f (TTFT p50 %.3f s, p99 %.3f s)", what, node.hit_ratio, node.ttft_s_p50,
              node.ttft_s_p99);
  for (const Row& p : peers) {
    std::printf("; %s %.4f (%.3f s, %.3f s)", p.name.c_str(), p.r.hit_ratio, p.r.ttft_s_p50,
                p.r.ttft_s_p99);
  }
  std::printf("\n");
  ASSERT_GT(best, 0);
  EXPECT_GE(node.hit_ratio / best, ratio)
      << what << ": node " << node.hit_ratio << ", best peer " << best_name << " " << best;
}

// Goal: node >= 1.15x each peer with no host tier, TTFT p50 and p99 no worse. Measured (every
// cache in its engine's 8,192-token forwards): node 0.4928 against sglang-unified
// extra_buffer 0.3904 (1.26x), sglang-like extra_buffer 0.3256, vllm-like 0.3333; TTFT p50
// 1.59 s / p99 14.6 s against 2.16 / 26.7 s at best.
TEST(ConversationGoals, NoHostTierNodeLeadsEveryPeerByFifteenPercent) {
  const Scenario s = trace("conversation_trace.jsonl", 0);
  ASSERT_TRUE(s.is_trace());
  expect_ahead(run(s, CacheKind::kNode), peers(s, false), 1.15, "conversations, 0 GiB");
}

// Goal: node >= 1.10x each peer at 16 GiB. Measured: node 0.6493 against sglang-like
// extra_buffer with HiCache 0.3944 (1.65x), sglang-unified 0.3904, vllm-like with CPU
// offloading 0.3320; TTFT p50 0.66 s / p99 5.4 s against 2.16 / 26.7 s at best.
TEST(ConversationGoals, SixteenGibNodeLeadsEveryPeerByTenPercent) {
  const Scenario s = trace("conversation_trace.jsonl", 16);
  ASSERT_TRUE(s.is_trace());
  expect_ahead(run(s, CacheKind::kNode), peers(s, true), 1.10, "conversations, 16 GiB");
}

// Goal: TTFT p50 and p99 no worse than any peer's at every budget; at 64 and 256 GiB (where
// the issue sets no hit-ratio margin) node also keeps the best hit ratio. Measured at 64 GiB:
// node 0.8226 (0.518 s / 2.54 s) against vllm-like with CPU offloading 0.5008 (1.74 / 32.3),
// sglang-like extra_buffer with HiCache 0.4596 (2.02 / 29.9), sglang-unified 0.3904 (2.16 /
// 26.7): met. At 256 GiB, where every cache with a host tier nears the ceiling, node 0.8244
// (0.5140 s / 2.5358 s) against sglang-like extra_buffer with HiCache 0.8214 (0.5219 /
// 2.5336) and vllm-like with offloading 0.7954 (0.559 / 2.75): p50 met, p99 NOT MET by
// 0.09% (2 ms; the attention-only twin's p99 is 2.5336 s). Since every cache runs its
// engine's 8,192-token forwards (node captures the states inside them, docs/scheduler.md)
// the 1.5% p99 gap of 2,048-token forwards is gone. The 256 GiB TTFT is asserted within 3%
// of each peer's, a regression floor.
TEST(ConversationGoals, LargeHostTiersNodeKeepsTheBestHitRatioAndTtft) {
  for (const double gib : {64.0, 256.0}) {
    const Scenario s = trace("conversation_trace.jsonl", gib);
    ASSERT_TRUE(s.is_trace());
    const std::string what = "conversations, " + std::to_string(int(gib)) + " GiB";
    constexpr double k256GibTtftFloor = 1.03;  // a regression floor, not the goal (1.0)
    expect_ahead(run(s, CacheKind::kNode), peers(s, true), 1.0, what.c_str(),
                 gib > 64 ? k256GibTtftFloor : 1.0);
  }
}

// Goal: node >= 1.15x each peer with no host tier on the shipped trace, TTFT no worse. NOT
// MET: measured node 0.6189 against sglang-unified extra_buffer 0.5808 (1.066x), vllm-like
// 0.5794, sglang-like extra_buffer 0.5568. The shipped trace is mostly single requests
// sharing documents (339 of 3,993 continue an earlier one), where a state at every block is
// what a continuation needs. 1.15 x 0.5808 = 0.6679 is above the attention-only twin itself
// (0.6507: the same bytes, snapshots free at every page), so no placement or eviction of
// snapshots can reach it. TTFT p99 is met (4.47 s against 4.58 s at best); p50 is NOT MET by
// 1.0% (0.3452 s against sglang-unified extra_buffer's 0.3417 s). The floors asserted are
// 1.05 and TTFT within 3% (regression floors, not the goals).
TEST(ConversationGoals, ShippedTraceNoHostTierRegressionFloor) {
  const Scenario s = trace("mooncake_synthetic_trace.jsonl", 0);
  ASSERT_TRUE(s.is_trace());
  constexpr double kFloor = 1.05, kTtftFloor = 1.03;
  expect_ahead(run(s, CacheKind::kNode), peers(s, false), kFloor, "shipped, 0 GiB", kTtftFloor);
}

double tax(const Scenario& s, const char* what) {
  const SimResult node = run(s, CacheKind::kNode);
  const SimResult twin = run(s, CacheKind::kAttentionOnly);
  std::printf("%s: node %.4f, attention-only twin %.4f, node / twin %.4f\n", what, node.hit_ratio,
              twin.hit_ratio, node.hit_ratio / twin.hit_ratio);
  return twin.hit_ratio > 0 ? node.hit_ratio / twin.hit_ratio : 0;
}

// Goals: node >= 0.92 of its attention-only twin with no host tier, >= 0.95 at 16 GiB. Met on
// the shipped trace: 0.6189 / 0.6507 = 0.951 and 0.6341 / 0.6525 = 0.972.
TEST(ConversationGoals, ShippedTraceNodeKeepsItsTwinsShare) {
  EXPECT_GE(tax(trace("mooncake_synthetic_trace.jsonl", 0), "shipped, 0 GiB"), 0.92);
  EXPECT_GE(tax(trace("mooncake_synthetic_trace.jsonl", 16), "shipped, 16 GiB"), 0.95);
}

// The same goals on the conversation trace: NOT MET at 0 and 16 GiB. Measured node / twin
// 0.4928 / 0.5684 = 0.867 at 0 GiB and 0.6493 / 0.7044 = 0.922 at 16 GiB (0.817 and 0.831
// before spent snapshots were discounted, docs/architecture.md; the twin gained with host
// copies leaving first too): each conversation kept costs node a 77 MB state (49 pages of
// KV's bytes; a prompt averages 25.9k tokens, 404 pages) that the twin gets for free.
// Regression floors, not the goals: 0.85 and 0.91.
TEST(ConversationGoals, ConversationTraceTwinShareRegressionFloor) {
  EXPECT_GE(tax(trace("conversation_trace.jsonl", 0), "conversations, 0 GiB"), 0.85);
  EXPECT_GE(tax(trace("conversation_trace.jsonl", 16), "conversations, 16 GiB"), 0.91);
}

// Goal: >= 0.95 of the twin at 64 and 256 GiB: met on the conversation trace. Measured
// 0.8226 / 0.8248 = 0.997 and 0.8244 / 0.8248 = 0.9996 (0.893 at 64 GiB before spent
// snapshots were discounted, 0.960 before host copies left first).
TEST(ConversationGoals, ConversationTraceNodeKeepsItsTwinsShareFrom64Gib) {
  EXPECT_GE(tax(trace("conversation_trace.jsonl", 64), "conversations, 64 GiB"), 0.95);
  EXPECT_GE(tax(trace("conversation_trace.jsonl", 256), "conversations, 256 GiB"), 0.95);
}

}  // namespace
}  // namespace radixtier::sim
