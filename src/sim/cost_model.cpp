#include "sim/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

namespace radixtier::sim {

namespace {

// h200-gen5: b = 0 because public points do not resolve it (workloads.md). HBM: 141 GB
// (H200), 16 GB (the seed's consumer GPU, workloads.md); 10% of it for activations, CUDA
// graphs and the runtime (SGLang's --mem-fraction-static is about 0.9 on large GPUs).
//
// The NVMe rows (docs/simulator.md, "The disk row"):
// - consumer-gen4: a PCIe 4.0 x4 consumer drive, Samsung 990 PRO: sequential read up to
//   7,450 MB/s, write up to 6,900 MB/s (Samsung's announcement, Aug. 2022, as reported by
//   slashcam.com and digitec.ch).
// - h200-gen5: a PCIe 5.0 x4 datacenter drive, Micron 9550 MAX: sequential read 14,000 MB/s,
//   write 10,000 MB/s, typical read latency 60 us (Micron's spec table, as reproduced in
//   storagereview.com's 9550 MAX review).
// - t_io, assumption: one QD1 4 KiB read's latency per record, as if no two I/Os overlapped
//   (an upper bound: an engine keeps several in flight). consumer-gen4: 50 us (PCIe 4.0
//   consumer drives measure about 20,000 QD1 4K random-read IOPS, e.g. KitGuru's
//   CrystalDiskMark run of a T-Force Cardea A440 Pro: 20,336 IOPS); h200-gen5: the 9550's
//   60 us typical read latency.
//
// The shared tier rows (docs/simulator.md, "The shared tier"):
// - NIC: h200-gen5, one 400 Gb/s NVIDIA ConnectX-7 per GPU (a DGX H200 has eight single-port
//   ConnectX-7, up to 400 Gb/s, one per GPU: NVIDIA's DGX H200 datasheet): 50 GB/s;
//   consumer-gen4, assumption: a workstation's 100 Gb/s NIC (ConnectX-6 class): 12.5 GB/s.
// - shard bandwidth: one Redis 8.2 server with --io-threads 4 serves GETs of 4 MiB values at
//   5.85 GB/s (memtier_benchmark, 20 clients x 4 threads, localhost; the README of
//   github.com/LMCache/lmcache_redis); 5.8e9 per shard.
// - latency, assumption: 100 us per round trip, a datacenter TCP round trip (tens of us)
//   plus Redis's request handling; the probe is one pipelined round, the fetch another.
constexpr std::array<HardwarePreset, 2> kHardware{{
    {"consumer-gen4",
     676e-6,
     9.82e-10,
     25e9,
     2.3e-6,
     0.3,
     0.6,
     16e9,
     0.1,
     {"Samsung 990 PRO (PCIe 4.0 x4)", 7.45e9, 6.9e9, 50e-6},
     {"100 Gb/s NIC", 12.5e9, 5.8e9, 100e-6}},
    {"h200-gen5",
     77e-6,
     0.0,
     55e9,
     2.3e-6,
     0.3,
     0.6,
     141e9,
     0.1,
     {"Micron 9550 MAX (PCIe 5.0 x4)", 14e9, 10e9, 60e-6},
     {"400 Gb/s ConnectX-7", 50e9, 5.8e9, 100e-6}},
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

unsigned __int128 ModelGeometry::kv_bytes_per_token_wide() const {
  using Wide = unsigned __int128;
  return Wide{full_layers} * 2 * kv_heads * (Wide{head_dim} * kv_element_bytes + kv_scale_bytes);
}

unsigned __int128 ModelGeometry::snapshot_bytes_wide() const {
  using Wide = unsigned __int128;
  const Wide recurrent = Wide{value_heads} * key_dim * value_dim * recurrent_element_bytes;
  const Wide conv = (Wide{2} * key_heads * key_dim + Wide{value_heads} * value_dim) *
                    (conv_kernel - 1) * conv_element_bytes;
  return Wide{gdn_layers} * (recurrent + conv) + extra_state_bytes;
}

std::uint64_t ModelGeometry::kv_bytes_per_token() const {
  return static_cast<std::uint64_t>(kv_bytes_per_token_wide());
}

std::uint64_t ModelGeometry::snapshot_bytes() const {
  return static_cast<std::uint64_t>(snapshot_bytes_wide());
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
  if (model.weight_bytes == 0) {
    return Status(ErrorCode::kFailedPrecondition,
                  "model " + model.name +
                      ": its weight bytes are unknown (add \"radixtier\": {\"weight_bytes\": N} "
                      "to its config.json, or the fields the estimate needs: docs/simulator.md): "
                      "give the GPU KV budget (--gpu-kv-tokens)");
  }
  if (usable <= weights) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "model %s (%.1f GB of weights) does not fit hardware %s (%.1f GB HBM, %.0f%% "
                  "reserved for activations): give the GPU KV budget (--gpu-kv-tokens)",
                  model.name.c_str(), weights / 1e9, std::string(hw.name).c_str(),
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

double disk_read_seconds(const HardwarePreset& hw, std::uint64_t ios, std::uint64_t bytes) {
  return static_cast<double>(ios) * hw.disk.t_io +
         static_cast<double>(bytes) / hw.disk.read_bandwidth;
}

double disk_write_seconds(const HardwarePreset& hw, std::uint64_t ios, std::uint64_t bytes) {
  return static_cast<double>(ios) * hw.disk.t_io +
         static_cast<double>(bytes) / hw.disk.write_bandwidth;
}

double shared_bandwidth(const HardwarePreset& hw, std::size_t shards) {
  const double shard_total =
      static_cast<double>(std::max<std::size_t>(shards, 1)) * hw.shared.shard_bandwidth;
  return std::min(hw.shared.nic_bandwidth, shard_total);
}

double ttft_seconds(const HardwarePreset& hw, double reload_s, double prefill_s) {
  return hw.t0 + reload_s + prefill_s;
}

}  // namespace radixtier::sim
