// `radixtier demo [--json] [--scenario NAME] [--policy P]`: plays the scaled-down scenarios of
// workloads.md on the tiny model with the cache and with the no-reuse baseline and prints a
// table per scenario (docs/scheduler.md explains the columns). Exit status 1 when any
// request's output tokens or final logits differ from the no-reuse run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "demo/scenarios.hpp"

namespace {

using radixtier::demo::ScenarioReport;

constexpr const char* kDefaultPolicy = "budgeted";

/// Progress on stderr: a rewritten line on a terminal, a line every few seconds otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(isatty(fileno(stderr)) != 0) {}
  void operator()(const std::string& scenario, const std::string& phase,
                  const radixtier::sched::Progress& p) {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.2 : 5.0)) return;
    last_ = now;
    std::fprintf(stderr, "%s[%s/%s] %zu/%zu requests done, %zu running, %llu tokens forwarded%s",
                 tty_ ? "\r" : "", scenario.c_str(), phase.c_str(), p.finished + p.failed,
                 p.submitted, p.running, static_cast<unsigned long long>(p.forwarded_tokens),
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
    dirty_ = tty_;
  }
  void clear() {
    if (dirty_) std::fprintf(stderr, "\r%80s\r", "");
    dirty_ = false;
  }

 private:
  bool tty_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

struct DemoArgs {
  bool json = false;
  std::string policy_text = kDefaultPolicy;
  std::vector<std::string> names;
};

int run_demo(DemoArgs& args);

radixtier::cli::CommandRun setup_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  app.add_option("--scenario", args->names,
                 "churn | flush | compaction | agent | restart (repeatable; "
                 "default: all, in order) | shared (two processes on a Redis Cluster it "
                 "starts: needs redis-server; only when asked)")
      ->check(CLI::IsMember([] {
        auto names = radixtier::demo::scenario_names();
        for (auto& n : radixtier::demo::optional_scenario_names()) names.push_back(n);
        return names;
      }()));
  app.add_option("--policy", args->policy_text,
                 "snapshot placement: end-only | every-chunk | interval:N | budgeted[:BYTES], "
                 "each optionally +tail and/or +branch")
      ->capture_default_str()
      ->check(radixtier::cli::parsed_by(radixtier::sched::SnapshotPolicy::parse, "P"));
  app.add_flag("--json", args->json, "print the reports as JSON on stdout");
  app.footer("Progress goes to stderr.");
  return [args] { return run_demo(*args); };
}

int run_demo(DemoArgs& args) {
  const bool json = args.json;
  const std::string& policy_text = args.policy_text;
  std::vector<std::string>& names = args.names;
  auto policy = radixtier::sched::SnapshotPolicy::parse(policy_text);
  if (!policy) {
    std::fprintf(stderr, "radixtier demo: %s\n", policy.status().message().c_str());
    return 2;
  }
  if (names.empty()) names = radixtier::demo::scenario_names();
  std::vector<ScenarioReport> reports;
  ProgressPrinter printer;
  bool ok = true;
  for (const auto& name : names) {
    auto w = radixtier::demo::make_scenario(name, *policy);
    if (!w) {
      std::fprintf(stderr, "radixtier demo: %s\n", w.status().message().c_str());
      return 2;
    }
    if (auto s = w->sched.validate(w->model.page_size); !s) {
      std::fprintf(stderr, "radixtier demo: %s\n", s.message().c_str());
      return 2;
    }
    reports.push_back(radixtier::demo::run_scenario(
        *w, [&](const std::string& phase, const radixtier::sched::Progress& p) {
          printer(name, phase, p);
        }));
    printer.clear();
    ok = ok && reports.back().all_identical;
    if (!json) {
      std::printf("%s\n", radixtier::demo::format_table(reports.back()).c_str());
      std::fflush(stdout);
    }
  }
  if (json)
    std::printf("%s", radixtier::demo::format_json(reports).c_str());
  else
    std::printf("%s\n",
                ok ? "every row identical to the no-reuse run" : "MISMATCH: see rows above");
  return ok ? 0 : 1;
}

const radixtier::cli::CommandRegistrar kDemo{
    "demo", "scenario tables on the tiny model: the cache vs a no-reuse run", &setup_demo};

}  // namespace
