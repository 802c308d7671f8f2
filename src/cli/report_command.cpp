// `radixtier report`: every scenario x every cache, the trace at three host budgets, the
// snapshot policy comparison; markdown + SVG plots into a folder (docs/simulator.md).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.hpp"
#include "sim/progress.hpp"
#include "sim/report.hpp"

namespace {

void help(std::FILE* out) {
  std::fprintf(out,
               "usage: radixtier report [--out DIR] [--trace FILE] [--trace-limit N]\n"
               "                        [--no-policies]\n"
               "  --out DIR         output folder (default: report)\n"
               "  --trace FILE      Mooncake JSONL (default ../shared/traces/"
               "mooncake_synthetic_trace.jsonl)\n"
               "  --trace-limit N   only the first N trace requests (the report says so)\n"
               "  --no-policies     skip the snapshot policy comparison\n"
               "Writes DIR/results.md, DIR/*.svg and DIR/runs.jsonl; progress on stderr.\n");
}

int run_report(int argc, char** argv) {
  radixtier::sim::ReportOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help(stdout);
      return 0;
    } else if (a == "--no-policies") {
      o.policies = false;
    } else if ((a == "--out" || a == "--trace" || a == "--trace-limit") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--out") {
        o.out_dir = v;
      } else if (a == "--trace") {
        o.trace_path = v;
      } else {
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
        if (end == v.c_str() || *end != '\0') {
          std::fprintf(stderr, "radixtier report: --trace-limit: '%s' is not a count\n", v.c_str());
          return 2;
        }
        o.trace_limit = static_cast<std::size_t>(n);
      }
    } else {
      std::fprintf(stderr, "radixtier report: unexpected argument '%s'\n", a.c_str());
      help(stderr);
      return 2;
    }
  }
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
    return 1;
  }
  std::fprintf(stderr, "wrote %s/results.md\n", o.out_dir.c_str());
  return 0;
}

const radixtier::cli::CommandRegistrar kReport{
    "report", "run every simulator scenario and write tables and plots", &run_report};

}  // namespace
