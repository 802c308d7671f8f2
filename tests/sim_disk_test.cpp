// The simulator's disk tier (issue 13 item 6): --disk-gib gives the node cache a counting
// store; the restart scenario persists, restarts and serves turn 2 from it; a flush through a
// small host budget overflows into it; the disk is charged by the cost model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "radixtier/cache/prefix_cache.hpp"
#include "sim/cost_executor.hpp"
#include "sim/counting_store_engine.hpp"
#include "sim/counting_transfer_engine.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {
namespace {

HardwarePreset gen4() {
  return *find_hardware("consumer-gen4");
}
ModelGeometry qwen() {
  return *find_model("qwen3-next-80b");
}

constexpr std::uint64_t kDisk = 64 * kGiB;

TEST(Scenarios, RestartIsChurnWithARestartBeforeTurn2) {
  auto r = make_scenario("restart", qwen());
  auto c = make_scenario("churn", qwen());
  ASSERT_TRUE(r.is_ok() && c.is_ok());
  ASSERT_EQ(r->requests.size(), c->requests.size());
  for (std::size_t i = 0; i < r->requests.size(); ++i) {
    EXPECT_EQ(r->requests[i].request.prompt, c->requests[i].request.prompt) << i;
    EXPECT_EQ(r->requests[i].reusable_tokens, c->requests[i].reusable_tokens) << i;
  }
  ASSERT_TRUE(r->restart_before.has_value());
  EXPECT_EQ(*r->restart_before, 11u);
  EXPECT_EQ(r->requests[11].label, "turn 2");
  EXPECT_FALSE(c->restart_before.has_value());
  EXPECT_EQ(r->budget.gpu_kv_tokens, c->budget.gpu_kv_tokens);
}

TEST(Scenarios, HostBytesSetsTheWholeHostBudgetOfAnyScenario) {
  ScenarioOptions so;
  so.host_bytes = kGiB / 2;
  so.trace_snapshot_share = 0.25;
  auto f = make_scenario("flush", qwen(), so);
  ASSERT_TRUE(f.is_ok());
  const CacheConfig c = cache_config(f->budget, qwen(), f->page_size);
  const std::uint64_t snap = kGiB / 8;
  EXPECT_EQ(c.host_snapshot_slots, snap / qwen().snapshot_bytes());
  EXPECT_EQ(c.host_pages, (kGiB / 2 - snap) / c.page_bytes);
  // Unset: the scenario's own budget, as before.
  auto d = make_scenario("flush", qwen());
  ASSERT_TRUE(d.is_ok());
  const CacheConfig dc = cache_config(d->budget, qwen(), d->page_size);
  EXPECT_EQ(dc.host_snapshot_slots, 32u);
  EXPECT_EQ(dc.host_pages, 16 * kGiB / dc.page_bytes);
}

TEST(Simulator, ARestartWithoutAStoreLosesEverything) {
  auto s = make_scenario("restart", qwen());
  auto churn = make_scenario("churn", qwen());
  ASSERT_TRUE(s.is_ok() && churn.is_ok());
  for (CacheKind k :
       {CacheKind::kNode, CacheKind::kAttentionOnly, CacheKind::kSglangLike, CacheKind::kIndex}) {
    SimOptions o;
    o.cache = k;
    o.check_invariants = true;
    o.disk_bytes = k == CacheKind::kNode ? 0 : kDisk;  // only the node cache takes a store
    auto r = simulate(*s, o);
    ASSERT_TRUE(r.is_ok()) << to_string(k) << ": " << r.status().to_string();
    EXPECT_TRUE(r->status.empty()) << r->status;
    EXPECT_EQ(r->disk_bytes, 0u) << to_string(k);
    ASSERT_TRUE(r->restart.ran);
    EXPECT_EQ(r->restart.request, "turn 2");
    EXPECT_EQ(r->rows.back().cached_tokens, 0u) << to_string(k);
    EXPECT_EQ(r->restart.cached_tokens, 0u);
    // Every cache reuses turn 1 without the restart (sglang-like: no_buffer's finish state).
    EXPECT_GT(r->restart.cached_tokens_no_restart, 0u) << to_string(k);
    EXPECT_EQ(r->restart.reuse_ratio, 0.0);
    EXPECT_GT(r->restart.ttft_ratio, 10.0);  // turn 2 recomputes 24,500 tokens
    // Before the restart it is the churn run, request for request.
    o.disk_bytes = 0;
    o.check_invariants = false;  // checked above; these runs compare numbers only
    auto c = simulate(*churn, o);
    ASSERT_TRUE(c.is_ok());
    for (std::size_t i = 0; i + 1 < c->rows.size(); ++i) {
      EXPECT_EQ(r->rows[i].cached_tokens, c->rows[i].cached_tokens) << to_string(k) << " " << i;
      EXPECT_EQ(r->rows[i].ttft_s, c->rows[i].ttft_s) << to_string(k) << " " << i;
    }
    // --no-restart: the churn run.
    o.restart = false;
    auto straight = simulate(*s, o);
    ASSERT_TRUE(straight.is_ok());
    EXPECT_FALSE(straight->restart.ran);
    EXPECT_EQ(straight->cached_tokens, c->cached_tokens) << to_string(k);
    EXPECT_EQ(straight->ttft_s_total, c->ttft_s_total) << to_string(k);
  }
}

TEST(Simulator, WithoutADiskEveryChurnAndFlushNumberStays) {
  // --disk-gib 0 is the simulator as it was: no store, no disk seconds, the same JSON numbers
  // (docs/simulator.md: churn 0.3810 hit ratio, 30.48 s TTFT total).
  for (const char* name : {"churn", "flush"}) {
    auto s = make_scenario(name, qwen());
    ASSERT_TRUE(s.is_ok());
    auto r = simulate(*s, SimOptions{});
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->disk_bytes, 0u);
    EXPECT_EQ(r->stats.store_writes + r->stats.store_reads, 0u);
    for (const RequestRow& row : r->rows) EXPECT_EQ(row.disk_s, 0.0) << row.label;
    EXPECT_EQ(r->sched.store_wait_s, 0.0);
    if (std::string(name) == "churn") {
      EXPECT_NEAR(r->hit_ratio, 0.3810, 5e-5);
      EXPECT_NEAR(r->ttft_s_total, 30.48, 5e-3);
    }
  }
}

