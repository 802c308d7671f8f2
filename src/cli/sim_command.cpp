// `radixtier sim`: one scenario x one cache in the simulator (docs/simulator.md).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "commands.hpp"
#ifdef RADIXTIER_CLI_METRICS
#include <chrono>
#include <thread>

#include "radixtier/metrics/cache_metrics.hpp"
#endif
#include "radixtier/scheduler/snapshot_policy.hpp"
#include "sim/progress.hpp"
#include "sim/simulator.hpp"
#include "sim/trace.hpp"

namespace {

using namespace radixtier;

struct SimArgs {
  std::string scenario, policy_text, cache = "node", router = "prefix", eviction = "cost-aware";
  std::string sglang_strategy = "no-buffer";
  sim::SimOptions opt;
  sim::ScenarioOptions so;
  bool json = false, rows = false, write_through = false, no_restart = false;
  double host_gib = -1, host_snapshot_gib = -1, disk_gib = 0, shared_gib = 0;
  int metrics_port = -1;      ///< < 0: no metrics endpoint
  double metrics_hold_s = 0;  ///< seconds to keep serving after the run
  int side_priority = sim::ScenarioOptions{}.agent_side_priority;  // CLI11 reads uint8_t as a char
  /// Options only the trace scenario reads: given to another scenario, an error (not a no-op).
  std::vector<const CLI::Option*> trace_only;
};

/// A valid element type name (model_config.hpp).
CLI::Validator dtype_check() {
  return radixtier::cli::parsed_by([](const std::string& t) { return sim::dtype_bytes(t); },
                                   "DTYPE");
}

int run_sim(SimArgs& a);

radixtier::cli::CommandRun setup_sim(CLI::App& app) {
  auto args = std::make_shared<SimArgs>();
  SimArgs& a = *args;
  app.add_option("--scenario", a.scenario, "the workload (docs/simulator.md, \"Scenarios\")")
      ->required()
      ->check(CLI::IsMember(sim::scenario_names()));
  app.add_option("--cache", a.cache,
                 std::string(sim::kCacheKindNames) +
                     " (ideal: the trace reference; oracle: the trace headroom, knows the future)")
      ->capture_default_str()
      ->check(radixtier::cli::parsed_by(sim::parse_cache_kind, "KIND"));
  app.add_option(
         "--model", a.opt.model,
         "a model preset (qwen3-next-80b, qwen3-next-80b-bf16-state, seed-hybrid) or the path "
         "of a Hugging Face config.json of a hybrid model (docs/simulator.md, \"Models as data\")")
      ->capture_default_str();
  app.add_option("--kv-dtype", a.opt.dtypes.kv,
                 "KV cache element type (default: radixtier.kv_cache_dtype, else the model's)")
      ->check(dtype_check());
  app.add_option("--recurrent-dtype", a.opt.dtypes.recurrent,
                 "GDN recurrent state element type (default: mamba_ssm_dtype, else float32)")
      ->check(dtype_check());
  app.add_option("--conv-dtype", a.opt.dtypes.conv,
                 "GDN conv state element type (default: the model's dtype)")
      ->check(dtype_check());
  app.add_option("--hardware", a.opt.hardware, "consumer-gen4 | h200-gen5")
      ->capture_default_str()
      ->check(radixtier::cli::parsed_by(sim::find_hardware, "PRESET"));
  a.trace_only.push_back(app.add_option("--trace", a.so.trace_path, "trace: a Mooncake JSONL file")
                             ->capture_default_str());
  app.add_option("--policy", a.policy_text,
                 std::string("snapshot placement: adaptive | end-only | every-chunk | interval:N | "
                             "budgeted[:BYTES] | sglang-no-buffer | sglang-extra-buffer, each "
                             "optionally +tail and/or +branch (default: ") +
                     sim::kDefaultPolicy +
                     " for node, --sglang-strategy for sglang-like, end-only otherwise)")
      ->check(radixtier::cli::parsed_by(sched::SnapshotPolicy::parse, "P"));
  app.add_option("--eviction", a.eviction,
                 "node cache eviction: cost-aware (one host pool) | lru | utility (both with "
                 "the host split of --snapshot-share)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cost-aware", "lru", "utility"}));
  app.add_option("--host-gib", a.host_gib,
                 "whole host budget per instance in GiB, KV + snapshots (--snapshot-share of it "
                 "for snapshots); default: trace 16, other scenarios their own budget")
      ->check(radixtier::cli::number_up_to(sim::kMaxBudgetGib));
  app.add_option("--disk-gib", a.disk_gib,
                 "node cache: the store tier below host, in GiB, on the hardware's NVMe row "
                 "(0: none)")
      ->capture_default_str()
      ->check(radixtier::cli::number_up_to(sim::kMaxBudgetGib));
  app.add_option("--shared-gib", a.shared_gib,
                 "node cache: a shared tier of this many GiB that every instance fetches from "
                 "and publishes to (the hardware's shared-tier row; runs write-through; 0: none)")
      ->capture_default_str()
      ->check(radixtier::cli::number_up_to(sim::kMaxBudgetGib));
  app.add_option("--shared-shards", a.opt.shared_shards,
                 "the shared tier's shards (default: one per instance)")
      ->check(radixtier::cli::count_at_least(1));
  a.trace_only.push_back(app.add_flag(
      "--fresh-instance", a.opt.fresh_instance,
      "trace, N > 1: instance 0 restarts empty at its first idle moment after the "
      "midpoint; reports its next 100 requests' hit ratio against the warm instances'"));
  app.add_flag("--no-restart", a.no_restart,
               "restart: run the scenario straight through, without the process restart");
  app.add_option("--instances", a.opt.instances,
                 "trace: modeled GPUs (default: the smallest N with modeled utilization <= 0.7)")
      ->check(radixtier::cli::count_in(1, sim::kMaxInstances));
  a.trace_only.push_back(
      app.add_option("--router", a.router, "trace, N > 1: prefix | session | round-robin")
          ->capture_default_str()
          ->check(radixtier::cli::parsed_by(sim::parse_router_kind, "R")));
  a.trace_only.push_back(
      app.add_option("--gpu-kv-tokens", a.so.trace_gpu_kv_tokens,
                     "trace: GPU KV pool per instance (default: from the presets)")
          ->check(radixtier::cli::count_in(1, sim::kMaxGpuKvTokens)));
  app.add_option("--snapshot-share", a.so.trace_snapshot_share,
                 "trace, or --host-gib: share of the host budget for snapshots, in [0, 1)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            const double d = std::strtod(v.c_str(), nullptr);
            return d >= 0 && d < 1 ? std::string() : "'" + v + "' is not in [0, 1)";
          },
          "[0, 1)"));
  a.trace_only.push_back(app.add_option("--trace-limit", a.so.trace_limit,
                                        "trace: only the first N requests (0: all of them)")
                             ->check(radixtier::cli::count_at_least(0)));
  a.trace_only.push_back(app.add_flag(
      "--hash-only-prompts", a.so.trace_hash_only,
      "trace: build prompts from hash ids alone (a follow-up turn without the previous "
      "turn's tail and output), not the token-faithful replay (docs/simulator.md)"));
  app.add_option("--host-snapshot-gib", a.host_snapshot_gib,
                 "compaction*: host snapshots as a byte budget, not 32 slots")
      ->check(radixtier::cli::number_up_to(sim::kMaxBudgetGib));
  app.add_option("--side-priority", a.side_priority,
                 "agent: retention priority of the side requests, 0-100 (the conversation "
                 "runs at 35; 35 here: no priorities)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_option("--decode-step-s", a.opt.decode_step_s, "seconds of one batched decode step")
      ->capture_default_str()
      ->check(radixtier::cli::number_up_to(60));
  app.add_option("--load-back-min-tokens", a.opt.load_back_min_tokens,
                 "node cache: load back from host only when that resumes this many tokens "
                 "deeper (default 0: always)")
      ->check(radixtier::cli::count_at_least(0));
  app.add_option("--max-snapshots-per-path", a.opt.max_snapshots_per_path,
                 "node cache: at most this many snapshots on one root-to-leaf path (default 0: "
                 "no cap)")
      ->check(radixtier::cli::count_at_least(0));
  app.add_option("--gpu-low-watermark", a.opt.gpu_free_low_watermark,
                 "node cache: demote ahead of need when free GPU pages or snapshot slots fall "
                 "below this fraction of their pool (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999));
  app.add_option("--gpu-high-watermark", a.opt.gpu_free_high_watermark,
                 "node cache: ... until this fraction of the pool is free or on its way")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999));
  app.add_flag("--write-through", a.write_through,
               "node cache write policy write-through (default write-back)");
  app.add_option("--sglang-strategy", a.sglang_strategy,
                 "sglang-like: SGLang's --mamba-scheduler-strategy, no-buffer (its default) | "
                 "extra-buffer (branch-point and decode tracking)")
      ->capture_default_str()
      ->check(CLI::IsMember({"no-buffer", "extra-buffer"}));
  app.add_option("--sglang-memory-ratio", a.opt.sglang.mamba_full_memory_ratio,
                 "sglang-like: --mamba-full-memory-ratio (the GPU state pool gets r / (1 + r) "
                 "of the cache bytes when they come from the presets)")
      ->capture_default_str()
      ->check(radixtier::cli::number_up_to(1e6))
      ->check(CLI::PositiveNumber);
  app.add_flag("!--sglang-no-hicache", a.opt.sglang.hicache,
               "sglang-like: HiCache off (SGLang's default) whatever the host budget");
  app.add_option("--sglang-chunk", a.opt.sglang.chunk_tokens,
                 "sglang-like: --chunked-prefill-size (default: SGLang's for the GPU's memory)")
      ->check(radixtier::cli::count_at_least(1));
  app.add_option("--forward-tokens", a.opt.forward_tokens,
                 "every cache but sglang-like and vllm-like: prompt tokens per forward, the "
                 "engine's chunked prefill (default: SGLang's for the GPU's memory; states "
                 "inside are captured; a multiple of the scenario's chunk, 2048 tokens for a "
                 "trace)")
      ->check(radixtier::cli::count_in(1, sim::kMaxTraceTokens));
  app.add_flag("--vllm-offload", a.opt.vllm_offload,
               "vllm-like: vLLM's CPU offloading tier (OffloadingConnector, LRU) in the host "
               "budget (default: off, as in vLLM)");
  app.add_flag("--check-invariants", a.opt.check_invariants,
               "check the cache's invariants after every step (slow)");
