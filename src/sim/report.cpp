// The simulator report (see report.hpp).
#include "sim/report.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "sim/simulator.hpp"
#include "sim/svg.hpp"

namespace radixtier::sim {

namespace {

constexpr std::size_t kCompactionPrompt = 985'577;
constexpr CacheKind kCaches[] = {CacheKind::kNode, CacheKind::kSglangLike, CacheKind::kVllmLike,
                                 CacheKind::kIndex, CacheKind::kGpuOnly};
constexpr CacheKind kTraceCaches[] = {
    CacheKind::kNode,  CacheKind::kAttentionOnly, CacheKind::kSglangLike, CacheKind::kVllmLike,
    CacheKind::kIndex, CacheKind::kGpuOnly,       CacheKind::kIdeal,      CacheKind::kOracle};

std::string f(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
std::string gb(std::uint64_t bytes) {
  return f("%.2f", static_cast<double>(bytes) / 1e9);
}
std::string thousands(std::uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}
const char* mark(bool ok) {
  return ok ? "**met**" : "**not met**";
}

struct Variant {
  std::string label, scenario;
  std::uint64_t host_snapshot_bytes = 0;  ///< compaction: > 0 replaces the 32 slots
  std::string node_policy;                ///< empty: the default
};

/// The runs of the report. Each run is independent and deterministic (its own scenario copy
/// is read only, its caches, engines and scheduler are its own), so they go to a pool of
/// ReportOptions::jobs threads (the caller's among them) as soon as they are known, and are
/// collected in the order they were submitted: the report, runs.jsonl and the log read as
/// they would with one thread (only wall_s differs).
class Runner {
 public:
  using Pending = std::shared_future<Result<SimResult>>;

  explicit Runner(const ReportOptions& o) : o_(o) {
    const std::size_t jobs =
        o.jobs > 0 ? o.jobs : std::max<std::size_t>(1, std::thread::hardware_concurrency());
    for (std::size_t i = 1; i < jobs; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Runner() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      queue_.clear();  // an early return: what is not running yet is not needed
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// The runs that follow belong to `name`, `total` of them (ReportOptions::progress).
  void phase(std::string name, std::size_t total) {
    phase_ = std::move(name);
    done_ = 0;
    total_ = total;
    if (o_.progress) o_.progress(phase_, done_, total_);
  }

  /// Queues one run; `s` must outlive its collect().
  Pending submit(const Scenario& s, CacheKind cache, const std::string& hardware,
                 const std::string& policy = "",
                 SnapshotEviction eviction = SnapshotEviction::kCostAware,
                 std::uint64_t disk_bytes = 0) {
    std::packaged_task<Result<SimResult>()> task(
        [this, &s, cache, hardware, policy, eviction, disk_bytes] {
          return run_now(s, cache, hardware, policy, eviction, disk_bytes);
        });
    Pending f = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return f;
  }

  /// The result of a submitted run (this thread runs queued ones while it waits); counts it,
  /// logs it and appends it to runs.jsonl.
  Result<SimResult> collect(const Pending& f) {
    while (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      std::packaged_task<Result<SimResult>()> task;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!queue_.empty()) {
          task = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (task.valid()) {
        task();
      } else {
        f.wait();
      }
    }
    Result<SimResult> r = f.get();
    if (o_.progress) o_.progress(phase_, ++done_, total_);
    if (r) {
      jsonl_ << to_json(*r) << "\n";
      if (o_.log) {
        o_.log(r->scenario + " / " + r->cache + " / " + r->policy + " / " + r->eviction + ": hit " +
               f2("%.4f", r->hit_ratio) + ", TTFT last " + f2("%.3f", r->ttft_s_last) + " s (" +
               f2("%.1f", r->wall_s) + " s wall)");
      }
    }
    return r;
  }

  std::string jsonl() const { return jsonl_.str(); }

 private:
  static std::string f2(const char* format, double v) { return f(format, v); }

  void work() {
    for (;;) {
      std::packaged_task<Result<SimResult>()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  Result<SimResult> run_now(const Scenario& s, CacheKind cache, const std::string& hardware,
                            const std::string& policy, SnapshotEviction eviction,
                            std::uint64_t disk_bytes) const {
    SimOptions opt;
    opt.disk_bytes = disk_bytes;
    opt.cache = cache;
    opt.model = o_.model;
    opt.hardware = hardware;
    opt.policy = policy;
    opt.eviction = eviction;
    auto r = simulate(s, opt);
    if (r && cache == CacheKind::kSglangLike && policy.empty()) {
      // SGLang at its best: its default strategy (no_buffer) or extra_buffer, with HiCache on
      // (the host budget) or off (its default), whichever reuses most here
      // (docs/sglang-like.md).
      for (bool hicache : {true, false}) {
        for (bool extra_buffer : {false, true}) {
          if (hicache && !extra_buffer) continue;  // the first run
          opt.sglang.hicache = hicache;
          opt.sglang.extra_buffer = extra_buffer;
          auto other = simulate(s, opt);
          if (!other) return other;
          if (other->cached_tokens > r->cached_tokens) r = std::move(other);
        }
      }
      // And its one-buffer opt-in (--enable-unified-memory: sglang-unified), either strategy.
      opt.cache = CacheKind::kSglangUnified;
      opt.sglang.hicache = false;
      for (bool extra_buffer : {false, true}) {
        opt.sglang.extra_buffer = extra_buffer;
        auto other = simulate(s, opt);
        if (!other) return other;
        if (other->cached_tokens > r->cached_tokens) r = std::move(other);
      }
    }
    if (r && cache == CacheKind::kVllmLike && r->total_budget_bytes > 0) {
      // vLLM at its best: with its CPU offloading tier in the host bytes when that reuses more.
      opt.vllm_offload = true;
      auto off = simulate(s, opt);
      if (!off) return off;
      if (off->cached_tokens > r->cached_tokens) r = std::move(off);
    }
    return r;
  }

  const ReportOptions& o_;
  std::ostringstream jsonl_;
  std::string phase_ = "runs";
  std::size_t done_ = 0, total_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<Result<SimResult>()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Status write_report(const ReportOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return invalid_argument("cannot create '" + o.out_dir + "': " + ec.message());
  auto model = resolve_model(o.model);
  if (!model) return model.status();
  std::ostringstream md;
  std::map<std::string, std::string> svgs;

  md << "# Simulator results\n\n"
     << "Generated by `radixtier report` (docs/simulator.md explains the model). Model `" << o.model
     << "`; seed scenarios on `" << o.hardware << "`, the trace on `" << o.trace_hardware
     << "`. Times are modeled seconds (TTFT = t0 + reload + prefill"
     << " [+ queueing for agent and trace]); GB = 1e9 bytes.\n\n";

  // ---- 1. scenarios x caches ------------------------------------------------------------
  std::vector<Variant> variants;
  auto add = [&](const char* label, const char* scenario, std::uint64_t snap, const char* p) {
    Variant v;
    v.label = label;
    v.scenario = scenario;
    v.host_snapshot_bytes = snap;
    v.node_policy = p;
    variants.push_back(std::move(v));
  };
  add("churn", "churn", 0, "");
  add("flush", "flush", 0, "");
  add("compaction (32 host snapshot slots)", "compaction", 0, "");
  add("compaction (64 GiB host snapshots, node: every-chunk)", "compaction", 64 * kGiB,
      "every-chunk");
  add("compaction-turns (32 slots)", "compaction-turns", 0, "");
  add("agent", "agent", 0, "");
  std::map<std::string, std::map<CacheKind, SimResult>> res;

  // Every run is known before the first result is needed: they are all queued now, in the
  // order the sections below collect them (Runner). The scenarios outlive the runner.
  std::deque<Scenario> scenarios;
  auto keep = [&](Scenario s) -> const Scenario& { return scenarios.emplace_back(std::move(s)); };
  std::vector<const Scenario*> seed;  // per variant
  for (const Variant& v : variants) {
    ScenarioOptions so;
    so.compaction_host_snapshot_bytes = v.host_snapshot_bytes;
    auto s = make_scenario(v.scenario, *model, so);
    if (!s) return s.status();
    seed.push_back(&keep(std::move(*s)));
  }
  const Scenario* restart = nullptr;
  const Scenario* flush = nullptr;
  const auto disk = static_cast<std::uint64_t>(o.disk_gib * static_cast<double>(kGiB));
  if (o.disk_gib > 0) {
    auto r = make_scenario("restart", *model);
    if (!r) return r.status();
    restart = &keep(std::move(*r));
    ScenarioOptions small_host;
    small_host.host_bytes = 3 * kGiB / 4;
    auto fl = make_scenario("flush", *model, small_host);
    if (!fl) return fl.status();
    flush = &keep(std::move(*fl));
  }
  auto trace = load_trace(o.trace_path);
  if (!trace && o.trace_required) return trace.status();
  if (trace && o.trace_limit > 0 && trace->size() > o.trace_limit) trace->resize(o.trace_limit);
  std::vector<const Scenario*> at_budget;  // the trace per host budget
  if (trace) {
    for (double g : o.trace_host_gib) {
      ScenarioOptions so;
      so.trace_host_bytes = static_cast<std::uint64_t>(g * static_cast<double>(kGiB));
      at_budget.push_back(&keep(trace_scenario(*trace, *model, so)));
    }
  }
  const std::vector<std::string> policies = {
      "adaptive", "end-only",      "every-chunk",   "interval:8192",        "interval:30720",
      "budgeted", "end-only+tail", "budgeted+tail", "budgeted+tail+branch", "interval:30720+tail"};
  std::vector<std::pair<std::string, const Scenario*>> policy_scenarios;
  if (o.policies) {
    for (const char* name : {"churn", "flush", "compaction", "compaction-turns", "agent"}) {
      auto s = make_scenario(name, *model);
      if (!s) return s.status();
      policy_scenarios.emplace_back(name, &keep(std::move(*s)));
    }
    if (trace) {
      ScenarioOptions so;
      so.trace_host_bytes = 64 * kGiB;
      policy_scenarios.emplace_back("trace 64 GiB", &keep(trace_scenario(*trace, *model, so)));
    }
  }
  struct DiskRun {
    const Scenario* s;
    CacheKind cache;
    std::uint64_t disk;
  };
  std::vector<DiskRun> disk_runs;
  if (o.disk_gib > 0) {
    disk_runs = {{restart, CacheKind::kNode, disk}, {restart, CacheKind::kNode, 0},
                 {restart, CacheKind::kIndex, 0},   {restart, CacheKind::kGpuOnly, 0},
                 {flush, CacheKind::kNode, disk},   {flush, CacheKind::kNode, 0}};
  }

  Runner runner(o);
  std::vector<Runner::Pending> seed_runs, disk_pending, trace_runs, policy_runs;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (CacheKind k : kCaches) {
      seed_runs.push_back(runner.submit(*seed[i], k, o.hardware,
                                        k == CacheKind::kNode ? variants[i].node_policy : ""));
    }
  }
  for (const DiskRun& d : disk_runs) {
    disk_pending.push_back(
        runner.submit(*d.s, d.cache, o.hardware, "", SnapshotEviction::kCostAware, d.disk));
  }
  for (std::size_t b = 0; b < at_budget.size(); ++b) {
    for (CacheKind k : kTraceCaches) {
      // gpu-only has no host tier: the budget does not matter, it runs once
      if (k == CacheKind::kGpuOnly && b > 0) continue;
      trace_runs.push_back(runner.submit(*at_budget[b], k, o.trace_hardware));
    }
  }
  for (const auto& p : policies) {
    for (SnapshotEviction e : {SnapshotEviction::kCostAware, SnapshotEviction::kLru}) {
      for (const auto& [name, s] : policy_scenarios) {
        policy_runs.push_back(runner.submit(*s, CacheKind::kNode,
                                            s->is_trace() ? o.trace_hardware : o.hardware, p, e));
      }
    }
  }
  md << "## Scenarios x caches\n\n"
     << "node = PrefixCache with the default placement `" << kDefaultPolicy
     << "` unless the row says otherwise; sglang-like = SGLang's hybrid radix cache (the best "
        "of its no_buffer and extra_buffer strategies with HiCache on or off, and of its "
        "one-buffer opt-in (sglang-unified), "
        "docs/sglang-like.md); vllm-like = vLLM's "
        "hybrid prefix caching (the better of GPU only and its CPU offloading tier, "
        "docs/vllm-like.md); index = the index-based tier "
        "(end-only, as the original); gpu-only = the same GPU tree without a host tier. *last* = "
        "the scenario's "
        "last request (churn/flush: turn 2; compaction: the replay; agent: the last side "
        "request).\n\n"
     << "| scenario | cache | policy | hit ratio | cached (last) | recomputed (last) | TTFT last s "
        "| floor last s | TTFT total s | H2D GB | D2H GB | host peak GB | snapshots kept | "
        "wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  runner.phase("scenarios x caches", variants.size() * std::size(kCaches));
  std::size_t next = 0;
  for (const Variant& v : variants) {
    for (std::size_t j = 0; j < std::size(kCaches); ++j) {
      auto r = runner.collect(seed_runs[next++]);
      if (!r) return r.status();
      md << "| " << v.label << " | " << r->cache << " | " << r->policy << " | "
         << f("%.4f", r->hit_ratio) << " | " << thousands(r->cached_tokens_last) << " | "
         << thousands(r->recomputed_tokens_last) << " | " << f("%.3f", r->ttft_s_last) << " | "
         << f("%.3f", r->floor_s_last) << " | " << f("%.1f", r->ttft_s_total) << " | "
         << gb(r->bytes_h2d) << " | " << gb(r->bytes_d2h) << " | " << gb(r->host_bytes_peak)
         << " | " << r->snapshots_kept << " | " << f("%.2f", r->wall_s) << " |\n";
      res[v.label][kCaches[j]] = std::move(*r);
    }
  }
  md << "\n";

  // ---- plots: churn TTFT per request, compaction cached + TTFT --------------------------
  {
    const auto& churn = res["churn"];
    std::vector<std::string> cats;
    for (const auto& row : churn.at(CacheKind::kNode).rows) cats.push_back(row.label);
    std::vector<svg::Series> series;
    for (CacheKind k : kCaches) {
      svg::Series se{to_string(k), {}, false};
      for (const auto& row : churn.at(k).rows) se.values.push_back(row.ttft_s);
      series.push_back(std::move(se));
    }
    svg::Chart c{
        "churn: time to first token per request", "request", "TTFT (s, log)", true, 900, 380};
    svgs["churn_ttft.svg"] = svg::bar_chart(c, cats, series);
  }
  {
    const std::vector<std::pair<std::string, std::string>> comp = {
        {"compaction (32 host snapshot slots)", "32 slots"},
        {"compaction (64 GiB host snapshots, node: every-chunk)", "64 GiB"},
        {"compaction-turns (32 slots)", "built by turns"}};
    std::vector<std::string> cats;
    for (const auto& [label, shortname] : comp) cats.push_back(shortname);
    std::vector<svg::Series> cached, ttft;
    for (CacheKind k : kCaches) {
      svg::Series a{to_string(k), {}, false}, b{to_string(k), {}, false};
      for (const auto& [label, shortname] : comp) {
        a.values.push_back(static_cast<double>(res[label].at(k).cached_tokens_last));
        b.values.push_back(res[label].at(k).ttft_s_last);
      }
      cached.push_back(std::move(a));
      ttft.push_back(std::move(b));
    }
    svgs["compaction_cached.svg"] = svg::bar_chart(
        {"compaction replay: cached tokens", "variant", "cached tokens", false}, cats, cached);
    svgs["compaction_ttft.svg"] = svg::bar_chart(
        {"compaction replay: time to first token", "variant", "TTFT (s, log)", true}, cats, ttft);
  }

  // ---- the disk tier: the restart, a flush into disk (issue 13) ----------------------------
  if (o.disk_gib > 0) {
    md << "## The disk tier: a restart, a flush into disk (issue 13)\n\n"
       << "`restart` = churn's turn 1 and aux calls, a process restart (the node cache persists "
          "to its store and a new one is created on it), then turn 2; *without* = the same "
          "scenario with no restart. Disk "
       << f("%g", o.disk_gib) << " GiB for the node cache "
       << "(the others have no store and lose everything). `flush` here runs with a 0.75 GiB "
          "host budget, too small for turn 1 with its snapshots or a flush prompt. TTFT = t0 + "
          "disk read + reload + prefill; the "
          "disk floor reads every reusable byte from the disk once.\n\n"
       << "| scenario | cache | disk GiB | turn 2 cached | without restart | reuse ratio | TTFT s "
          "| disk floor s | TTFT / floor | from disk GB | to disk GB |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|\n";
    std::string restart_goal;
    runner.phase("disk tier", disk_runs.size());
    for (std::size_t i = 0; i < disk_runs.size(); ++i) {
      const DiskRun& d = disk_runs[i];
      auto r = runner.collect(disk_pending[i]);
      if (!r) return r.status();
      const RequestRow& last = r->rows.back();
      const bool restarted = r->restart.ran;
      md << "| " << d.s->name << (d.s == flush ? " (0.75 GiB host)" : "") << " | " << r->cache
         << " | " << f("%g", static_cast<double>(d.disk) / static_cast<double>(kGiB)) << " | "
         << thousands(last.cached_tokens) << " | "
         << (restarted ? thousands(r->restart.cached_tokens_no_restart) : "-") << " | "
         << (!restarted                                 ? "-"
             : r->restart.cached_tokens_no_restart == 0 ? "- (0 of 0)"
                                                        : f("%.4f", r->restart.reuse_ratio))
         << " | " << f("%.3f", last.ttft_s) << " | " << f("%.3f", last.disk_floor_s) << " | "
         << f("%.2f", last.ttft_s / last.disk_floor_s) << " | " << gb(r->stats.bytes_from_store)
         << " | " << gb(r->stats.bytes_to_store) << " |\n";
      if (restarted && d.disk > 0) {
        restart_goal = "\nGoal (issue 13): restart (node, " + f("%g", o.disk_gib) +
                       " GiB disk): turn 2 reuses " + f("%.4f", r->restart.reuse_ratio) +
                       " of what it reuses without the restart (goal >= 0.99): " +
                       mark(r->restart.reuse_ratio >= 0.99) + "; TTFT " +
                       f("%.3f", r->restart.ttft_s) + " s = " + f("%.2fx", r->restart.ttft_ratio) +
                       " its disk floor " + f("%.3f", r->restart.disk_floor_s) +
                       " s (goal <= 1.5x): " + mark(r->restart.ttft_ratio <= 1.5) + ".\n";
      }
    }
    md << restart_goal << "\n";
  }

  // ---- 2. trace at several host budgets --------------------------------------------------
  md << "## Trace replay\n\n";
  std::vector<std::map<CacheKind, SimResult>> trace_res;
  double ceiling = 0;
  if (!trace) {
    md << "Trace not run: " << trace.status().message() << "\n\n";
  } else {
    Scenario probe = trace_scenario(*trace, *model, ScenarioOptions{});
    ceiling = trace_token_ceiling(probe).ratio();
    auto thw = find_hardware(o.trace_hardware);
    if (!thw) return thw.status();
    const std::size_t n_inst = default_instances(probe, *thw, SimOptions{}.decode_step_s);
    md << trace->size() << " requests" << (o.trace_limit > 0 ? " (subsampled: the first N)" : "")
       << " of `" << o.trace_path << "` on **" << n_inst << " instances** of `" << o.trace_hardware
       << "` (the smallest count whose modeled utilization, prefill of every "
       << "prompt without reuse + decode over N x the trace's span, is <= "
       << f("%.1f", kTargetUtilization) << "), prefix router. Per instance: GPU KV from the "
       << "presets (HBM x 0.9 - weights - " << gpu_snapshot_slots_for(8)
       << " GPU snapshot slots; sglang-like: the same bytes split by its memory ratio; "
          "vllm-like: the same bytes as one pool of blocks), max running 8; the host budget is "
          "per instance, KV + snapshots (node: one pool; sglang-like: HiCache's two pools in "
          "proportion to the device pools, off at 0 GiB; attention-only: all of it KV; "
          "vllm-like: its CPU offloading tier, when that reuses more). 0 GiB = no host tier, how "
          "most servers run. attention-only = the node "
          "cache's "
          "twin with free snapshots and every page boundary resumable: *tax* = node / "
          "attention-only at the same budget. ideal = LRU cache of KV blocks alone with the "
          "cluster's total bytes, strictly in order, no time (reference only). oracle = a hybrid "
          "cache that knows the future, with the same total bytes as the ideal, paying snapshot "
          "bytes, strictly in order, no time (the headroom; docs/simulator.md, \"The oracle\"). "
          "Prompts are token-faithful: "
       << (probe.trace_parents ? probe.trace_parents->with_parent : 0)
       << " requests continue an earlier one (its prompt + its output + their own tokens; "
          "docs/simulator.md). Infinite-cache ceiling (token-level): **"
       << f("%.4f", ceiling)
       << "** (from hash ids alone: " << f("%.4f", infinite_cache_ceiling(*trace).ratio())
       << ").\n\n"
       << "| host budget | cache | policy | hit ratio | / attention-only | vs ideal | TTFT p50 s | "
          "p90 s | p99 s | utilization | H2D GB | D2H GB | host peak GB | snapshots kept | wall "
          "s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    const std::size_t budgets = o.trace_host_gib.size();
    const std::size_t per_budget = std::size(kTraceCaches);  // gpu-only runs once
    runner.phase("trace", budgets == 0 ? 0 : per_budget * budgets - (budgets - 1));
    std::size_t next_trace = 0;
    for (double g : o.trace_host_gib) {
      std::map<CacheKind, SimResult> at;
      for (CacheKind k : kTraceCaches) {
        if (k == CacheKind::kGpuOnly && !trace_res.empty()) {
          at[k] = trace_res.front().at(k);  // no host tier: the budget does not matter
        } else {
          auto r = runner.collect(trace_runs[next_trace++]);
          if (!r) return r.status();
          at[k] = std::move(*r);
        }
      }
      const double ideal = at.at(CacheKind::kIdeal).hit_ratio;
      const double twin = at.at(CacheKind::kAttentionOnly).hit_ratio;
      for (CacheKind k : kTraceCaches) {
        const SimResult& r = at.at(k);
        const bool peer = k == CacheKind::kSglangLike || k == CacheKind::kVllmLike;
        md << "| " << f("%g", g) << " GiB | " << r.cache << " | " << r.policy
           << (peer ? " (" + r.eviction + ")" : std::string()) << " | " << f("%.4f", r.hit_ratio)
           << " | " << (twin > 0 ? f("%.1f%%", 100 * r.hit_ratio / twin) : "-") << " | "
           << (ideal > 0 ? f("%.1f%%", 100 * r.hit_ratio / ideal) : "-") << " | "
           << f("%.3f", r.ttft_s_p50) << " | " << f("%.3f", r.ttft_s_p90) << " | "
           << f("%.3f", r.ttft_s_p99) << " | " << f("%.3f", r.utilization)
           << (r.overrun ? f(" (clock %.2fx span)", r.clock_span_ratio) : std::string()) << " | "
           << gb(r.bytes_h2d) << " | " << gb(r.bytes_d2h) << " | " << gb(r.host_bytes_peak) << " | "
           << r.snapshots_kept << " | " << f("%.2f", r.wall_s) << " |\n";
      }
      trace_res.push_back(std::move(at));
    }
    md << "\nThe ideal and the oracle have no TTFT of their own (they run without time): their "
          "percentiles are "
          "t0 + reload + prefill of each request alone. Host peak is the largest instance's.\n\n";
    std::vector<std::string> xs;
    for (double g : o.trace_host_gib) xs.push_back(f("%g GiB", g));
    std::vector<svg::Series> series;
    for (CacheKind k : kTraceCaches) {
      svg::Series se{
          to_string(k),
          {},
          k == CacheKind::kIdeal || k == CacheKind::kAttentionOnly || k == CacheKind::kOracle};
      for (const auto& at : trace_res) se.values.push_back(at.at(k).hit_ratio);
      series.push_back(std::move(se));
    }
    series.push_back({"ceiling", std::vector<double>(xs.size(), ceiling), true});
    svgs["trace_hit_ratio.svg"] =
        svg::line_chart({"trace: token hit ratio against host budget per instance",
                         "host budget per instance (KV + snapshots)", "token hit ratio", false},
                        xs, series);
  }

  // ---- 3. goals ----------------------------------------------------------------------------
  md << "## Goals of issue #5\n\n";
  {
    const SimResult& n = res["churn"].at(CacheKind::kNode);
    md << "- churn: node reuses " << thousands(n.cached_tokens_last) << " of "
       << thousands(n.rows.back().prompt_tokens)
       << " tokens (goal >= 23,936): " << mark(n.cached_tokens_last >= 23'936) << "; TTFT "
       << f("%.3f", n.ttft_s_last) << " s vs physical floor " << f("%.3f", n.floor_s_last)
       << " s = " << f("%.2fx", n.ttft_s_last / n.floor_s_last)
       << " (goal <= 1.2x): " << mark(n.ttft_s_last <= 1.2 * n.floor_s_last) << ".\n";
  }
  auto compaction_goal = [&](const std::string& label, double max_recompute, double min_ratio) {
    const SimResult& n = res[label].at(CacheKind::kNode);
    const SimResult& x = res[label].at(CacheKind::kIndex);
    const std::size_t lost = n.rows.back().reusable_tokens - n.cached_tokens_last;
    const double ratio = x.ttft_s_last / n.ttft_s_last;
    md << "- " << label << ": node resumes at " << thousands(n.cached_tokens_last)
       << ", recomputes " << thousands(lost) << " tokens of the cached prompt (goal <= "
       << thousands(static_cast<std::uint64_t>(max_recompute))
       << "): " << mark(static_cast<double>(lost) <= max_recompute) << "; TTFT "
       << f("%.2f", n.ttft_s_last) << " s vs index " << f("%.1f", x.ttft_s_last)
       << " s = " << f("%.1fx", ratio) << " (goal >= " << f("%g", min_ratio)
       << "x): " << mark(ratio >= min_ratio) << "; the index tier resumes at "
       << thousands(x.cached_tokens_last)
       << " (full recompute: " << (x.cached_tokens_last == 0 ? "yes" : "no") << ").\n";
  };
  compaction_goal("compaction (32 host snapshot slots)", kCompactionPrompt / 32.0, 15);
  compaction_goal("compaction (64 GiB host snapshots, node: every-chunk)", 2048, 150);
  {
    const auto& t = res["compaction-turns (32 slots)"];
    md << "- compaction built by turns (replay cuts at a past turn boundary): node ("
       << t.at(CacheKind::kNode).policy << ") resumes at "
       << thousands(t.at(CacheKind::kNode).cached_tokens_last) << ", index at "
       << thousands(t.at(CacheKind::kIndex).cached_tokens_last)
       << " (the policy comparison below shows what placement gains there).\n";
  }
  if (!trace_res.empty()) {
    for (std::size_t i = 0; i < trace_res.size(); ++i) {
      const double node = trace_res[i].at(CacheKind::kNode).hit_ratio;
      const double twin = trace_res[i].at(CacheKind::kAttentionOnly).hit_ratio;
      const double sgl = trace_res[i].at(CacheKind::kSglangLike).hit_ratio;
      const double vll = trace_res[i].at(CacheKind::kVllmLike).hit_ratio;
      const double idx = trace_res[i].at(CacheKind::kIndex).hit_ratio;
      const double ideal = trace_res[i].at(CacheKind::kIdeal).hit_ratio;
      md << "- trace at " << f("%g", o.trace_host_gib[i]) << " GiB per instance: node "
         << f("%.4f", node) << "; node / attention-only = " << f("%.3f", twin > 0 ? node / twin : 0)
         << " (attention-only " << f("%.4f", twin) << " >= node: " << mark(twin >= node)
         << "); node / sglang-like = " << f("%.3f", sgl > 0 ? node / sgl : 0) << " (sglang-like "
         << f("%.4f", sgl) << "); node / vllm-like = " << f("%.3f", vll > 0 ? node / vll : 0)
         << " (vllm-like " << f("%.4f", vll) << "); "
         << f("%.1f%%", ideal > 0 ? 100 * node / ideal : 0) << " of the ideal " << f("%.4f", ideal)
         << " (goal >= 90%): " << mark(node >= 0.9 * ideal) << "; above the index tier ("
         << f("%.4f", idx) << "): " << mark(node > idx) << ". Ceiling " << f("%.4f", ceiling)
         << ".\n";
      const SimResult& orc = trace_res[i].at(CacheKind::kOracle);
      md << "  Headroom: node / oracle = "
         << f("%.3f", orc.hit_ratio > 0 ? node / orc.hit_ratio : 0) << " (oracle "
         << f("%.4f", orc.hit_ratio) << "; its free-snapshot bound "
         << f("%.4f", orc.oracle_bound_ratio) << ", node / bound = "
         << f("%.3f", orc.oracle_bound_ratio > 0 ? node / orc.oracle_bound_ratio : 0)
         << "; node / attention-only = " << f("%.3f", twin > 0 ? node / twin : 0) << ").\n";
    }
  }
  md << "\n";

  // ---- 4. policy comparison ------------------------------------------------------------------
  if (o.policies) {
    const auto& scenarios = policy_scenarios;
    md << "## Snapshot placement and eviction (node cache)\n\n"
       << "Cells: seed scenarios: tokens the last request resumes at / its TTFT (s); agent and "
          "trace: token hit ratio. `+tail`/`+branch` are SnapshotPolicy modifiers "
          "(docs/snapshot-policies.md). Eviction (CacheConfig::snapshot_eviction): `cost-aware` "
          "= the default (GreedyDual-Size-Frequency, dead KV first, one host pool); `lru` and "
          "`utility` = recency alone / the same keys, both with the fixed 1/8 host split.\n\n"
          "| policy | eviction |";
    for (const auto& [name, s] : scenarios) md << " " << name << " |";
    md << "\n|---|---|";
    for (std::size_t i = 0; i < scenarios.size(); ++i) md << "---|";
    md << "\n";
    runner.phase("policies", policies.size() * 2 * scenarios.size());
    std::size_t next_policy = 0;
    for (const auto& p : policies) {
      for (SnapshotEviction e : {SnapshotEviction::kCostAware, SnapshotEviction::kLru}) {
        md << "| " << p << " | " << radixtier::to_string(e) << " |";
        for (const auto& [name, s] : scenarios) {
          auto r = runner.collect(policy_runs[next_policy++]);
          if (!r) return r.status();
          if (name == "agent" || s->is_trace()) {
            md << " " << f("%.4f", r->hit_ratio) << " |";
          } else {
            md << " " << thousands(r->cached_tokens_last) << " / " << f("%.2f", r->ttft_s_last)
               << " |";
          }
        }
        md << "\n";
      }
    }
    md << "\n";
  }

  md << "## Plots\n\n![churn TTFT](churn_ttft.svg)\n\n![compaction cached](compaction_cached.svg)"
     << "\n\n![compaction TTFT](compaction_ttft.svg)"
     << (trace ? "\n\n![trace hit ratio](trace_hit_ratio.svg)" : "") << "\n\nReport generated in "
     << f("%.0f", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count())
     << " s.\n";

  auto write = [&](const std::string& name, const std::string& text) -> Status {
    std::ofstream out(std::filesystem::path(o.out_dir) / name);
    out << text;
    if (!out) return invalid_argument("cannot write " + o.out_dir + "/" + name);
    return Status::ok();
  };
  for (const auto& [name, text] : svgs) {
    if (Status s = write(name, text); !s) return s;
  }
  if (Status s = write("runs.jsonl", runner.jsonl()); !s) return s;
  return write("results.md", md.str());
}

}  // namespace radixtier::sim
