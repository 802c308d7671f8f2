#include "sim/cost_model.hpp"

#include <array>
#include <cstdio>
#include <string>

namespace radixtier::sim {

namespace {

// Numbers from /work/shared/reference/workloads.md. seed-hybrid: fp8 KV with fp32
// per-token scales and 12 full layers x Hkv 2 x head 256 are that page's assumptions; the
// extra state is 184,320 B plus 8 B. Weights (docs/simulator.md, "GPU KV budget"): 80e9
// parameters in fp8, 1 byte each (Qwen3-Next-80B-A3B; its bf16 weights, 160 GB, do not fit
// one H200); seed-hybrid is assumed to be as large.
constexpr std::array<ModelGeometry, 2> kModels{{
    {"qwen3-next-80b", 12, 36, 2, 256, 2, 0, 16, 32, 128, 128, 4, 4, 2, 0, 80'000'000'000},
    {"seed-hybrid", 12, 36, 2, 256, 1, 4, 16, 48, 128, 128, 4, 4, 2, 184'320 + 8, 80'000'000'000},
}};

// h200-gen5: b = 0 because public points do not resolve it (workloads.md). HBM: 141 GB
// (H200), 16 GB (the seed's consumer GPU, workloads.md); 10% of it for activations, CUDA
// graphs and the runtime (SGLang's --mem-fraction-static is about 0.9 on large GPUs).
constexpr std::array<HardwarePreset, 2> kHardware{{
    {"consumer-gen4", 676e-6, 9.82e-10, 25e9, 2.3e-6, 0.3, 0.6, 16e9, 0.1},
    {"h200-gen5", 77e-6, 0.0, 55e9, 2.3e-6, 0.3, 0.6, 141e9, 0.1},
}};

template <class Row>
Result<Row> find_row(std::span<const Row> rows, std::string_view name, const char* what) {
  std::string known;
  for (const Row& r : rows) {
    if (r.name == name) return r;
    known += (known.empty() ? "" : ", ") + std::string(r.name);
  }
  return not_found(std::string("unknown ") + what + " preset '" + std::string(name) +
                   "' (known: " + known + ")");
}

}  // namespace

std::uint64_t ModelGeometry::kv_bytes_per_token() const {
  return std::uint64_t{full_layers} * 2 * kv_heads *
         (std::uint64_t{head_dim} * kv_element_bytes + kv_scale_bytes);
}

std::uint64_t ModelGeometry::snapshot_bytes() const {
  const std::uint64_t recurrent =
      std::uint64_t{value_heads} * key_dim * value_dim * recurrent_element_bytes;
  const std::uint64_t conv = (2ull * key_heads * key_dim + std::uint64_t{value_heads} * value_dim) *
                             (conv_kernel - 1) * conv_element_bytes;
  return gdn_layers * (recurrent + conv) + extra_state_bytes;
}

std::span<const ModelGeometry> model_presets() {
  return kModels;
}
std::span<const HardwarePreset> hardware_presets() {
  return kHardware;
}

Result<ModelGeometry> find_model(std::string_view name) {
  return find_row(model_presets(), name, "model");
}

Result<HardwarePreset> find_hardware(std::string_view name) {
  return find_row(hardware_presets(), name, "hardware");
}

Result<std::uint64_t> gpu_cache_bytes(const HardwarePreset& hw, const ModelGeometry& model) {
  const double usable = hw.hbm_bytes * (1.0 - hw.runtime_reserve);
  const double weights = static_cast<double>(model.weight_bytes);
  if (usable <= weights) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "model %s (%.1f GB of weights) does not fit hardware %s (%.1f GB HBM, %.0f%% "
                  "reserved for activations): give the GPU KV budget (--gpu-kv-tokens)",
                  std::string(model.name).c_str(), weights / 1e9, std::string(hw.name).c_str(),
                  hw.hbm_bytes / 1e9, 100 * hw.runtime_reserve);
    return Status(ErrorCode::kFailedPrecondition, buf);
  }
  return static_cast<std::uint64_t>(usable - weights);
}

double prefill_seconds(const HardwarePreset& hw, double l0, double l1) {
  if (l1 <= l0) return 0.0;
  return hw.a * (l1 - l0) + hw.b / 2.0 * (l1 * l1 - l0 * l0);
}

double reload_seconds(const HardwarePreset& hw, std::uint64_t copies, std::uint64_t bytes,
                      bool concurrent) {
  const double bw = concurrent ? hw.bandwidth * hw.concurrent_factor : hw.bandwidth;
  return static_cast<double>(copies) * hw.t_call + static_cast<double>(bytes) / bw;
}

double ttft_seconds(const HardwarePreset& hw, double reload_s, double prefill_s) {
  return hw.t0 + reload_s + prefill_s;
}

}  // namespace radixtier::sim
