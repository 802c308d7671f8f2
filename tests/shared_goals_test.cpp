// The shared tier's goals (issue 22; docs/simulator.md, "The shared tier"), asserted on the
// shipped trace with 10 instances on h200-gen5, qwen3-next-80b (ctest label `goals`).
//
// The shared budget is one rule for every workload: the fleet's total cache bytes,
// instances x (GPU KV + GPU snapshot bytes + host budget), the bytes the cluster-wide ideal
// gets. Where a goal is not met the test asserts the measured level as a regression floor,
// named as such; docs/simulator.md gives the goal, the measured number and why.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

constexpr std::size_t kInstances = 10;

/// The shipped trace, committed beside the tests (a copy of ../shared/traces/), so the goals
/// run on every checkout.
std::string trace_path() {
  return (std::filesystem::path(__FILE__).parent_path() / "data/mooncake_synthetic_trace.jsonl")
      .string();
}

class SharedGoals : public ::testing::Test {
 protected:
  void SetUp() override {
    ScenarioOptions so;
    so.trace_path = trace_path();
    // The reference, the block-LRU ideal, keys the trace's hash ids: it cannot see a turn's
    // continuation, so these goals (issue 22) compare both sides on the hash-only prompts
    // they were set on. On the token-faithful replay prefix routing reaches 0.6227 / 0.6511.
    so.trace_hash_only = true;
    auto s = make_scenario("trace", *find_model("qwen3-next-80b"), so);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    scenario_ = std::move(*s);
  }

  SimResult run(CacheKind cache, RouterKind router, std::uint64_t shared_bytes,
                bool fresh = false) {
    SimOptions o;
    o.cache = cache;
    o.hardware = "h200-gen5";
    o.instances = kInstances;
    o.router = router;
    o.shared_bytes = shared_bytes;
    o.fresh_instance = fresh;
    auto r = simulate(scenario_, o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r) return {};
    EXPECT_TRUE(r->status.empty()) << r->status;
    EXPECT_EQ(r->failed, 0u);
    return std::move(*r);
  }

  /// The rule: the fleet's total cache bytes (what the ideal gets), from a run's budget.
  static std::uint64_t fleet_bytes(const SimResult& r) {
    return r.total_budget_bytes * r.instances;
  }

  Scenario scenario_;
};

// Goal: with the shared tier, round-robin reaches >= 0.95 x the hit ratio of prefix routing
// (measured 0.6195 / 0.6375 = 0.972; 0.1421 without the shared tier).
// Goal: prefix routing reaches >= 0.97 x the cluster-wide ceiling, the ideal over all
// instances: met, 0.6375 / 0.6511 = 0.979 (0.976 without the shared tier, 0.6356: the prefix
// router sends a request that matches little to the smallest tree, docs/simulator.md), and
// above prefix routing without the shared tier (the tier's write-through copies leave host
// first once published, docs/architecture.md).
TEST_F(SharedGoals, RoutingBarelyMattersAndPrefixRoutingNearsTheCeiling) {
  const SimResult ideal = run(CacheKind::kIdeal, RouterKind::kPrefix, 0);
  const SimResult alone = run(CacheKind::kNode, RouterKind::kPrefix, 0);
  const std::uint64_t budget = fleet_bytes(alone);
  const SimResult prefix = run(CacheKind::kNode, RouterKind::kPrefix, budget);
  const SimResult rr = run(CacheKind::kNode, RouterKind::kRoundRobin, budget);
  ASSERT_GT(ideal.hit_ratio, 0);
  ASSERT_GT(prefix.hit_ratio, 0);
  EXPECT_GE(rr.hit_ratio / prefix.hit_ratio, 0.95)
      << "round-robin " << rr.hit_ratio << ", prefix " << prefix.hit_ratio;
  EXPECT_GE(prefix.hit_ratio / ideal.hit_ratio, 0.97)
      << "prefix " << prefix.hit_ratio << ", ideal " << ideal.hit_ratio;
  EXPECT_GT(prefix.hit_ratio, alone.hit_ratio);
}

// Goal: a freshly started instance's first 100 requests hit within 10% of a warm one's: the
// same 100 requests in the run where instance 0 never restarted (SimResult::fresh). Measured:
// round-robin 0.6211 / 0.6219 = 0.999, prefix 0.1791 / 0.1392 = 1.29 (the prefix router sends
// what matches little anywhere to the fresh instance, its tree the smallest; without the
// shared tier 0.413 and 0.451).
TEST_F(SharedGoals, AFreshInstanceHitsWithinTenPercentOfAWarmOne) {
  const std::uint64_t budget = fleet_bytes(run(CacheKind::kIdeal, RouterKind::kPrefix, 0));
  for (RouterKind router : {RouterKind::kRoundRobin, RouterKind::kPrefix}) {
    const SimResult r = run(CacheKind::kNode, router, budget, true);
    ASSERT_TRUE(r.fresh.ran) << to_string(router);
    EXPECT_EQ(r.fresh.fresh_requests, kFreshRequests) << to_string(router);
    EXPECT_GE(r.fresh.same_ratio, 0.9) << to_string(router) << ": fresh " << r.fresh.fresh_hit_ratio
                                       << ", warm " << r.fresh.same_warm_hit_ratio;
  }
}

}  // namespace
}  // namespace radixtier::sim
