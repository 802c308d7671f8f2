// The simulator: drives the reference Scheduler over a Scenario with a CostExecutor instead
// of compute and a CountingTransferEngine instead of memory, so million-token scenarios run
// in seconds. One call = one scenario x one cache kind x one model x one hardware preset.
//
// Caches (the same CacheConfig for all, from the scenario's Budget and the model preset):
//   node      PrefixCache (node residency), snapshot placement from the policy
//   index     IndexTierCache with its host tier (the baseline; end-only unless told)
//   gpu-only  IndexTierCache without a host tier (the engine before either design)
//   ideal     trace only, reference: BlockLruIdeal with the same total bytes (GPU KV + GPU
//             snapshot slots + host KV + host snapshot slots), no snapshots needed
//
// Per request:
//   reload_s = n_copies_h2d t_call + bytes_h2d / BW     (the admission's CacheStats deltas)
//   TTFT     = t0 + reload_s + prefill_s                (one request at a time)
//            = t0 + reload_s + (first token - arrival)  (include_queue: agent, trace)
//   floor_s  = t0 + (reusable KV bytes + one snapshot) / BW + prefill of the rest
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/config.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "sim/cost_model.hpp"
#include "sim/scenarios.hpp"

namespace radixtier::sim {

enum class CacheKind { kNode, kIndex, kGpuOnly, kIdeal };

const char* to_string(CacheKind kind);
/// "node" | "index" | "gpu-only" | "ideal"
Result<CacheKind> parse_cache_kind(std::string_view text);

struct SimOptions {
  CacheKind cache = CacheKind::kNode;
  std::string model = "qwen3-next-80b";
  std::string hardware = "consumer-gen4";
  /// Snapshot placement, what SnapshotPolicy::parse accepts ("BASE[+tail][+branch]"); empty:
  /// kDefaultPolicy for node, end-only for index and gpu-only.
  std::string policy;
  SnapshotEviction eviction = SnapshotEviction::kLru;
  WritePolicy write_policy = WritePolicy::kWriteBack;
  double decode_step_s = 0.025;
  bool check_invariants = false;  ///< the cache's invariants after every scheduler step
  std::function<void(const sched::Progress&)> progress;
};

/// The node cache's default placement policy: learned placement (snapshot_policy.hpp,
/// placement_learner.hpp, docs/snapshot-policies.md), one rule for every workload.
inline constexpr const char* kDefaultPolicy = "adaptive";

struct RequestRow {
  std::string label;
  sched::RequestId id = 0;
  bool ok = true;
  std::string error;
  std::size_t prompt_tokens = 0, output_tokens = 0;
  std::size_t cached_tokens = 0, gpu_cached_tokens = 0, host_cached_tokens = 0;
  std::size_t recomputed_tokens = 0;
  std::size_t reusable_tokens = 0;  ///< what a perfect cache could reuse (not for traces)
  std::uint64_t bytes_h2d = 0, copies_h2d = 0;  ///< at admission
  double reload_s = 0, prefill_s = 0, queue_s = 0, ttft_s = 0, floor_s = 0;
  std::uint32_t snapshots_kept = 0;
  std::uint32_t preemptions = 0;
};

struct SimResult {
  std::string scenario, cache, model, hardware, policy, eviction;
  std::size_t requests = 0, failed = 0;
  std::uint64_t input_tokens = 0, cached_tokens = 0, recomputed_tokens = 0;
  double hit_ratio = 0;
  double ttft_s_total = 0, ttft_s_last = 0, floor_s_last = 0;
  std::size_t cached_tokens_last = 0, recomputed_tokens_last = 0;
  std::uint64_t bytes_h2d = 0, bytes_d2h = 0, host_bytes_peak = 0;
  std::uint64_t snapshots_kept = 0;
  double sim_clock_s = 0;                ///< the scheduler's virtual clock at the end
  double wall_s = 0;                     ///< host seconds the simulation took
  std::uint64_t total_budget_bytes = 0;  ///< GPU KV + GPU slots + host KV + host slots
  double ceiling_ratio = 0;              ///< trace: infinite-cache ceiling (block granularity)
  CacheConfig config;
  CacheStats stats;
  sched::SchedulerStats sched;
  std::size_t placement_alignment = 0;  ///< what the placement learner ended with (G, tokens)
  bool keep_finish = true;              ///< ... and whether it still kept finish snapshots
  std::vector<RequestRow> rows;
  std::string status;  ///< empty: the run completed; else why the scheduler stopped
};

/// Runs `scenario` once. Errors: unknown presets, a config the cache rejects, ideal on a
/// non-trace scenario. A broken scheduler run is reported in SimResult::status.
Result<SimResult> simulate(const Scenario& scenario, const SimOptions& options);

/// One JSON object (the fields of SimResult; `rows`: include per-request rows).
std::string to_json(const SimResult& r, bool rows = false);

}  // namespace radixtier::sim
