// The simulator: drives the reference Scheduler over a Scenario with a CostExecutor instead
// of compute and a CountingTransferEngine instead of memory, so million-token scenarios run
// in seconds. One call = one scenario x one cache kind x one model x one hardware preset.
//
// Caches (the same bytes for all, from the scenario's Budget and the model preset):
//   node            PrefixCache (node residency), snapshot placement from the policy
//   attention-only  the node cache's attention-only twin (AttentionOnlyCache): snapshots cost
//                   nothing, every page boundary resumable, their bytes given to KV; the
//                   hybrid tax is hit(node) / hit(attention-only)
//   sglang-like     SGLang's hybrid radix cache (docs/sglang-like.md), SGLang's chunk size
//                   counted from the resume point, its no_buffer or extra_buffer state
//                   placement. HiCache off (SGLang's default, or no host bytes):
//                   SglangLikeCache, split pools (a KV pool and a state pool of
//                   mamba_full_memory_ratio, each its own LRU, coupled leaf eviction, path
//                   refresh, live slots per strategy). HiCache on: PrefixCache configured as
//                   SGLang (write-through, its host bytes split as its two host pools are)
//   sglang-unified  SglangLikeCache with SGLang's one-buffer opt-in (--enable-unified-memory):
//                   the same bytes as one budget, each kind evicting its own LRU first
//   vllm-like       VllmLikeCache (docs/vllm-like.md): vLLM's hybrid prefix caching, one GPU
//                   pool of blocks for KV and states, its block size (the state's bytes per
//                   layer), states at block-aligned chunk ends, LRU; with vllm_offload its
//                   CPU offloading tier in the host bytes
//   index           IndexTierCache with its host tier (the baseline; end-only unless told)
//   gpu-only        IndexTierCache without a host tier (the engine before either design)
//   ideal           trace only, reference: BlockLruIdeal with the same total bytes (GPU KV +
//                   GPU snapshot slots + host KV + host snapshot slots, x instances), no
//                   snapshots needed, strictly in order, no time
//   oracle          trace only, headroom: a hybrid cache that knows the future (oracle_cache.hpp)
//                   with the same total bytes as the ideal, paying snapshot bytes, strictly in
//                   order, no time; oracle_bound_ratio: the same with free snapshots (a bound)
//
// Cluster (traces): `instances` modeled GPUs, each with its own scheduler, cache, executor
// and the scenario's budgets, behind a Router; the instances run in time order (the one whose
// next step is earliest first), each request is routed when it arrives. Default for a trace:
// the smallest N whose modeled utilization (prefill of every prompt without reuse + decode,
// over N x the trace's span) is <= 0.7; other scenarios: 1.
//
// Per request:
//   reload_s = n_copies_h2d t_call + bytes_h2d / BW     (the admission's CacheStats deltas)
//   TTFT     = t0 + reload_s + prefill_s                (one request at a time)
//            = t0 + reload_s + (first token - arrival)  (include_queue: agent, trace)
//   floor_s  = t0 + (reusable KV bytes + one snapshot) / BW + prefill of the rest
//
// The disk tier (disk_bytes > 0, node cache): the cache gets a CountingStoreEngine of that
// many bytes; an admission's store reads are charged before the PCIe reload and its store
// waits on the virtual clock:
//   disk_s   = store_reads t_io + bytes_from_store / disk read BW   (the admission's deltas)
//   TTFT     = t0 + disk_s + reload_s + prefill_s
//   disk_floor_s = t0 + (reusable KV bytes + one snapshot) / disk read BW + prefill of the rest
// A scenario with a restart (restart_before) persists each cache, destroys it and creates a
// new one on the same store; simulate() then also runs the scenario without the restart and
// reports both (SimResult::restart).
//
// The shared tier (shared_bytes > 0, node cache): one SharedTierModel for all instances
// (shared_tier_model.hpp); an admission's wait for it is charged before the disk read:
//   shared_s = latency (probe) [+ latency + fetched bytes / shared_bandwidth() (fetch)]
//   TTFT     = t0 + shared_s + disk_s + reload_s + prefill_s
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/config.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "sim/cost_model.hpp"
#include "sim/miss_breakdown.hpp"
#include "sim/model_config.hpp"
#include "sim/router.hpp"
#include "sim/scenarios.hpp"
#include "sim/shared_tier_model.hpp"

