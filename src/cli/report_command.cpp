// `radixtier report`: every scenario x every cache, the trace at three host budgets, the
// snapshot policy comparison; markdown + SVG plots into a folder (docs/simulator.md).
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "sim/progress.hpp"
#include "sim/report.hpp"

namespace {

int run_report(radixtier::sim::ReportOptions& o);

radixtier::cli::CommandRun setup_report(CLI::App& app) {
  auto o = std::make_shared<radixtier::sim::ReportOptions>();
  app.add_option("--out", o->out_dir, "output folder")->capture_default_str();
  app.add_option("--trace", o->trace_path, "a Mooncake JSONL trace")
      ->capture_default_str()
      ->each([o](const std::string&) { o->trace_required = true; });
  app.add_option("--trace-limit", o->trace_limit,
                 "only the first N trace requests (the report says so)")
      ->check(radixtier::cli::count_at_least(0));
  app.add_option("--model", o->model,
                 "a model preset or the path of a Hugging Face config.json (docs/simulator.md)")
      ->capture_default_str();
  app.add_option("--disk-gib", o->disk_gib,
                 "the disk tier's runs (restart, a flush into disk) with this store size; 0: "
                 "skip them")
      ->capture_default_str()
      ->check(radixtier::cli::non_negative());
  app.add_option("--jobs", o->jobs,
                 "runs at once, on as many threads (0: one per hardware thread); the results do "
                 "not depend on it")
      ->capture_default_str()
      ->check(radixtier::cli::count_at_least(0));
  app.add_flag_callback(
      "--no-policies", [o] { o->policies = false; }, "skip the snapshot policy comparison");
  app.footer("Writes DIR/results.md, DIR/*.svg and DIR/runs.jsonl; progress on stderr.");
  return [o] { return run_report(*o); };
}

int run_report(radixtier::sim::ReportOptions& o) {
  radixtier::sim::ProgressMeter meter(stderr,
                                      radixtier::sim::ProgressMeter::stream_is_terminal(stderr));
  o.log = [&](const std::string& line) { meter.note(line); };
  o.progress = [&](const std::string& phase, std::size_t done, std::size_t total) {
    if (done == 0) {
      meter.phase("report: " + phase, total, "runs");
    } else {
      meter.update(done);
    }
  };
  const auto status = radixtier::sim::write_report(o);
  meter.finish();
  if (auto s = status; !s) {
    std::fprintf(stderr, "radixtier report: %s\n", s.message().c_str());
    // A trace or an option that is wrong is the caller's input (exit 2, as a bad option).
    const bool input = s.code() == radixtier::ErrorCode::kInvalidArgument ||
                       s.code() == radixtier::ErrorCode::kNotFound;
    return input ? 2 : 1;
  }
  std::fprintf(stderr, "wrote %s/results.md\n", o.out_dir.c_str());
  return 0;
}

const radixtier::cli::CommandRegistrar kReport{
    "report", "run every simulator scenario and write tables and plots", &setup_report};

}  // namespace