#ifdef RADIXTIER_CLI_METRICS
  app.add_option("--metrics-port", a.metrics_port,
                 "serve Prometheus metrics on 127.0.0.1:P/metrics during the run (0: any free "
                 "port, printed on stderr)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-hold", a.metrics_hold_s,
                 "with --metrics-port: keep serving this many seconds after the run")
      ->check(radixtier::cli::number_up_to(86400));
#endif
  app.add_flag("--json", a.json, "one JSON object on stdout");
  app.add_flag("--rows", a.rows, "per-request rows (in the table and the JSON)");
  return [args] { return run_sim(*args); };
}

int run_sim(SimArgs& args) {
  const std::string& scenario = args.scenario;
  const std::string& policy_text = args.policy_text;
  sim::SimOptions& opt = args.opt;
  sim::ScenarioOptions& so = args.so;
  const bool json = args.json, rows = args.rows;
  opt.cache = *sim::parse_cache_kind(args.cache);
  opt.sglang.extra_buffer = args.sglang_strategy == "extra-buffer";
  opt.router = *sim::parse_router_kind(args.router);
  opt.eviction = args.eviction == "cost-aware" ? SnapshotEviction::kCostAware
                 : args.eviction == "utility"  ? SnapshotEviction::kUtility
                                               : SnapshotEviction::kLru;
  if (args.write_through) opt.write_policy = WritePolicy::kWriteThrough;
  so.agent_side_priority = static_cast<RetentionPriority>(args.side_priority);
  if (args.host_gib >= 0) {
    so.trace_host_bytes =
        static_cast<std::uint64_t>(args.host_gib * static_cast<double>(sim::kGiB));
    so.host_bytes = so.trace_host_bytes;
  }
  opt.disk_bytes = static_cast<std::uint64_t>(args.disk_gib * static_cast<double>(sim::kGiB));
  opt.shared_bytes = static_cast<std::uint64_t>(args.shared_gib * static_cast<double>(sim::kGiB));
  if (opt.shared_bytes > 0 && opt.cache != sim::CacheKind::kNode) {
    std::fprintf(stderr,
                 "radixtier sim: --shared-gib: only the node cache has a shared tier in "
                 "the simulator; %s runs without one\n",
                 args.cache.c_str());
  }
  opt.restart = !args.no_restart;
  if (args.host_snapshot_gib >= 0) {
    so.compaction_host_snapshot_bytes =
        static_cast<std::uint64_t>(args.host_snapshot_gib * static_cast<double>(sim::kGiB));
  }
  if (scenario != "trace") {
    for (const CLI::Option* o : args.trace_only) {
      if (o->count() == 0) continue;
      std::fprintf(stderr, "radixtier sim: %s: only the trace scenario reads it, not '%s'\n",
                   o->get_name().c_str(), scenario.c_str());
      return 2;
    }
  }
  if (!policy_text.empty()) {
    auto p = sched::SnapshotPolicy::parse(policy_text);
    if (!p) {
      std::fprintf(stderr, "radixtier sim: %s\n", p.status().message().c_str());
      return 2;
    }
    opt.policy = policy_text;
  }
#ifdef RADIXTIER_CLI_METRICS
  if (args.metrics_hold_s > 0 && args.metrics_port < 0) {
    std::fprintf(stderr, "radixtier sim: --metrics-hold: needs --metrics-port\n");
    return 2;
  }
#endif
  auto model = sim::resolve_model(opt.model, opt.dtypes);
  if (!model) {
    std::fprintf(stderr, "radixtier sim: %s\n", model.status().message().c_str());
    return 2;
  }
  auto s = sim::make_scenario(scenario, *model, so);
  if (!s) {
    std::fprintf(stderr, "radixtier sim: %s\n", s.status().message().c_str());
    return 2;
  }
  // What depends on the scenario's page size, named by its option (not by the scheduler's
  // config field it lands in).
  if (!policy_text.empty()) {
    if (Status v = sched::SnapshotPolicy::parse(policy_text)->validate(s->page_size); !v) {
      std::fprintf(stderr, "radixtier sim: --policy %s: %s\n", policy_text.c_str(),
                   v.message().c_str());
      return 2;
    }
  }
  if (opt.sglang.chunk_tokens % s->page_size != 0) {
    std::fprintf(stderr,
                 "radixtier sim: --sglang-chunk %zu: must be a multiple of the page size (%u "
                 "tokens)\n",
                 opt.sglang.chunk_tokens, static_cast<unsigned>(s->page_size));
    return 2;
  }
  sim::ProgressMeter meter(stderr, sim::ProgressMeter::stream_is_terminal(stderr));
  meter.phase(std::string("sim ") + scenario + "/" + sim::to_string(opt.cache), s->size(),
              "requests");
  opt.progress = [&](const sched::Progress& p) { meter.update(p.finished + p.failed); };
#ifdef RADIXTIER_CLI_METRICS
  // One registry, one CacheMetrics per instance (label instance="k"), one HTTP exposer.
  auto registry = std::make_shared<prometheus::Registry>();
  std::vector<std::unique_ptr<CacheMetrics>> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (args.metrics_port >= 0) {
    try {
      exposer =
          std::make_unique<prometheus::Exposer>("127.0.0.1:" + std::to_string(args.metrics_port));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "radixtier sim: --metrics-port %d: %s\n", args.metrics_port, e.what());
      return 2;
    }
    if (opt.fresh_instance) {
      std::fprintf(stderr,
                   "radixtier sim: --metrics-port: --fresh-instance replaces instance 0's cache, "
                   "and the metrics follow one cache per instance\n");
      return 2;
    }
    if (s->restart_before && opt.restart) {
      std::fprintf(stderr,
                   "radixtier sim: --metrics-port: scenario '%s' replaces its caches at the "
                   "restart, and the metrics follow one cache (use --no-restart)\n",
                   scenario.c_str());
      return 2;
    }
    exposer->RegisterCollectable(registry);
    std::fprintf(stderr, "radixtier sim: metrics on http://127.0.0.1:%d/metrics\n",
                 exposer->GetListeningPorts().front());
    opt.on_cache = [&](PrefixCache& cache, std::size_t k) {
      metrics.push_back(std::make_unique<CacheMetrics>(
          *registry, cache, prometheus::Labels{{"instance", std::to_string(k)}}));
      cache.set_timing_hooks(metrics.back().get());
    };
    // Every step (a few dozen atomic stores), so the last one, after the run, is exact.
    opt.on_step = [&] {
      for (auto& m : metrics) m->update();
    };
  }
  auto r = sim::simulate(*s, opt);
