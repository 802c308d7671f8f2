// The simulator's workloads at full scale (workloads.md): the seed's three scenarios, the
// agent harness, the compaction replay built turn by turn, and Mooncake trace replay.
//
// A Scenario is budgets + scheduler geometry + requests; the budgets are model-independent
// (tokens, slots, bytes) and become one CacheConfig per model (cache_config()), the same for
// every cache kind. Token ids are synthesized deterministically; a turn that continues a
// conversation contains the output the CostExecutor will generate for the previous turn
// (CostExecutor::continuation), so the finish boundary of turn 1 is a real prefix of turn 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "radixtier/config.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "sim/cost_model.hpp"
#include "sim/trace.hpp"
#include "sim/trace_replay.hpp"

namespace radixtier::sim {

inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
/// A GPU KV pool per instance, at most (tokens): far above any GPU's (simulate() refuses more).
inline constexpr std::size_t kMaxGpuKvTokens = std::size_t{1} << 31;
/// The GPU KV pools of all instances together, at most (tokens): about 4.5 GB of this
/// simulator's page bookkeeping.
inline constexpr std::size_t kMaxClusterGpuKvTokens = std::size_t{1} << 34;
/// Modeled instances, at most (sim --instances; the default is clamped to it).
inline constexpr std::size_t kMaxInstances = 1024;
/// A budget in GiB (host, disk, shared tier), at most: 64 TiB, more than any server has.
inline constexpr double kMaxBudgetGib = 65536;

/// Memory budgets, the same for every cache of one run.
struct Budget {
  /// GPU KV pool; 0: derived from the hardware and model presets (what HBM holds beside the
  /// weights, the runtime reserve and the GPU snapshot slots; the trace's default).
  std::size_t gpu_kv_tokens = 32'768;
  std::uint32_t gpu_snapshot_slots = 4;
  std::uint64_t host_kv_tokens = 0;         ///< when > 0: host KV in tokens ...
  std::uint64_t host_kv_bytes = 16 * kGiB;  ///< ... else in bytes (seed default: 16 GiB)
  std::uint64_t host_snapshot_bytes = 0;    ///< when > 0: host snapshots in bytes ...
  std::uint32_t host_snapshot_slots = 32;   ///< ... else in slots (seed default: 32)
};

/// The scheduler's GPU snapshot pool: 4 max_running + max(1, max_running) + 1 (index-tier.md,
/// with ratio 1).
std::uint32_t gpu_snapshot_slots_for(std::size_t max_running);
/// The live slots a PrefixCache needs for max_running requests (it keeps cached snapshots in
/// GPU pages): each request's resumed state and one it materializes, + 1.
std::uint32_t live_slots_for(std::size_t max_running);

/// The CacheConfig `budget` means for `model` (page_bytes and snapshot_bytes from the preset).
CacheConfig cache_config(const Budget& budget, const ModelGeometry& model, std::uint32_t page_size);

struct ScenarioRequest {
  sched::Request request;
  std::string label;
  /// Longest prefix this prompt shares with an earlier request's prompt + output, on all but
  /// its last token, floored to a page: what a perfect cache could reuse (the physical floor).
  std::size_t reusable_tokens = 0;
};

struct Scenario {
  std::string name;
  std::string description;
  std::uint32_t page_size = 64;
  std::size_t chunk_tokens = 2048;
  std::size_t max_running = 1;
  Budget budget;
  /// TTFT includes queueing and interleaving (first token - arrival); else it is the
  /// request's own prefill (the seed scenarios run one request at a time).
  bool include_queue = false;
  std::vector<ScenarioRequest> requests;
  /// Trace scenarios: the trace; requests are synthesized from it lazily (trace_request(),
  /// TracePrompts).
  std::vector<TraceRequest> trace;
  /// The token-faithful construction's parents (sim/trace_replay.hpp); null: hash-only prompts.
  std::shared_ptr<const TraceParents> trace_parents;
  /// Per trace request: what an infinite cache of every computed token could reuse
  /// (token_reuse()), floored to a page in the rows' reusable_tokens.
  std::vector<std::uint64_t> trace_reusable;
  /// A process restart before request `restart_before` (not for traces): every request
  /// before it finishes, then each cache is persisted (PrefixCache::persist() where it has
  /// a store), destroyed, and created anew with empty GPU and host on the same store.
  std::optional<std::size_t> restart_before;
  bool is_trace() const { return !trace.empty(); }
  std::size_t size() const { return is_trace() ? trace.size() : requests.size(); }
};

/// Request `i` of a trace scenario: its prompt (faithful or hash-only, as the scenario was
/// built), output_length, arrival = timestamp. Rebuilds ancestors each call: a run uses
/// TracePrompts, this is for tests and single requests.
sched::Request trace_request(const Scenario& s, std::size_t i);
/// The same with the prompt given (from a TracePrompts of the scenario).
sched::Request trace_request(const Scenario& s, std::size_t i, std::vector<Token> prompt);
/// Token-level infinite-cache ceiling of a trace scenario: sum(trace_reusable) / input tokens.
HitCeiling trace_token_ceiling(const Scenario& s);

/// Parameters of the built-in scenarios (defaults: workloads.md, or this project's
/// assumptions where it is silent; docs/simulator.md lists them).
struct ScenarioOptions {
  // compaction
  std::uint64_t compaction_host_snapshot_bytes = 0;  ///< > 0: host snapshots in bytes
  // trace
  std::string trace_path = "../shared/traces/mooncake_synthetic_trace.jsonl";
  std::uint64_t trace_host_bytes = 16 * kGiB;  ///< whole host budget, KV + snapshots
  double trace_snapshot_share = 0.125;         ///< of it for snapshots
  std::size_t trace_limit = 0;                 ///< > 0: only the first N requests
  std::size_t trace_max_running = 8;
  std::size_t trace_gpu_kv_tokens = 0;  ///< per instance; 0: from the presets
  /// Prompts from hash ids alone (a follow-up turn without the previous turn's tail and
  /// output: the construction before the faithful replay, for comparison).
  bool trace_hash_only = false;
  // agent
  /// Retention priority of the side requests (the sends run at kDefaultPriority, 35): lower
  /// than the conversation's by default; 35 orders them as the conversation (no priorities).
  RetentionPriority agent_side_priority = 10;
  // every scenario but the trace (whose budget is trace_host_bytes)
  /// When set: the whole host budget in bytes, KV + snapshots, split as the trace's is
  /// (trace_snapshot_share of it for snapshots), instead of the scenario's own.
  std::optional<std::uint64_t> host_bytes;
};

/// churn | flush | restart | compaction | compaction-turns | agent | trace | admission-128k
std::vector<std::string> scenario_names();
/// kNotFound naming the known scenarios; trace: kNotFound when the file is missing.
/// `model` sizes the trace's host snapshot slots (its budget is in bytes).
Result<Scenario> make_scenario(const std::string& name, const ModelGeometry& model,
                               const ScenarioOptions& options = {});

/// Scenario for already-parsed trace requests (tests, subsampling).
Scenario trace_scenario(std::vector<TraceRequest> trace, const ModelGeometry& model,
                        const ScenarioOptions& options);

/// n deterministic tokens of stream `seed` (distinct seeds give distinct sequences).
std::vector<Token> synth_tokens(std::uint64_t seed, std::size_t n);

/// Fills every request's reusable_tokens (longest common prefix with earlier prompt +
/// output sequences, as CostExecutor will generate them).
void compute_reusable(Scenario& s);

}  // namespace radixtier::sim
