// The demo scenarios (churn, flush, compaction replay, agent side requests, restart) scaled down to
// the tiny model, and the runner that plays a workload through the Scheduler twice: with the
// node-residency PrefixCache and with the no-reuse baseline, then compares every request's
// output tokens and final logits bit for bit. Library code, so tests run the same scenarios
// the `radixtier demo` command prints.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/tiny_model.hpp"
#include "radixtier/config.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier::demo {

/// A workload: a model, a cache geometry, a scheduler config and requests.
struct Workload {
  std::string name;
  std::string description;
  model::TinyModelConfig model;
  /// page_size, pools and write policy; page_bytes and snapshot_bytes come from the model.
  CacheConfig cache;
  sched::SchedulerConfig sched;
  std::vector<sched::Request> requests;
  std::vector<std::string> labels;  ///< one per request, for the table
  /// Fault injection: these submissions (counted from the start of the run, 0-based) to the
  /// transfer engine fail (their copy is poisoned and reported failed).
  std::vector<std::uint64_t> failing_submissions;
  HostTransferEngine::Mode engine_mode = HostTransferEngine::Mode::kThreaded;
  /// 0: one process. Else the cache run restarts before requests[restart_before]: it calls
  /// persist(), destroys the cache, its disk store, the engine and the memory (a graceful
  /// shutdown and a new process), reopens the store on the same directory (a temporary one
  /// the run makes and removes) and plays the rest on a cache rebuilt from it. Failing
  /// submissions apply to the first process.
  std::size_t restart_before = 0;
  /// 0: one process. Else the cache run is two processes on one Redis Cluster (shared_run.hpp):
  /// requests before shared_before in the first, which publishes to the shared tier, the rest
  /// in a second one with an empty cache, which resumes from it.
  std::size_t shared_before = 0;
  /// The cluster ("host:port" of its nodes); empty: the run starts a LocalCluster of its own.
  std::vector<std::string> shared_seeds;
};

/// The shared scenario (Workload::shared_before): what the first process published and the
/// second fetched and entered into its cache.
struct SharedSummary {
  bool ran = false;
  std::uint64_t published_keys = 0, published_bytes = 0;
  std::uint64_t fetches = 0, imports = 0, imported_tokens = 0, bytes_fetched = 0;
  std::uint64_t values_rejected = 0;
};

/// One run of a workload through the scheduler.
struct RunOutcome {
  Status status;  ///< the scheduler's own status (an invariant broken, a bad config)
  std::map<sched::RequestId, sched::RequestResult> results;
  CacheStats cache;  ///< with a restart: of the cache after it
  sched::SchedulerStats sched;
  double wall_s = 0;
  bool restarted = false;     ///< the restart happened (Workload::restart_before)
  CacheStats before_restart;  ///< the first cache's, after its persist()
  SharedSummary shared;       ///< the shared scenario's two processes
};

using ProgressFn = std::function<void(const std::string& phase, const sched::Progress&)>;

/// Runs with the PrefixCache (`reuse`) or the no-reuse baseline. The model must be built from
/// w.model.
RunOutcome run_workload(const Workload& w, const model::TinyHybridModel& model, bool reuse,
                        const ProgressFn& progress = {});

/// The request computed from scratch directly on the model (no scheduler, no cache, one
/// forward() over the prompt, then token-by-token decode): the reference every reuse run must
/// match bit for bit. Fills output, first_logits and final_logits (status on bad input).
sched::RequestResult reference_run(const model::TinyHybridModel& model,
                                   const sched::Request& request);

/// Output tokens, first logits and final logits all bit-identical (and both ok).
bool same_answer(const sched::RequestResult& a, const sched::RequestResult& b);

struct Row {
  std::string label;
  sched::RequestId id = 0;
  std::size_t prompt_tokens = 0, output_tokens = 0;
  std::size_t cached_tokens = 0;       ///< with the cache, at admission
  std::size_t host_cached_tokens = 0;  ///< of which promoted from host
  std::size_t shared_tokens = 0;       ///< the boundary a shared-tier fetch reached (0: none)
  std::size_t recomputed_tokens = 0;   ///< with the cache: prompt tokens prefilled
  std::size_t baseline_recomputed = 0;
  std::uint64_t bytes_promoted = 0, bytes_demoted = 0;
  std::uint32_t snapshots_kept = 0;
  bool identical = false;  ///< output tokens and final logits equal to the baseline's
  std::string error;       ///< a failed request (either run)
};

struct ScenarioReport {
  std::string name, description, policy;
  std::vector<Row> rows;
  Row total;
  CacheStats cache;
  sched::SchedulerStats sched;
  double cache_wall_s = 0, baseline_wall_s = 0;
  std::size_t snapshot_bytes = 0, page_bytes = 0;
  bool all_identical = false;
  Status status;
  bool restarted = false;     ///< a restart scenario: `cache` is of the cache after it
  CacheStats before_restart;  ///< the cache before the restart, after its persist()
  SharedSummary shared;       ///< the shared scenario's two processes
};

/// Runs `w` with the cache and without reuse and compares them.
ScenarioReport run_scenario(const Workload& w, const ProgressFn& progress = {});

/// Names of the built-in scenarios, in the order the demo plays them.
std::vector<std::string> scenario_names();
/// Scenarios the demo plays only when asked (--scenario): "shared" needs redis-server.
std::vector<std::string> optional_scenario_names();
/// A built-in scenario with the given snapshot policy. kNotFound naming the known ones.
Result<Workload> make_scenario(const std::string& name, const sched::SnapshotPolicy& policy);

/// Human-readable table and JSON of reports.
std::string format_table(const ScenarioReport& report);
std::string format_json(const std::vector<ScenarioReport>& reports);

}  // namespace radixtier::demo