#else
  auto r = sim::simulate(*s, opt);
#endif
  if (r) meter.update(r->requests);
  meter.finish();
  if (r && opt.fresh_instance && !r->fresh.ran) {
    std::fprintf(stderr,
                 "radixtier sim: --fresh-instance: instance 0 was never idle at an arrival after "
                 "the trace's midpoint, so it never restarted (give more --instances or a "
                 "longer trace)\n");
  }
  if (!r) {
    std::fprintf(stderr, "radixtier sim: %s\n", r.status().message().c_str());
    // A bad option or budget found once the run is set up is still the caller's input.
    return r.status().code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
#ifdef RADIXTIER_CLI_METRICS
  auto hold = [&] {
    if (exposer && args.metrics_hold_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(args.metrics_hold_s));
  };
#else
  auto hold = [] {};
#endif
  if (r->overrun) {
    std::fprintf(stderr,
                 "radixtier sim: warning: the replay's clock ran %.2fx the trace's span (%zu "
                 "instances): the cluster is overloaded, its hit ratio and TTFTs describe a "
                 "queue; give more --instances\n",
                 r->clock_span_ratio, r->instances);
  }
  if (json) {
    std::printf("%s\n", sim::to_json(*r, rows).c_str());
  } else {
    std::printf("%s: %s\ncache %s, model %s, hardware %s, policy %s, eviction %s\n",
                s->name.c_str(), s->description.c_str(), r->cache.c_str(), r->model.c_str(),
                r->hardware.c_str(), r->policy.c_str(), r->eviction.c_str());
    std::printf(
        "model: %llu KV bytes per token (%s), %llu snapshot bytes (recurrent %s, conv %s)\n\n",
        static_cast<unsigned long long>(model->kv_bytes_per_token()), model->kv_dtype.c_str(),
        static_cast<unsigned long long>(model->snapshot_bytes()), model->recurrent_dtype.c_str(),
        model->conv_dtype.c_str());
    const bool disk = r->disk_bytes > 0;
    if ((!s->is_trace() || rows) && !disk) {
      std::printf("%-16s %9s %9s %9s %9s %10s %9s %9s %5s\n", "request", "prompt", "cached",
                  "on host", "recomp.", "reload s", "TTFT s", "floor s", "snaps");
      for (const auto& w : r->rows) {
        std::printf("%-16s %9zu %9zu %9zu %9zu %10.4f %9.3f %9.3f %5u%s%s\n", w.label.c_str(),
                    w.prompt_tokens, w.cached_tokens, w.host_cached_tokens, w.recomputed_tokens,
                    w.reload_s, w.ttft_s, w.floor_s, w.snapshots_kept,
                    w.ok ? "" : "  FAILED: ", w.error.c_str());
      }
      std::printf("\n");
    } else if (!s->is_trace() || rows) {
      // With the disk tier: what came from the store and its read time, before the reload.
      std::printf("%-16s %9s %9s %9s %9s %9s %9s %10s %9s %9s %5s\n", "request", "prompt", "cached",
                  "on host", "on disk", "recomp.", "disk s", "reload s", "TTFT s", "floor s",
                  "snaps");
      for (const auto& w : r->rows) {
        std::printf("%-16s %9zu %9zu %9zu %9zu %9zu %9.4f %10.4f %9.3f %9.3f %5u%s%s\n",
                    w.label.c_str(), w.prompt_tokens, w.cached_tokens, w.host_cached_tokens,
                    w.store_cached_tokens, w.recomputed_tokens, w.disk_s, w.reload_s, w.ttft_s,
                    w.floor_s, w.snapshots_kept, w.ok ? "" : "  FAILED: ", w.error.c_str());
      }
      std::printf("\n");
    }
    std::printf(
        "requests %zu (failed %zu), input %llu, cached %llu (hit ratio %.4f), recomputed %llu\n"
        "TTFT total %.3f s, last %.3f s (floor %.3f s)\n"
        "bytes H2D %.3f GB, D2H %.3f GB, host peak %.3f GB, snapshots kept %llu\n"
        "simulated clock %.1f s, wall %.2f s%s%s\n",
        r->requests, r->failed, static_cast<unsigned long long>(r->input_tokens),
        static_cast<unsigned long long>(r->cached_tokens), r->hit_ratio,
        static_cast<unsigned long long>(r->recomputed_tokens), r->ttft_s_total, r->ttft_s_last,
        r->floor_s_last, static_cast<double>(r->bytes_h2d) / 1e9,
        static_cast<double>(r->bytes_d2h) / 1e9, static_cast<double>(r->host_bytes_peak) / 1e9,
        static_cast<unsigned long long>(r->snapshots_kept), r->sim_clock_s, r->wall_s,
        r->status.empty() ? "" : "\nscheduler stopped: ", r->status.c_str());
    if (disk) {
      std::printf(
          "disk %.1f GiB (%s): to store %.3f GB in %llu records, from store %.3f GB in %llu, "
          "store waits %llu (%.3f s), %llu records at the end\n",
          static_cast<double>(r->disk_bytes) / static_cast<double>(sim::kGiB),
          std::string(sim::find_hardware(r->hardware)->disk.drive).c_str(),
          static_cast<double>(r->stats.bytes_to_store) / 1e9,
          static_cast<unsigned long long>(r->stats.store_writes),
          static_cast<double>(r->stats.bytes_from_store) / 1e9,
          static_cast<unsigned long long>(r->stats.store_reads),
          static_cast<unsigned long long>(r->stats.store_copy_waits), r->sched.store_wait_s,
          static_cast<unsigned long long>(r->store_records));
    }
    if (r->shared.capacity_bytes > 0) {
      const auto& k = r->shared.counters;
      std::printf(
          "shared %.1f GiB (%zu shards, %.1f GB/s, %.0f us): %llu probes, %llu fetches (%llu "
          "failed imports) brought %llu tokens, %.3f GB, wait %.3f s; published %llu KV pages "
          "and %llu snapshots, %llu evicted, %.3f GB at the end; pending %llu (dropped %llu, "
          "given up %llu)\n",
          static_cast<double>(r->shared.capacity_bytes) / static_cast<double>(sim::kGiB),
          r->shared.shards, r->shared.bandwidth / 1e9, r->shared.latency_s * 1e6,
          static_cast<unsigned long long>(k.probes), static_cast<unsigned long long>(k.fetches),
          static_cast<unsigned long long>(k.import_failures),
          static_cast<unsigned long long>(k.fetched_tokens),
          static_cast<double>(k.fetched_bytes) / 1e9, k.wait_s,
          static_cast<unsigned long long>(k.published_kv_pages),
          static_cast<unsigned long long>(k.published_snapshots),
          static_cast<unsigned long long>(k.evicted_entries), static_cast<double>(k.bytes) / 1e9,
          static_cast<unsigned long long>(k.pending_queued),
          static_cast<unsigned long long>(k.pending_dropped),
          static_cast<unsigned long long>(k.pending_given_up));
    }
    if (r->fresh.ran) {
      const auto& f = r->fresh;
      std::printf(
          "fresh instance 0 (restarted before request %zu, at %.1f s): its next %zu requests hit "
          "%.4f, the warm instances' %zu meanwhile %.4f (ratio %.4f), the same requests "
          "without the restart %.4f (ratio %.4f)\n",
          f.restart_request, f.restart_s, f.fresh_requests, f.fresh_hit_ratio, f.warm_requests,
          f.warm_hit_ratio, f.ratio, f.same_warm_hit_ratio, f.same_ratio);
    }
    if (r->restart.ran) {
      const auto& x = r->restart;
      std::printf(
          "restart before %s: persist wrote %.3f GB (%.3f s); after it cached %zu tokens, "
          "without it %zu (reuse ratio %.4f); TTFT %.3f s (without %.3f s), disk floor %.3f s "
          "(TTFT ratio %.3f)\n",
          x.request.c_str(), static_cast<double>(x.persist_bytes) / 1e9, x.persist_s,
          x.cached_tokens, x.cached_tokens_no_restart, x.reuse_ratio, x.ttft_s, x.ttft_s_no_restart,
          x.disk_floor_s, x.ttft_ratio);
    }
    if (s->is_trace()) {
      std::printf(
          "prompts %s (%zu requests continue an earlier one); infinite-cache ceiling %.4f "
          "(token-level; from hash ids alone %.4f)\n"
          "instances %zu (router %s), modeled utilization %.3f (busy %.3f), GPU KV %u pages "
          "per instance\n"
          "TTFT p50 %.3f s, p90 %.3f s, p99 %.3f s\n",
          r->trace_construction.c_str(), r->trace_with_parent, r->ceiling_ratio,
          r->ceiling_blocks_ratio, r->instances, r->router.c_str(), r->utilization,
          r->busy_utilization, r->config.gpu_pages, r->ttft_s_p50, r->ttft_s_p90, r->ttft_s_p99);
      if (r->cache == "oracle") {
        std::printf(
            "oracle: hit ratio %.4f paying snapshot bytes (%llu snapshots placed); free "
            "snapshots (a true bound) %.4f; page-level ceiling %.4f; pages past a cap seen "
            "before %llu\n",
            r->hit_ratio, static_cast<unsigned long long>(r->snapshots_kept), r->oracle_bound_ratio,
            r->oracle_page_ceiling_ratio,
            static_cast<unsigned long long>(r->oracle_pages_past_cap));
      }
    }
  }
  std::fflush(stdout);
  hold();  // the output is out: a scraper can compare it with the endpoint
  return r->status.empty() ? 0 : 1;
}

const radixtier::cli::CommandRegistrar kSim{"sim", "replay a workload in the cost-model simulator",
                                            &setup_sim};

}  // namespace