namespace radixtier::sim {

enum class CacheKind {
  kNode,
  kIndex,
  kGpuOnly,
  kIdeal,
  kAttentionOnly,
  kSglangLike,
  kSglangUnified,
  kVllmLike,
  kOracle
};

const char* to_string(CacheKind kind);
/// "node" | "index" | "gpu-only" | "ideal" | "attention-only" | "sglang-like" |
/// "sglang-unified" | "vllm-like" | "oracle"
Result<CacheKind> parse_cache_kind(std::string_view text);
/// Every name parse_cache_kind accepts, " | " between them (sim --help lists them all).
inline constexpr const char* kCacheKindNames =
    "node | attention-only | sglang-like | sglang-unified | vllm-like | index | gpu-only | ideal | "
    "oracle";

/// SGLang's options the sglang-like cache runs with (docs/sglang-like.md cites each default).
struct SglangOptions {
  /// --mamba-scheduler-strategy: false = no_buffer (what "auto" resolves to), true =
  /// extra_buffer (branch-point and decode tracking).
  bool extra_buffer = false;
  /// --mamba-full-memory-ratio: the GPU state pool gets rest x r / (1 + r) of the cache bytes
  /// (applied when the GPU budget is derived from the presets, as SGLang derives its own).
  double mamba_full_memory_ratio = 0.9;
  /// --chunked-prefill-size; 0: SGLang's default for the preset's GPU memory.
  std::size_t chunk_tokens = 0;
  /// --enable-hierarchical-cache with the scenario's host bytes; false: HiCache off (SGLang's
  /// default), no host tier whatever the budget.
  bool hicache = true;
};

/// SGLang's default --chunked-prefill-size for a GPU of `hbm_bytes` (server_args.py,
/// _handle_gpu_memory_settings): 2048 under 35 GiB, 4096 under 60, 8192 under 160, else 16384.
std::size_t sglang_chunk_tokens(double hbm_bytes);
/// The state slots one running request holds in SGLang (HybridReqToTokenPool.alloc, memory
/// pool): its active slot, and with extra_buffer the ping-pong track buffers, 2 with the
/// overlap schedule (on by default; no_buffer turns it off, server_args.py,
/// _handle_mamba_radix_cache).
std::uint32_t sglang_live_slots_per_request(bool extra_buffer);

/// The target of the default instance count: modeled utilization at most this.
inline constexpr double kTargetUtilization = 0.7;
/// A trace replay whose clock ends later than this x the trace's span overran it
/// (SimResult::overrun; the CLI says so on stderr).
inline constexpr double kMaxClockOverrun = 1.1;

/// The CacheConfig cache `kind` runs with, from the scenario's `base` (the same bytes).
CacheConfig config_for(CacheKind kind, const CacheConfig& base);

/// Modeled seconds one GPU is busy for the trace with no reuse: every prompt's prefill plus
/// its decode tokens at decode_step_s / max_running each.
double offered_busy_seconds(const Scenario& s, const HardwarePreset& hw, double decode_step_s);
/// The trace's span: last arrival - first arrival (seconds).
double trace_span_seconds(const Scenario& s);
/// The smallest N with offered_busy_seconds / (N x span) <= target (1 for a span of 0).
std::size_t default_instances(const Scenario& s, const HardwarePreset& hw, double decode_step_s,
                              double target = kTargetUtilization);

struct SimOptions {
  CacheKind cache = CacheKind::kNode;
  std::string model = "qwen3-next-80b";  ///< a preset name or a config.json path
  ModelDtypes dtypes;                    ///< element type overrides (model_config.hpp)
  std::string hardware = "consumer-gen4";
  /// Snapshot placement, what SnapshotPolicy::parse accepts ("BASE[+tail][+branch]"); empty:
  /// kDefaultPolicy for node, end-only for index and gpu-only.
  std::string policy;
  SnapshotEviction eviction = SnapshotEviction::kCostAware;
  WritePolicy write_policy = WritePolicy::kWriteBack;
  std::uint32_t load_back_min_tokens = 0;    ///< CacheConfig::load_back_min_tokens
  std::uint32_t max_snapshots_per_path = 0;  ///< CacheConfig::max_snapshots_per_path
  /// CacheConfig::gpu_free_low_watermark / gpu_free_high_watermark (node cache).
  double gpu_free_low_watermark = CacheConfig{}.gpu_free_low_watermark;
  double gpu_free_high_watermark = CacheConfig{}.gpu_free_high_watermark;
  double decode_step_s = 0.025;
  /// The store tier below host, in bytes (radixtier sim --disk-gib); 0: none. Only the node
  /// cache gets it (a CountingStoreEngine that outlives the caches).
  std::uint64_t disk_bytes = 0;
  /// The shared tier's content budget in bytes (radixtier sim --shared-gib); 0: none. Only the
  /// node cache gets it (sglang-like and vllm-like have no shared tier in the simulator), and
  /// with it the node cache runs write-through: the tier publishes from host copies.
  std::uint64_t shared_bytes = 0;
  /// Shards of the shared tier (a reader's bandwidth: shared_bandwidth()); 0: one per instance.
  std::size_t shared_shards = 0;
  /// Trace, N > 1: instance 0 restarts empty (a new process, GPU and host empty; the shared
  /// tier and the router's view of it reset) at its first idle moment at or after the
  /// trace's midpoint request; SimResult::fresh compares its next requests with the others'.
  bool fresh_instance = false;
  /// Honour the scenario's restart (false: run it straight through, the comparison run).
  bool restart = true;
  /// Modeled GPUs behind the router; 0: traces default_instances(), other scenarios 1.
  std::size_t instances = 0;
  RouterKind router = RouterKind::kPrefix;
  /// Prompt tokens one forward runs (SchedulerConfig::forward_tokens: the engine's
  /// chunked-prefill size; states inside a forward are captured) for every cache but
  /// sglang-like and vllm-like, which run their engines' own. 0: the engine's default on the
  /// GPU, sglang_chunk_tokens() (vLLM's default is the same on a >= 70 GiB GPU), floored to
  /// a multiple of the scenario's chunk, at least one chunk. A value given must be a multiple
  /// of the chunk (simulate() refuses another).
  std::size_t forward_tokens = 0;
  SglangOptions sglang;  ///< the sglang-like cache's options
  /// vllm-like: --max-num-batched-tokens; 0: vLLM's default for the GPU (8192 at >= 70 GiB,
  /// else 2048), floored to the block size (_mamba_block_aligned_split).
  std::size_t vllm_chunk_tokens = 0;
  /// vllm-like: the CPU offloading tier (OffloadingConnector, native CPU backend, LRU) with
  /// the scenario's host bytes; off by default, as in vLLM.
  bool vllm_offload = false;
  bool check_invariants = false;  ///< the cache's invariants after every scheduler step
  std::function<void(const sched::Progress&)> progress;
  /// Observers (radixtier sim --metrics-port): called with each instance's PrefixCache as it
  /// is created (node and sglang-like caches), then after every scheduler step and once
  /// when the run ends, while the caches still exist.
  std::function<void(PrefixCache& cache, std::size_t instance)> on_cache;
  std::function<void()> on_step;
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
  std::uint64_t bytes_h2d = 0, copies_h2d = 0;          ///< at admission
  std::size_t store_cached_tokens = 0;                  ///< of cached_tokens, loaded from the store
  std::uint64_t store_reads = 0, bytes_from_store = 0;  ///< at admission
  std::size_t shared_tokens = 0;   ///< the boundary the shared tier's fetch brought (0: none)
  std::uint64_t shared_bytes = 0;  ///< bytes it fetched
  double shared_s = 0;             ///< the admission's wait for the shared tier (probe + fetch)
  double disk_s = 0;               ///< disk_read_seconds() of the admission's store reads
  double disk_floor_s = 0;         ///< the floor with every reusable byte read from the disk
  double reload_s = 0, prefill_s = 0, queue_s = 0, ttft_s = 0, floor_s = 0;
  std::uint32_t snapshots_kept = 0;
  std::uint32_t preemptions = 0;
};

/// The restart's goal (issue 13): the first request after the restart against the same
/// request in the run without it.
struct RestartReport {
  bool ran = false;  ///< the scenario restarted (its other fields are set)
  std::string request;
  std::size_t cached_tokens = 0;             ///< after the restart
  std::size_t cached_tokens_no_restart = 0;  ///< the same request, no restart
  double reuse_ratio = 0;                    ///< cached_tokens / cached_tokens_no_restart
  double ttft_s = 0, ttft_s_no_restart = 0;
  double disk_floor_s = 0;
  double ttft_ratio = 0;  ///< ttft_s / disk_floor_s
  std::uint64_t bytes_from_store = 0, store_reads = 0;
  std::uint64_t persist_bytes = 0, persist_writes = 0;  ///< what persist() wrote at shutdown
  double persist_s = 0;  ///< disk_write_seconds() of it (shutdown time, not on any TTFT)
};

/// The shared tier over the run (SimOptions::shared_bytes).
struct SharedReport {
  std::uint64_t capacity_bytes = 0;  ///< 0: no shared tier
  std::size_t shards = 0;
  double bandwidth = 0, latency_s = 0;  ///< the cost row, as applied
  SharedTierCounters counters;
};

/// The fresh instance's goal (SimOptions::fresh_instance): the first kFreshRequests requests
/// instance 0 serves after its restart against (a) the requests the warm instances served
/// while those arrived (from the first's arrival to the last's) and (b) the same requests in
/// the run without the restart (simulate() runs it too), each a token-weighted hit ratio.
struct FreshReport {
  bool ran = false;
  std::size_t restart_request = 0;  ///< the trace request (1-based) before which it restarted
  double restart_s = 0;             ///< its arrival
  std::size_t fresh_requests = 0, warm_requests = 0;
  double fresh_hit_ratio = 0, warm_hit_ratio = 0;
  double ratio = 0;                ///< fresh / warm
  double same_warm_hit_ratio = 0;  ///< (b): the same requests, no restart
  double same_ratio = 0;           ///< fresh / same_warm
};
inline constexpr std::size_t kFreshRequests = 100;

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
  /// trace: infinite-cache ceiling, token-level (trace_token_ceiling(): every computed token
  /// of earlier requests, prompt and output)
  double ceiling_ratio = 0;
  double ceiling_blocks_ratio = 0;    ///< trace: the same from hash ids (infinite_cache_ceiling)
  std::string trace_construction;     ///< trace: "faithful" | "hash-only"
  std::size_t trace_with_parent = 0;  ///< trace, faithful: requests that continue an earlier one
  /// oracle: its run with free snapshots, MIN over pages (a true upper bound, oracle_cache.hpp)
  double oracle_bound_ratio = 0;
  /// oracle: every request's infinite-cache resume point, at page granularity
  double oracle_page_ceiling_ratio = 0;
  /// oracle: OracleStats::pages_past_cap (0: the bound is exactly MIN's optimum)
  std::uint64_t oracle_pages_past_cap = 0;
  CacheConfig config;
  CacheStats stats;
  sched::SchedulerStats sched;
  std::size_t placement_alignment = 0;  ///< what the placement learner ended with (G, tokens)
  bool keep_finish = true;              ///< ... and whether it still kept finish snapshots
  /// Admissions (all instances) whose deepest recorded boundary was a prompt end, a tail, a
  /// chunk end, a finish, a branch point (PlacementLearner::credits, BoundaryKind order) ...
  std::array<std::uint64_t, sched::kBoundaryKinds> placement_credits{};
  /// ... and whether the last instance still kept prompt ends, tails, chunk ends at the end
  std::array<bool, 3> keep_kinds{true, true, true};
  MissBreakdown misses;  ///< where reuse was lost (miss_breakdown.hpp)
  /// What the cache's GPU page pool held, averaged over every 64th scheduler step of every
  /// instance (caches built on PrefixCache, the twin too; zero for the others): the share of its
  /// pages that are tree KV and the share that are cached snapshots (live slots, free pages and
  /// requests' own pages are the rest).
  double gpu_kv_share = 0, gpu_snapshot_share = 0;
  std::vector<RequestRow> rows;
  std::string status;  ///< empty: the run completed; else why the scheduler stopped
  // --- the cluster and TTFT percentiles (nearest rank, over the requests that finished) ---
  std::size_t instances = 1;
  std::string router;
  double utilization = 0;       ///< modeled: offered_busy_seconds / (instances x span)
  double busy_utilization = 0;  ///< executor seconds spent / (instances x span)
  double ttft_s_p50 = 0, ttft_s_p90 = 0, ttft_s_p99 = 0;
  /// Trace: (the replay's end - the first arrival) / the trace's span; overrun: > 1.1.
  double clock_span_ratio = 0;
  bool overrun = false;
  // --- the disk tier ---
  std::uint64_t disk_bytes = 0;     ///< the store's budget (0: this cache had none)
  std::uint64_t store_records = 0;  ///< records on the store at the end
  std::uint64_t store_syncs = 0;    ///< sync() calls it got
  RestartReport restart;
  SharedReport shared;
  FreshReport fresh;
};

/// Runs `scenario` once. Errors: unknown presets, a config the cache rejects, ideal on a
/// non-trace scenario. A broken scheduler run is reported in SimResult::status.
Result<SimResult> simulate(const Scenario& scenario, const SimOptions& options);

/// One JSON object (the fields of SimResult; `rows`: include per-request rows).
std::string to_json(const SimResult& r, bool rows = false);

}  // namespace radixtier::sim
