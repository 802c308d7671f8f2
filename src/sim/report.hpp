// The simulator report: every scenario x every cache, the trace at several host budgets with
// the hybrid-free ideal and the infinite-cache ceiling, the snapshot policy comparison, the
// goals of issue #5 checked, as markdown + SVG plots + JSON lines in one folder.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::sim {

struct ReportOptions {
  std::string out_dir = "report";
  std::string trace_path = "../shared/traces/mooncake_synthetic_trace.jsonl";
  /// The trace was asked for (--trace): one that cannot be read fails the report before any
  /// run; otherwise (the default path, absent) the report says "Trace not run".
  bool trace_required = false;
  std::size_t trace_limit = 0;  ///< > 0: only the first N trace requests (said in the report)
  std::vector<double> trace_host_gib = {0, 16, 64, 256};  ///< 0: no host tier
  std::string model = "qwen3-next-80b";
  std::string hardware = "consumer-gen4";    ///< the seed scenarios
  std::string trace_hardware = "h200-gen5";  ///< the trace (a server trace)
  bool policies = true;                      ///< run the policy comparison
  /// Runs at once (threads, this one included); 0: one per hardware thread. The results do not
  /// depend on it (each run is deterministic and independent), only the wall time.
  std::size_t jobs = 0;
  double disk_gib = 64;  ///< the disk tier's runs (restart, flush into disk); 0: skip them
  std::function<void(const std::string&)> log;  ///< one line per finished run
  /// Called when a phase starts (done = 0) and after each of its runs.
  std::function<void(const std::string& phase, std::size_t done, std::size_t total)> progress;
};

/// Runs everything and writes out_dir/results.md, out_dir/*.svg and out_dir/runs.jsonl.
Status write_report(const ReportOptions& options);

}  // namespace radixtier::sim
