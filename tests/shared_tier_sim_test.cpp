// The simulator's shared tier (issue 22, src/sim/shared_tier_model.hpp): its cost row, the
// path hashes it keys by, and end to end on a small synthetic trace: sharing on beats sharing
// off under round-robin, its fetches are priced into TTFT, its content stays in budget, and
// the fresh-instance restart reports.
#include <gtest/gtest.h>

#include <vector>

#include "sim/scenarios.hpp"
#include "sim/shared_tier_model.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

ModelGeometry qwen() {
  return *find_model("qwen3-next-80b");
}

// Four conversations of five turns, each turn extending the previous one's blocks (ending
// inside a block), one request every 5 s so a turn finished before the next arrives. Under
// round-robin over 3 instances a conversation's consecutive turns land on different ones.
std::vector<TraceRequest> conversations(std::uint64_t turns = 5) {
  std::vector<TraceRequest> t;
  for (std::uint64_t i = 0; i < 4 * turns; ++i) {
    const std::uint64_t conv = i % 4, turn = i / 4;
    TraceRequest r;
    for (std::uint64_t b = 0; b < 6 + 2 * turn; ++b) r.hash_ids.push_back(conv * 1000 + b);
    r.input_length = r.hash_ids.size() * 512 - 100;
    r.output_length = 40;
    r.timestamp_ms = 5000 * i;
    t.push_back(std::move(r));
  }
  return t;
}

SimResult run(const Scenario& s, std::uint64_t shared_bytes, RouterKind router,
              std::size_t instances = 3, bool fresh = false) {
  SimOptions o;
  o.hardware = "h200-gen5";
  o.instances = instances;
  o.router = router;
  o.shared_bytes = shared_bytes;
  o.fresh_instance = fresh;
  o.check_invariants = true;
  auto r = simulate(s, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r) return {};
  EXPECT_TRUE(r->status.empty()) << r->status;
  EXPECT_EQ(r->failed, 0u);
  return std::move(*r);
}

TEST(SharedTierCost, ReaderBandwidthIsTheNicOrTheShardsWhicheverIsLess) {
  const HardwarePreset hw = *find_hardware("h200-gen5");
  EXPECT_DOUBLE_EQ(shared_bandwidth(hw, 1), hw.shared.shard_bandwidth);
  EXPECT_DOUBLE_EQ(shared_bandwidth(hw, 0), hw.shared.shard_bandwidth);  // at least one shard
  EXPECT_DOUBLE_EQ(shared_bandwidth(hw, 1000), hw.shared.nic_bandwidth);
  for (const HardwarePreset& p : hardware_presets()) {
    EXPECT_GT(p.shared.nic_bandwidth, 0) << p.name;
    EXPECT_GT(p.shared.shard_bandwidth, 0) << p.name;
    EXPECT_GT(p.shared.latency_s, 0) << p.name;
  }
}

TEST(SharedTierModel, PathHashesChainFromTheRootPageByPage) {
  std::vector<Token> tokens(64 * 3 + 10);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i * 7);
  const auto h = page_path_hashes(tokens, 64, 10);  // capped at the 3 whole pages
  ASSERT_EQ(h.size(), 4u);
  EXPECT_TRUE(h[0].is_root());
  PathHash p = PathHash::root();
  for (std::size_t i = 0; i < 3; ++i) {
    p = extend_path(p, std::span<const Token>(tokens).subspan(i * 64, 64));
    EXPECT_EQ(h[i + 1], p);
  }
}

TEST(SharedTierSim, SharingBeatsNoSharingUnderRoundRobin) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(conversations(), qwen(), so);
  const SimResult off = run(s, 0, RouterKind::kRoundRobin);
  const SimResult on = run(s, 64 * kGiB, RouterKind::kRoundRobin);
  EXPECT_EQ(off.shared.capacity_bytes, 0u);
  EXPECT_EQ(off.shared.counters.probes, 0u);
  EXPECT_GT(on.hit_ratio, off.hit_ratio);
  const SharedTierCounters& k = on.shared.counters;
  EXPECT_GT(k.fetches, 0u);
  EXPECT_GT(k.fetched_tokens, 0u);
  EXPECT_GT(k.published_kv_pages, 0u);
  EXPECT_GT(k.published_snapshots, 0u);
  EXPECT_EQ(k.import_failures, 0u);
  EXPECT_EQ(on.config.write_policy, WritePolicy::kWriteThrough);  // publishes host copies
  EXPECT_EQ(on.shared.shards, 3u);                                // one per instance
  // Every fetch is priced into its request's TTFT: probe + fetch round trips and the bytes.
  std::uint64_t bytes = 0;
  double wait = 0;
  for (const RequestRow& row : on.rows) {
    bytes += row.shared_bytes;
    wait += row.shared_s;
    if (row.shared_tokens > 0) {
      EXPECT_GE(row.shared_s, 2 * on.shared.latency_s +
                                  static_cast<double>(row.shared_bytes) / on.shared.bandwidth -
                                  1e-12);
      EXPECT_GE(row.ttft_s, row.shared_s + row.reload_s);
      EXPECT_GE(row.cached_tokens, row.shared_tokens);
    }
  }
  EXPECT_EQ(bytes, k.fetched_bytes);
  EXPECT_NEAR(wait, k.wait_s, 1e-9);
}

TEST(SharedTierSim, TheContentStaysWithinItsBudget) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(conversations(), qwen(), so);
  const std::uint64_t budget = 1 * kGiB;  // a few snapshots' worth: the LRU must evict
  const SimResult r = run(s, budget, RouterKind::kRoundRobin);
  const SharedTierCounters& k = r.shared.counters;
  EXPECT_GT(k.evicted_entries, 0u);
  EXPECT_LE(k.peak_bytes, budget);
  EXPECT_LE(k.bytes, budget);
}

TEST(SharedTierSim, OnlyTheNodeCacheHasOne) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(conversations(2), qwen(), so);
  SimOptions o;
  o.hardware = "h200-gen5";
  o.instances = 2;
  o.shared_bytes = 64 * kGiB;
  o.cache = CacheKind::kSglangLike;
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->shared.capacity_bytes, 0u);
  EXPECT_EQ(r->shared.counters.probes, 0u);
}

TEST(SharedTierSim, AFreshInstanceRestartsEmptyAndReports) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(conversations(8), qwen(), so);
  const SimResult on = run(s, 64 * kGiB, RouterKind::kRoundRobin, 3, true);
  ASSERT_TRUE(on.fresh.ran);
  EXPECT_GE(on.fresh.restart_request, s.size() / 2 + 1);
  EXPECT_GT(on.fresh.fresh_requests, 0u);
  EXPECT_GT(on.fresh.warm_requests, 0u);
  EXPECT_EQ(on.sched.finished, s.size());  // nothing in flight was lost
  const SimResult off = run(s, 0, RouterKind::kRoundRobin, 3, true);
  ASSERT_TRUE(off.fresh.ran);
  EXPECT_EQ(off.fresh.restart_request, on.fresh.restart_request);  // deterministic
  EXPECT_GE(on.fresh.fresh_hit_ratio, off.fresh.fresh_hit_ratio);
  // One instance, or a scenario that is not a trace: refused.
  SimOptions one;
  one.hardware = "h200-gen5";
  one.instances = 1;
  one.fresh_instance = true;
  EXPECT_FALSE(simulate(s, one).is_ok());
}

}  // namespace
}  // namespace radixtier::sim