// The TTFT the model charges a row: t0 + disk read + PCIe reload + prefill.
void expect_charged(const RequestRow& row, const HardwarePreset& hw) {
  EXPECT_NEAR(row.disk_s, disk_read_seconds(hw, row.store_reads, row.bytes_from_store), 1e-12);
  EXPECT_NEAR(row.ttft_s, hw.t0 + row.disk_s + row.reload_s + row.prefill_s, 1e-9) << row.label;
}

TEST(Simulator, RestartOnTheStoreServesTurn2AsTheRunWithoutItDoes) {
  // The goal (issue 13): qwen3-next-80b on consumer-gen4 with its NVMe row.
  auto s = make_scenario("restart", qwen());
  ASSERT_TRUE(s.is_ok());
  SimOptions o;
  o.check_invariants = true;
  o.disk_bytes = kDisk;
  auto r = simulate(*s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->status.empty()) << r->status;
  EXPECT_EQ(r->failed, 0u);
  ASSERT_TRUE(r->restart.ran);
  const RestartReport& x = r->restart;
  // persist + rebuild: turn 2 finds after the restart what it finds without one.
  EXPECT_GT(x.cached_tokens_no_restart, 23'000u);
  EXPECT_GE(x.reuse_ratio, 0.99) << x.cached_tokens << " / " << x.cached_tokens_no_restart;
  EXPECT_GT(x.persist_bytes, 0u);
  EXPECT_GT(r->stats.restored_kv_pages, 0u);
  EXPECT_GT(r->stats.restored_snapshots, 0u);
  // ... from the disk: a fresh GPU and host hold nothing, so every reused byte was read.
  const RequestRow& t2 = r->rows.back();
  EXPECT_EQ(t2.store_cached_tokens, t2.cached_tokens);
  EXPECT_GE(t2.bytes_from_store,
            t2.cached_tokens * qwen().kv_bytes_per_token() + qwen().snapshot_bytes());
  EXPECT_GT(t2.store_reads, t2.cached_tokens / s->page_size);
  EXPECT_EQ(x.bytes_from_store, t2.bytes_from_store);
  // The cost model: TTFT = t0 + disk + reload + prefill, the floor with the disk's bandwidth.
  const HardwarePreset hw = gen4();
  expect_charged(t2, hw);
  const double floor =
      hw.t0 +
      double(t2.reusable_tokens * qwen().kv_bytes_per_token() + qwen().snapshot_bytes()) /
          hw.disk.read_bandwidth +
      prefill_seconds(hw, double(t2.reusable_tokens), double(t2.prompt_tokens));
  EXPECT_NEAR(x.disk_floor_s, floor, 1e-9);
  EXPECT_NEAR(x.ttft_ratio, x.ttft_s / floor, 1e-9);
  EXPECT_LE(x.ttft_ratio, 1.5);
  EXPECT_GT(x.ttft_s, x.ttft_s_no_restart);  // the disk is slower than host memory
  // The JSON carries both ratios.
  const auto j = nlohmann::json::parse(to_json(*r));
  EXPECT_EQ(j["restart"]["request"], "turn 2");
  EXPECT_GE(j["restart"]["reuse_ratio"].get<double>(), 0.99);
  EXPECT_LE(j["restart"]["ttft_ratio"].get<double>(), 1.5);
  EXPECT_EQ(j["disk_bytes"], kDisk);
}

TEST(Simulator, AFlushThroughASmallHostOverflowsIntoTheDisk) {
  // 0.75 GiB of host: less than turn 1 with the snapshots it kept (0.6 GB of KV + 13 x 77 MB)
  // and than either flush prompt (3.2 GB), more than turn 2's usable match (0.67 GB: the
  // cache stages a store-resident match on host whole, so a host smaller than that cannot load
  // it; docs/simulator.md). The flush prompts push turn 1 from GPU through host to the disk,
  // from where turn 2 reloads it; without a disk it is dropped.
  ScenarioOptions so;
  so.host_bytes = 3 * kGiB / 4;
  auto s = make_scenario("flush", qwen(), so);
  ASSERT_TRUE(s.is_ok());
  SimOptions o;
  o.check_invariants = true;
  auto none = simulate(*s, o);
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  o.disk_bytes = kDisk;
  auto disk = simulate(*s, o);
  ASSERT_TRUE(disk.is_ok()) << disk.status().to_string();
  EXPECT_TRUE(disk->status.empty()) << disk->status;
  const RequestRow& t2 = disk->rows.back();
  EXPECT_EQ(t2.label, "turn 2");
  EXPECT_GT(disk->stats.bytes_to_store, 0u);
  EXPECT_EQ(none->rows.back().cached_tokens, 0u);
  EXPECT_GE(t2.cached_tokens, 24'192u);
  EXPECT_EQ(t2.store_cached_tokens, t2.cached_tokens);
  EXPECT_GE(t2.bytes_from_store,
            t2.cached_tokens * qwen().kv_bytes_per_token() + qwen().snapshot_bytes());
  EXPECT_LT(t2.ttft_s, none->rows.back().ttft_s);
  expect_charged(t2, gen4());
  // Store waits (the host is too small for the host watermark to keep ahead of 2,000-page
  // prompts) are on the clock at the disk's write bandwidth.
  EXPECT_GT(disk->stats.store_copy_waits, 0u);
  EXPECT_GT(disk->sched.store_wait_s, 0.0);
  EXPECT_NEAR(
      disk->sched.store_wait_s,
      disk_write_seconds(gen4(), disk->stats.store_copy_waits, disk->stats.store_wait_bytes), 1e-9);
}

// A CostExecutor whose store waits cost `factor` x its price (0: not charged).
class StoreWaitScaled final : public sched::Executor {
 public:
  StoreWaitScaled(CostExecutor& inner, double factor) : inner_(inner), factor_(factor) {}
  std::size_t state_bytes() const override { return inner_.state_bytes(); }
  Status begin(sched::RequestId r, std::optional<GpuSlotId> from) override {
    return inner_.begin(r, from);
  }
  Result<double> forward(sched::RequestId r, std::span<const Token> t, std::size_t pos,
                         std::span<const GpuPageId> table) override {
    return inner_.forward(r, t, pos, table);
  }
  std::span<const float> last_logits(sched::RequestId r) const override {
    return inner_.last_logits(r);
  }
  Result<Token> next_token(sched::RequestId r) override { return inner_.next_token(r); }
  Status save_snapshot(sched::RequestId r, GpuSlotId s) override {
    return inner_.save_snapshot(r, s);
  }
  Status checkpoint(sched::RequestId r) override { return inner_.checkpoint(r); }
  Status save_checkpoint(sched::RequestId r, GpuSlotId s) override {
    return inner_.save_checkpoint(r, s);
  }
  void end(sched::RequestId r) override { inner_.end(r); }
  double copy_wait_seconds(std::uint64_t c, std::uint64_t b) const override {
    return inner_.copy_wait_seconds(c, b);
  }
  double store_wait_seconds(std::uint64_t w, std::uint64_t b) const override {
    return factor_ * inner_.store_wait_seconds(w, b);
  }

 private:
  CostExecutor& inner_;
  double factor_;
};

TEST(Scheduler, StoreWaitsAreOnTheVirtualClock) {
  // The flush through a 0.75 GiB host on a disk, driven by hand: the scheduler adds what the
  // executor prices the cache's store waits at to its clock, and nothing when it prices 0.
  ScenarioOptions so;
  so.host_bytes = 3 * kGiB / 4;
  auto s = make_scenario("flush", qwen(), so);
  ASSERT_TRUE(s.is_ok());
  const CacheConfig config = cache_config(s->budget, qwen(), s->page_size);
  auto run = [&](double factor) {
    CountingTransferEngine engine(config);
    auto store = CountingStoreEngine::create(CountingStoreEngine::geometry_for(config, kDisk),
                                             config.host_pool_pages());
    EXPECT_TRUE(store.is_ok());
    auto cache = PrefixCache::create(config, engine, store->get());
    EXPECT_TRUE(cache.is_ok()) << cache.status().to_string();
    CostExecutorOptions eo;
    eo.gpu_slots = config.gpu_snapshot_slots;
    CostExecutor cost(gen4(), qwen().snapshot_bytes(), eo);
    StoreWaitScaled exec(cost, factor);
    sched::SchedulerConfig sc;
    sc.chunk_tokens = s->chunk_tokens;
    sc.max_running = s->max_running;
    sc.policy = *sched::SnapshotPolicy::parse(kDefaultPolicy);
    sc.kv_bytes_per_token = qwen().kv_bytes_per_token();
    auto sched = sched::Scheduler::create(**cache, exec, sc);
    EXPECT_TRUE(sched.is_ok());
    for (const ScenarioRequest& r : s->requests) EXPECT_TRUE((*sched)->submit(r.request).is_ok());
    while (!(*sched)->idle()) EXPECT_TRUE((*sched)->step().is_ok());
    const CacheStats st = (*cache)->stats();
    EXPECT_GT(st.store_copy_waits, 0u);
    EXPECT_NEAR((*sched)->stats().store_wait_s,
                factor * disk_write_seconds(gen4(), st.store_copy_waits, st.store_wait_bytes),
                1e-9);
    return std::pair((*sched)->now(), (*sched)->stats().store_wait_s);
  };
  const auto [free_clock, free_wait] = run(0.0);
  const auto [clock, wait] = run(1.0);
  EXPECT_EQ(free_wait, 0.0);
  EXPECT_GT(wait, 0.3);
  EXPECT_NEAR(clock - free_clock, wait, 1e-6);
}

}  // namespace
}  // namespace radixtier::sim
