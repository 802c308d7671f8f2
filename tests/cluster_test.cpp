// The yardstick of issue 10: the router, the cluster replay and its default size, the
// attention-only twin and the sglang-like configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "sim/attention_only_cache.hpp"
#include "sim/counting_transfer_engine.hpp"
#include "sim/router.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

ModelGeometry qwen() {
  return *find_model("qwen3-next-80b");
}

TraceRequest req(std::uint64_t input, std::vector<std::uint64_t> ids, std::uint64_t ts = 0,
                 std::uint64_t out = 2) {
  TraceRequest r;
  r.timestamp_ms = ts;
  r.input_length = input;
  r.output_length = out;
  r.hash_ids = std::move(ids);
  return r;
}

// Three conversations of four turns, each turn extending the previous one's blocks and ending
// inside a block (the next turn shares only the full blocks).
std::vector<TraceRequest> tiny_trace() {
  std::vector<TraceRequest> t;
  for (std::uint64_t i = 0; i < 12; ++i) {
    const std::uint64_t conv = i % 3, turn = i / 3;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t b = 0; b < 4 + 2 * turn; ++b) ids.push_back(conv * 1000 + b);
    t.push_back(req(ids.size() * 512 - 100, ids, 1000 * i, 40));
  }
  return t;
}

TEST(Router, RoundRobinCycles) {
  Router r(RouterKind::kRoundRobin, 3, 100, 64);
  const std::vector<std::size_t> load(3, 0);
  std::vector<std::size_t> got;
  for (const auto& t : tiny_trace()) got.push_back(r.route(t, load));
  EXPECT_EQ(got, (std::vector<std::size_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
}

TEST(Router, SessionIsStickyByFirstBlockAndPlacesNewKeysByLoad) {
  Router r(RouterKind::kSession, 3, 100, 64);
  std::vector<std::size_t> load = {5, 0, 3};
  const auto t = tiny_trace();
  EXPECT_EQ(r.route(t[0], load), 1u);  // new key: the least loaded
  load = {0, 9, 9};
  EXPECT_EQ(r.route(t[1], load), 0u);
  EXPECT_EQ(r.route(t[3], load), 1u);  // conversation 0 again: sticky despite the load
  EXPECT_EQ(r.route(t[4], load), 0u);
}

TEST(Router, PrefixPicksTheLongestMatchElseTheSmallestTree) {
  Router r(RouterKind::kPrefix, 3, 100, 64);
  std::vector<std::size_t> load = {2, 1, 0};
  const auto t = tiny_trace();
  EXPECT_EQ(r.route(t[0], load), 2u);  // no match, every tree empty: the least loaded
  load = {0, 1, 0};
  EXPECT_EQ(r.route(t[1], load), 0u);  // 0 and 1 have empty trees: the less loaded, 0
  load = {0, 0, 7};
  EXPECT_EQ(r.route(t[3], load), 2u);  // conversation 0's blocks are on 2: match beats load
  // Conversation 2 matches nowhere: instance 1's tree is the smallest (0 blocks against 4 and
  // 6), though 0 is as lightly loaded and has the lower index.
  EXPECT_EQ(r.route(t[2], load), 1u);
  load = {9, 0, 0};
  EXPECT_EQ(r.route(t[4], load), 0u);  // conversation 1 is on 0: match beats load
  EXPECT_EQ(r.route(t[5], load), 1u);  // conversation 2 is on 1
}

TEST(Router, NewSessionsSpreadOverAnIdleClusterByTreeSize) {
  // Every load ties at zero (an idle cluster): each new session goes to the smallest tree, so
  // they spread instead of gathering on instance 0.
  Router r(RouterKind::kPrefix, 3, 100, 64);
  const std::vector<std::size_t> load(3, 0);
  std::vector<std::size_t> got;
  for (std::uint64_t conv = 0; conv < 6; ++conv) {
    std::vector<std::uint64_t> ids;
    for (std::uint64_t b = 0; b < 4; ++b) ids.push_back(conv * 1000 + b);
    got.push_back(r.route(req(ids.size() * 512, ids), load));
  }
  EXPECT_EQ(got, (std::vector<std::size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(Router, ParsesItsNames) {
  EXPECT_EQ(parse_router_kind("prefix").value(), RouterKind::kPrefix);
  EXPECT_EQ(parse_router_kind("session").value(), RouterKind::kSession);
  EXPECT_EQ(parse_router_kind("round-robin").value(), RouterKind::kRoundRobin);
  auto bad = parse_router_kind("random");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("round-robin"), std::string::npos);
}

TEST(Cluster, DefaultInstancesIsTheSmallestWithUtilizationAtMostTheTarget) {
  ScenarioOptions so;
  const Scenario s = trace_scenario(tiny_trace(), qwen(), so);
  const HardwarePreset hw = *find_hardware("h200-gen5");
  const double busy = offered_busy_seconds(s, hw, 0.025);
  const double span = trace_span_seconds(s);
  EXPECT_DOUBLE_EQ(span, 11.0);
  const std::size_t n = default_instances(s, hw, 0.025, 0.05);
  EXPECT_LE(busy / (static_cast<double>(n) * span), 0.05);
  if (n > 1) {
    EXPECT_GT(busy / (static_cast<double>(n - 1) * span), 0.05);
  }
  SimOptions o;
  o.hardware = "h200-gen5";
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->instances, default_instances(s, hw, 0.025));
  EXPECT_LE(r->utilization, kTargetUtilization);
  EXPECT_GE(r->ttft_s_p99, r->ttft_s_p90);
  EXPECT_GE(r->ttft_s_p90, r->ttft_s_p50);
  EXPECT_GT(r->ttft_s_p50, 0.0);
}

TEST(Cluster, EveryRequestRunsOnceWhicheverTheRouter) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario(tiny_trace(), qwen(), so);
  for (RouterKind k : {RouterKind::kRoundRobin, RouterKind::kSession, RouterKind::kPrefix}) {
    SimOptions o;
    o.hardware = "h200-gen5";
    o.instances = 3;
    o.router = k;
    o.check_invariants = true;
    auto r = simulate(s, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r->status.empty()) << r->status;
    EXPECT_EQ(r->instances, 3u);
    EXPECT_EQ(r->requests, 12u);
    EXPECT_EQ(r->failed, 0u);
    EXPECT_EQ(r->sched.finished, 12u);
  }
  // Session and prefix routing keep a conversation together: they reuse more than spreading
  // its turns round-robin over two instances.
  auto run = [&](RouterKind k) {
    SimOptions o;
    o.hardware = "h200-gen5";
    o.instances = 2;
    o.router = k;
    o.cache = CacheKind::kAttentionOnly;
    return simulate(s, o).value().hit_ratio;
  };
  EXPECT_GT(run(RouterKind::kPrefix), run(RouterKind::kRoundRobin));
  EXPECT_GT(run(RouterKind::kSession), run(RouterKind::kRoundRobin));
}

// Many conversations whose turns arrive interleaved: more blocks than a small cache holds
// (32 x 32 distinct blocks; a 16,384-token GPU pool with its 41 snapshot slots is 283).
std::vector<TraceRequest> busy_trace() {
  std::vector<TraceRequest> t;
  const std::uint64_t convs = 32;
  for (std::uint64_t i = 0; i < 4 * convs; ++i) {
    const std::uint64_t conv = i % convs, turn = i / convs;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t b = 0; b < 8 + 8 * turn; ++b) ids.push_back(conv * 1000 + b);
    t.push_back(req(ids.size() * 512 - 100, ids, 200 * i, 40));
  }
  return t;
}

TEST(Cluster, PrefixRouterIndexIsTheCacheBytesWithoutAHostTierItDoesNotHave) {
  // vllm-like without its offloading tier keeps nothing on host: the host budget must not
  // grow the router's index of it. It did: on the shipped trace's first 1,500 requests (8
  // instances) it routed, and hit, differently at 0 and 16 GiB (0.2088 vs 0.2077).
  auto trace = load_trace(
      (std::filesystem::path(__FILE__).parent_path() / "data/mooncake_synthetic_trace.jsonl")
          .string());
  ASSERT_TRUE(trace.is_ok()) << trace.status().to_string();
  trace->resize(std::min<std::size_t>(trace->size(), 1500));
  std::vector<std::size_t> cached[2];
  for (int with_host = 0; with_host < 2; ++with_host) {
    ScenarioOptions so;
    so.trace_host_bytes = with_host ? 16 * kGiB : 0;
    const Scenario s = trace_scenario(*trace, qwen(), so);
    SimOptions o;
    o.hardware = "h200-gen5";
    o.router = RouterKind::kPrefix;
    o.cache = CacheKind::kVllmLike;
    auto r = simulate(s, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_GT(r->instances, 1u);
    for (const RequestRow& row : r->rows) cached[with_host].push_back(row.cached_tokens);
  }
  EXPECT_EQ(cached[0], cached[1]);
}

TEST(Cluster, HostPoolStaysWithinTheHostBudgetWithSnapshotsInWholePages) {
  // A snapshot of qwen3-next-80b is 49.1 pages of 64 tokens: PrefixCache keeps it in 50. The
  // host budget counts the rounded size, so neither the pool nor its peak passes the budget.
  ScenarioOptions so;
  so.trace_max_running = 2;
  so.trace_gpu_kv_tokens = 16'384;
  so.trace_host_bytes = 64 * kGiB;  // node: 111 snapshots, sglang-like: 792 (states' share)
  const Scenario s = trace_scenario(busy_trace(), qwen(), so);
  for (CacheKind cache : {CacheKind::kNode, CacheKind::kSglangLike}) {
    for (SnapshotEviction e : {SnapshotEviction::kCostAware, SnapshotEviction::kLru}) {
      SimOptions o;
      o.hardware = "h200-gen5";
      o.cache = cache;
      o.eviction = e;
      o.sglang.hicache = true;
      o.sglang.extra_buffer = true;
      auto r = simulate(s, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      const CacheConfig& c = r->config;
      ASSERT_GT(c.host_snapshot_slots, 0u) << to_string(cache);
      EXPECT_LE(c.host_pool_pages() * c.page_bytes, so.trace_host_bytes) << to_string(cache);
      EXPECT_LE(r->host_bytes_peak, so.trace_host_bytes) << to_string(cache);
      // and the budget is used: less than a page and a snapshot's rounding left over
      EXPECT_GT(c.host_pool_pages() * c.page_bytes + c.page_bytes + c.snapshot_bytes,
                so.trace_host_bytes)
          << to_string(cache);
      EXPECT_GT(r->host_bytes_peak, 0u) << to_string(cache);
    }
  }
}

TEST(Cluster, SeveralInstancesNeedATrace) {
  SimOptions o;
  o.instances = 2;
  auto churn = make_scenario("churn", qwen());
  ASSERT_TRUE(churn.is_ok());
  EXPECT_FALSE(simulate(*churn, o).is_ok());
}

TEST(AttentionOnly, TwinHasTheSameBytesAllOfThemKv) {
  CacheConfig h;
  h.page_size = 64;
  h.page_bytes = 64 * 24'576;
  h.snapshot_bytes = 77'266'944;
  h.gpu_pages = 100;
  h.gpu_snapshot_slots = 6;
  h.host_pages = 1000;
  h.host_snapshot_slots = 10;
  const CacheConfig t = AttentionOnlyCache::twin_config(h);
  EXPECT_EQ(t.snapshot_bytes, 1u);
  EXPECT_EQ(t.gpu_pages, 100u + 6u * 77'266'944u / (64u * 24'576u));
  EXPECT_EQ(t.host_pages, 1000u + 10u * 77'266'944u / (64u * 24'576u));
  EXPECT_GE(t.host_snapshot_slots, t.gpu_pages + t.host_pages);
  // The host's snapshot share is the twin's free room for snapshots: KV never takes it.
  EXPECT_EQ(t.snapshot_eviction, SnapshotEviction::kUtility);
  EXPECT_TRUE(t.validate());
}

TEST(AttentionOnly, KvStaysWithinTheHybridsBytesPerTierAndSnapshotsTakeNoGpuPage) {
  // Before: a "0 GiB" twin demoted KV into the host pages its free snapshots were given (29 GB
  // of KV on a conversation trace), and its cached snapshots held a third of its GPU pool.
  CacheConfig h;
  h.page_size = 4;
  h.page_bytes = 64;
  h.snapshot_bytes = 256;  // 4 pages
  h.gpu_pages = 40;
  h.gpu_snapshot_slots = 2;
  h.host_pages = 0;  // no host tier
  const CacheConfig t = AttentionOnlyCache::twin_config(h);
  CountingTransferEngine engine(t);
  auto twin = AttentionOnlyCache::create(t, engine);
  ASSERT_TRUE(twin.is_ok()) << twin.status().to_string();
  AttentionOnlyCache& c = **twin;
  for (Token conv = 0; conv < 12; ++conv) {
    std::vector<Token> prompt(4 * 6 + 1);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = conv * 100 + Token(i);
    auto a = c.admit(prompt);
    ASSERT_TRUE(a.is_ok());
    ASSERT_TRUE(c.wait(a->lock).is_ok());
    auto pages = c.alloc_pages(a->lock, 6 - a->cached_tokens / 4);
    ASSERT_TRUE(pages.is_ok()) << pages.status().to_string();
    std::vector<GpuPageId> all = *c.path_pages(a->lock);
    all.insert(all.end(), pages->begin(), pages->end());
    ASSERT_TRUE(c.insert(a->lock, std::span(prompt).first(24), all, std::nullopt).is_ok());
    const CacheSizes z = c.sizes();
    EXPECT_EQ(z.gpu.snapshots_evictable, 0u) << conv;  // on host, in the snapshot share
    EXPECT_EQ(z.host.kv_pages_evictable + z.host.kv_pages_locked, 0u) << conv;
    EXPECT_LE(z.gpu.kv_pages_evictable + z.gpu.kv_pages_locked, t.gpu_pages);
    ASSERT_TRUE(c.release(a->lock).is_ok());
    ASSERT_EQ(c.check_invariants(), "");
  }
  EXPECT_GT(c.stats().kv_pages_dropped_gpu, 0u);  // the pool did run full
}

TEST(AttentionOnly, ResumesAtEveryPageBoundaryAndNeverBelowTheNodeCache) {
  ScenarioOptions so;
  so.trace_max_running = 2;
  so.trace_host_bytes = 4 * kGiB;
  const Scenario s = trace_scenario(tiny_trace(), qwen(), so);
  SimOptions o;
  o.hardware = "h200-gen5";
  o.check_invariants = true;
  auto node = simulate(s, o);
  o.cache = CacheKind::kAttentionOnly;
  auto twin = simulate(s, o);
  ASSERT_TRUE(node.is_ok() && twin.is_ok());
  EXPECT_TRUE(twin->status.empty()) << twin->status;
  EXPECT_GE(twin->hit_ratio, node->hit_ratio);
  // Turn t > 0 of a conversation shares the previous turn's full blocks: the twin resumes at
  // the last page boundary of what is shared (a 512-token block is 8 pages).
  for (std::size_t i = 3; i < twin->rows.size(); ++i) {
    const std::size_t shared = (4 + 2 * (i / 3 - 1)) * 512 - 512;
    EXPECT_GE(twin->rows[i].cached_tokens, shared) << "request " << i;
  }
}

TEST(SglangLike, HostSplitAsTheDevicePoolsWriteThroughAndExtraBufferDecodeTracks) {
  CacheConfig base;
  base.page_size = 64;
  base.page_bytes = 64 * 24'576;
  base.snapshot_bytes = 77'266'944;
  base.gpu_pages = 100;
  base.gpu_snapshot_slots = 41;
  base.host_pages = 10'000;
  base.host_snapshot_slots = 300;
  const CacheConfig c = config_for(CacheKind::kSglangLike, base);
  // HiCache: both host pools the same ratio of their device pools, so the host bytes split as
  // the device pools' bytes do (41 slots vs 100 pages: 95.3% states).
  const double host = 10'000.0 * double(base.page_bytes) + 300.0 * double(base.snapshot_bytes);
  const double gpu_states = 41.0 * double(base.snapshot_bytes);
  const double share = gpu_states / (gpu_states + 100.0 * double(base.page_bytes));
  EXPECT_EQ(c.host_snapshot_slots,
            static_cast<std::uint32_t>(host * share / double(base.snapshot_bytes)));
  EXPECT_NEAR(double(c.host_pages) * double(base.page_bytes) +
                  double(c.host_snapshot_slots) * double(base.snapshot_bytes),
              host, double(base.page_bytes));
  EXPECT_EQ(c.write_policy, WritePolicy::kWriteThrough);

  ScenarioOptions so;
  so.trace_max_running = 2;
  const Scenario s = trace_scenario({req(1000, {1, 2}, 0, 400)}, qwen(), so);
  SimOptions o;
  o.hardware = "h200-gen5";
  o.cache = CacheKind::kSglangLike;
  o.sglang.extra_buffer = true;
  o.check_invariants = true;
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->policy, "sglang-extra-buffer");
  // Decode crossed multiples of 256, so the prompt end's track (960) was replaced: only the
  // finish at the last multiple of 256 of the 1,399 forwarded tokens, 1,280, is kept.
  EXPECT_EQ(r->snapshots_kept, 1u);
}

}  // namespace
}  // namespace radixtier::sim
