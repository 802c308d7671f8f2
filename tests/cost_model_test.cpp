// The cost model against the numbers of /work/shared/reference/workloads.md.
#include "sim/cost_model.hpp"

#include <gtest/gtest.h>

namespace radixtier::sim {
namespace {

TEST(CostModel, GeometryPresetsGiveThePublishedByteCounts) {
  const ModelGeometry qwen = find_model("qwen3-next-80b").value();
  EXPECT_EQ(qwen.kv_bytes_per_token(), 24'576u);
  EXPECT_EQ(qwen.snapshot_bytes(), 77'266'944u);
  EXPECT_EQ(qwen.page_bytes(64), 64u * 24'576u);
  const ModelGeometry seed = find_model("seed-hybrid").value();
  EXPECT_EQ(seed.kv_bytes_per_token(), 12'480u);
  EXPECT_EQ(seed.snapshot_bytes(), 115'642'376u);
  // "A snapshot is as much memory as the KV of ~3,100 tokens" (brief).
  EXPECT_NEAR(double(qwen.snapshot_bytes()) / double(qwen.kv_bytes_per_token()), 3144, 1);
}

TEST(CostModel, UnknownPresetNamesAreClearErrors) {
  auto m = find_model("llama-7b");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.status().message().find("llama-7b"), std::string::npos);
  EXPECT_NE(m.status().message().find("qwen3-next-80b"), std::string::npos);
  auto h = find_hardware("tpu");
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.status().message().find("consumer-gen4"), std::string::npos);
  EXPECT_EQ(hardware_presets().size(), 2u);
  EXPECT_EQ(model_presets().size(), 3u);  // bench/models/*.json
}

TEST(CostModel, PrefillFitsBothSeedRecomputePoints) {
  const HardwarePreset hw = find_hardware("consumer-gen4").value();
  EXPECT_NEAR(prefill_seconds(hw, 0, 24'000), 16.5, 16.5 * 0.01);
  EXPECT_NEAR(prefill_seconds(hw, 0, 760'534), 798.9, 798.9 * 0.01);
  // Prefill after a cached prefix is the difference of the two integrals.
  EXPECT_NEAR(prefill_seconds(hw, 24'000, 24'500),
              prefill_seconds(hw, 0, 24'500) - prefill_seconds(hw, 0, 24'000), 1e-9);
  EXPECT_EQ(prefill_seconds(hw, 500, 500), 0.0);
  const HardwarePreset h200 = find_hardware("h200-gen5").value();
  EXPECT_NEAR(prefill_seconds(h200, 0, 1000), 0.077, 1e-12);
}

TEST(CostModel, ReloadMatchesThePhysicalFloor) {
  const ModelGeometry qwen = find_model("qwen3-next-80b").value();
  const HardwarePreset hw = find_hardware("consumer-gen4").value();
  auto floor_s = [&](std::uint64_t tokens) {
    return reload_seconds(hw, 0, tokens * qwen.kv_bytes_per_token() + qwen.snapshot_bytes());
  };
  EXPECT_NEAR(floor_s(24'000), 0.027, 0.001);
  EXPECT_NEAR(floor_s(131'072), 0.132, 0.001);
  EXPECT_NEAR(floor_s(985'577), 0.971, 0.002);
  // Per-call overhead and the shared-bus factor.
  EXPECT_NEAR(reload_seconds(hw, 1000, 0), 1000 * 2.3e-6, 1e-12);
  EXPECT_NEAR(reload_seconds(hw, 0, 25'000'000'000ull, /*concurrent=*/true), 1 / 0.6, 1e-9);
  // Recomputing a token costs ~700x its reload.
  const double per_token_reload = reload_seconds(hw, 0, qwen.kv_bytes_per_token());
  EXPECT_NEAR(hw.a / per_token_reload, 700, 35);
}

TEST(CostModel, EachHardwarePresetHasAnNvmeRow) {
  // Spec-sheet numbers (cost_model.cpp, docs/simulator.md "The disk row").
  const HardwarePreset gen4 = find_hardware("consumer-gen4").value();
  EXPECT_EQ(gen4.disk.read_bandwidth, 7.45e9);
  EXPECT_EQ(gen4.disk.write_bandwidth, 6.9e9);
  EXPECT_EQ(gen4.disk.t_io, 50e-6);
  const HardwarePreset gen5 = find_hardware("h200-gen5").value();
  EXPECT_EQ(gen5.disk.read_bandwidth, 14e9);
  EXPECT_EQ(gen5.disk.write_bandwidth, 10e9);
  EXPECT_EQ(gen5.disk.t_io, 60e-6);
  for (const HardwarePreset& hw : hardware_presets()) {
    EXPECT_FALSE(hw.disk.drive.empty()) << hw.name;
    // A disk is slower than the PCIe link above it, for reads and writes.
    EXPECT_LT(hw.disk.read_bandwidth, hw.bandwidth) << hw.name;
    EXPECT_LE(hw.disk.write_bandwidth, hw.disk.read_bandwidth) << hw.name;
  }
  // n t_io + B / BW: turn 1 of churn (24,000 tokens and a snapshot) from the Gen4 drive.
  const ModelGeometry qwen = find_model("qwen3-next-80b").value();
  const std::uint64_t bytes = 24'000 * qwen.kv_bytes_per_token() + qwen.snapshot_bytes();
  EXPECT_NEAR(disk_read_seconds(gen4, 0, bytes), double(bytes) / 7.45e9, 1e-12);
  EXPECT_NEAR(disk_read_seconds(gen4, 376, bytes), 376 * 50e-6 + double(bytes) / 7.45e9, 1e-12);
  EXPECT_NEAR(disk_write_seconds(gen4, 2, 6'900'000'000ull), 1.0 + 100e-6, 1e-12);
  EXPECT_EQ(disk_read_seconds(gen4, 0, 0), 0.0);
}

TEST(CostModel, TtftAddsTheFixedCost) {
  const HardwarePreset hw = find_hardware("consumer-gen4").value();
  EXPECT_NEAR(ttft_seconds(hw, 0.027, 0.5), 0.3 + 0.027 + 0.5, 1e-12);
}

}  // namespace
}  // namespace radixtier::sim
