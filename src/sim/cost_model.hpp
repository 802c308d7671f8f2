// The cost model as data: model geometry presets, hardware presets and the three formulas
// of /work/shared/reference/workloads.md.
//
//   KV bytes per token = full layers x 2 (K,V) x KV heads x (head_dim x KV element bytes
//                        + KV scale bytes per head)
//   snapshot bytes     = GDN layers x (Hv x Dk x Dv x recurrent element bytes
//                        + (2 Hk Dk + Hv Dv) x (kernel - 1) x conv element bytes)
//                        + extra per-slot state bytes
//   prefill T_pf(L0,L1) = a (L1 - L0) + (b/2)(L1^2 - L0^2)
//   reload(n copies, B bytes) = n t_call + B / BW   (BW x 0.6 when both directions run)
//   disk read(n I/Os, B bytes) = n t_io + B / disk read BW   (the same with the write BW)
//   shared fetch(B bytes) = latency + B / min(NIC BW, shards x shard BW)   (the shared tier)
//   TTFT = t0 + reload + prefill of the tokens after the usable match
//
// A new model is a data file (bench/models/*.json, a Hugging Face config.json; see
// model_config.hpp) or a config.json given at run time; a new machine is a new row in the
// table of cost_model.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "radixtier/status.hpp"

namespace radixtier::sim {

struct ModelGeometry {
  std::string name;
  std::uint32_t full_layers;  ///< full-attention layers
  std::uint32_t gdn_layers;   ///< Gated DeltaNet layers
  std::uint32_t kv_heads;     ///< Hkv
  std::uint32_t head_dim;
  std::uint32_t kv_element_bytes;  ///< 2 for bf16, 1 for fp8
  std::uint32_t kv_scale_bytes;    ///< per token, per KV head, per K and V (fp8 scales)
  std::uint32_t key_heads;         ///< Hk
  std::uint32_t value_heads;       ///< Hv
  std::uint32_t key_dim;           ///< Dk
  std::uint32_t value_dim;         ///< Dv
  std::uint32_t conv_kernel;
  std::uint32_t recurrent_element_bytes;  ///< fp32: 4
  std::uint32_t conv_element_bytes;       ///< bf16: 2
  std::uint64_t extra_state_bytes;        ///< any extra per-slot state
  std::uint64_t weight_bytes;             ///< resident weights on one GPU (the KV budget rule)
  // Where the numbers came from (printing only; model_config.hpp).
  std::string origin;                                 ///< "preset" or the config.json path
  std::string description;                            ///< radixtier.description
  std::string kv_dtype, recurrent_dtype, conv_dtype;  ///< element type names
  std::string weight_source;                          ///< how weight_bytes was found

  std::uint64_t kv_bytes_per_token() const;
  std::uint64_t snapshot_bytes() const;
  /// The same two counts in 128 bits: what a config that does not fit 64 bits would give
  /// (parse_model_config bounds them; the narrow ones are these, narrowed).
  unsigned __int128 kv_bytes_per_token_wide() const;
  unsigned __int128 snapshot_bytes_wide() const;
  /// Bytes of one page of `page_size` tokens.
  std::uint64_t page_bytes(std::uint32_t page_size) const {
    return kv_bytes_per_token() * page_size;
  }
};

/// The NVMe drive of a hardware preset: the store tier below host (radixtier sim --disk-gib).
/// Sequential bandwidths from the drive's spec sheet; t_io is charged once per record (a KV
/// page or a snapshot) as if records were read one after another (cost_model.cpp: sources).
struct DiskPreset {
  std::string_view drive;  ///< the drive the numbers are from
  double read_bandwidth;   ///< bytes per second, sequential read
  double write_bandwidth;  ///< bytes per second, sequential write
  double t_io;             ///< seconds per I/O (one record)
};

/// The shared tier a fleet of these machines reads (radixtier sim --shared-gib): a Redis
/// Cluster of `shards` shards reached over the machine's NIC. One reader fetches the pages of
/// one boundary from all shards at once, so it gets min(NIC, shards x shard bandwidth); other
/// readers' contention is not modelled (cost_model.cpp: sources).
struct SharedTierPreset {
  std::string_view link;   ///< the NIC the numbers are from
  double nic_bandwidth;    ///< bytes per second one reader's NIC receives
  double shard_bandwidth;  ///< bytes per second one shard serves (GET of MiB values)
  double latency_s;        ///< one round trip (a pipelined probe or a fetch)
};

struct HardwarePreset {
  std::string_view name;
  double a;                  ///< prefill seconds per token
  double b;                  ///< prefill seconds per token^2
  double bandwidth;          ///< bytes per second, pinned, one direction
  double t_call;             ///< seconds per copy call
  double t0;                 ///< fixed seconds per request
  double concurrent_factor;  ///< share of bandwidth per direction when both run
  double hbm_bytes;          ///< GPU memory of one instance
  double runtime_reserve;    ///< share of it for activations, CUDA graphs and the runtime
  DiskPreset disk;           ///< the NVMe row
  SharedTierPreset shared;   ///< the shared tier row
};

/// The model presets: bench/models/*.json, embedded at build time, in file name order.
std::span<const ModelGeometry> model_presets();
std::span<const HardwarePreset> hardware_presets();
/// kNotFound naming the known presets when `name` is unknown (resolve_model() in
/// model_config.hpp also takes a config.json path).
Result<ModelGeometry> find_model(std::string_view name);
Result<HardwarePreset> find_hardware(std::string_view name);

/// GPU bytes one instance has for KV pages and GPU snapshot slots:
/// hbm_bytes x (1 - runtime_reserve) - weight_bytes. kFailedPrecondition naming the numbers
/// when the weights do not fit or are unknown (weight_bytes 0).
Result<std::uint64_t> gpu_cache_bytes(const HardwarePreset& hw, const ModelGeometry& model);

/// Seconds to prefill tokens [l0, l1) given the l0 tokens before them are cached.
double prefill_seconds(const HardwarePreset& hw, double l0, double l1);
/// Seconds to move `bytes` in `copies` calls; `concurrent`: the other direction runs too.
double reload_seconds(const HardwarePreset& hw, std::uint64_t copies, std::uint64_t bytes,
                      bool concurrent = false);
/// Seconds to read `bytes` in `ios` records from the preset's NVMe drive.
double disk_read_seconds(const HardwarePreset& hw, std::uint64_t ios, std::uint64_t bytes);
/// Seconds to write `bytes` in `ios` records to it.
double disk_write_seconds(const HardwarePreset& hw, std::uint64_t ios, std::uint64_t bytes);
/// Bytes per second one reader gets from a shared tier of `shards` shards (at least 1).
double shared_bandwidth(const HardwarePreset& hw, std::size_t shards);
/// Time to first token: t0 + reload + prefill.
double ttft_seconds(const HardwarePreset& hw, double reload_s, double prefill_s);

}  // namespace radixtier::sim
