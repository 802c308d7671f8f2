// `radixtier sim`: one scenario x one cache in the simulator (docs/simulator.md).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.hpp"
#include "radixtier/scheduler/snapshot_policy.hpp"
#include "sim/progress.hpp"
#include "sim/simulator.hpp"

namespace {

using namespace radixtier;

void help(std::FILE* out) {
  std::fprintf(
      out,
      "usage: radixtier sim --scenario NAME [--cache KIND] [--instances N] [--router R]\n"
      "                     [--model PRESET] [--hardware PRESET] [--trace FILE]\n"
      "                     [--policy P] [--eviction lru|utility] [--json] [--rows]\n"
      "  --scenario NAME      churn | flush | compaction | compaction-turns | agent | trace |\n"
      "                       admission-128k\n"
      "  --cache KIND         node (default) | attention-only | sglang-like | index | gpu-only |\n"
      "                       ideal (trace reference)\n"
      "  --model PRESET       qwen3-next-80b (default) | seed-hybrid\n"
      "  --hardware PRESET    consumer-gen4 (default) | h200-gen5\n"
      "  --trace FILE         Mooncake JSONL (default ../shared/traces/"
      "mooncake_synthetic_trace.jsonl)\n"
      "  --policy P           snapshot placement: adaptive | end-only | every-chunk |\n"
      "                       interval:N | budgeted[:BYTES], each optionally +tail and/or\n"
      "                       +branch\n"
      "                       (default: %s for node, end-only otherwise)\n"
      "  --eviction E         node cache eviction: cost-aware (default, one host pool) |\n"
      "                       lru | utility (both with the host split of --snapshot-share)\n"
      "  --host-gib G         trace: whole host budget per instance in GiB (default 16)\n"
      "  --instances N        trace: modeled GPUs (default: the smallest N with modeled\n"
      "                       utilization <= 0.7)\n"
      "  --router R           trace, N > 1: prefix (default) | session | round-robin\n"
      "  --gpu-kv-tokens N    trace: GPU KV pool per instance (default: from the presets)\n"
      "  --snapshot-share F   trace: share of the host budget for snapshots (default 0.125)\n"
      "  --trace-limit N      trace: only the first N requests\n"
      "  --host-snapshot-gib G  compaction*: host snapshots as a byte budget, not 32 slots\n"
      "  --decode-step-s S    seconds of one batched decode step (default 0.025)\n"
      "  --write-through      node cache write policy write-through (default write-back)\n"
      "  --check-invariants   check the cache's invariants after every step (slow)\n"
      "  --json               one JSON object on stdout; --rows adds per-request rows\n",
      sim::kDefaultPolicy);
}

bool parse_double(const char* s, double& v) {
  char* end = nullptr;
  v = std::strtod(s, &end);
  return end != s && *end == '\0';
}

int run_sim(int argc, char** argv) {
  std::string scenario, policy_text;
  sim::SimOptions opt;
  sim::ScenarioOptions so;
  bool json = false, rows = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "radixtier sim: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* name, double& v) {
      const char* s = value(name);
      if (s == nullptr) return false;
      if (!parse_double(s, v) || v < 0) {
        std::fprintf(stderr, "radixtier sim: %s: '%s' is not a non-negative number\n", name, s);
        return false;
      }
      return true;
    };
    double d = 0;
    if (a == "--help" || a == "-h") {
      help(stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--rows") {
      rows = true;
    } else if (a == "--check-invariants") {
      opt.check_invariants = true;
    } else if (a == "--write-through") {
      opt.write_policy = WritePolicy::kWriteThrough;
    } else if (a == "--scenario" || a == "--cache" || a == "--model" || a == "--hardware" ||
               a == "--trace" || a == "--policy" || a == "--eviction") {
      const char* v = value(a.c_str());
      if (v == nullptr) return 2;
      if (a == "--scenario") {
        scenario = v;
      } else if (a == "--cache") {
        auto k = sim::parse_cache_kind(v);
        if (!k) {
          std::fprintf(stderr, "radixtier sim: %s\n", k.status().message().c_str());
          return 2;
        }
        opt.cache = *k;
      } else if (a == "--model") {
        opt.model = v;
      } else if (a == "--hardware") {
        opt.hardware = v;
      } else if (a == "--trace") {
        so.trace_path = v;
      } else if (a == "--policy") {
        policy_text = v;
      } else if (std::string(v) == "cost-aware") {
        opt.eviction = SnapshotEviction::kCostAware;
      } else if (std::string(v) == "lru" || std::string(v) == "utility") {
        opt.eviction =
            std::string(v) == "lru" ? SnapshotEviction::kLru : SnapshotEviction::kUtility;
      } else {
        std::fprintf(stderr,
                     "radixtier sim: --eviction: '%s' (expected cost-aware, lru or utility)\n", v);
        return 2;
      }
    } else if (a == "--router") {
      const char* v = value("--router");
      if (v == nullptr) return 2;
      auto k = sim::parse_router_kind(v);
      if (!k) {
        std::fprintf(stderr, "radixtier sim: %s\n", k.status().message().c_str());
        return 2;
      }
      opt.router = *k;
    } else if (a == "--instances") {
      if (!number("--instances", d) || d < 1) return 2;
      opt.instances = static_cast<std::size_t>(d);
    } else if (a == "--gpu-kv-tokens") {
      if (!number("--gpu-kv-tokens", d) || d < 1) return 2;
      so.trace_gpu_kv_tokens = static_cast<std::size_t>(d);
    } else if (a == "--host-gib") {
      if (!number("--host-gib", d)) return 2;
      so.trace_host_bytes = static_cast<std::uint64_t>(d * static_cast<double>(sim::kGiB));
    } else if (a == "--snapshot-share") {
      if (!number("--snapshot-share", d) || d >= 1) return 2;
      so.trace_snapshot_share = d;
    } else if (a == "--trace-limit") {
      if (!number("--trace-limit", d)) return 2;
      so.trace_limit = static_cast<std::size_t>(d);
    } else if (a == "--host-snapshot-gib") {
      if (!number("--host-snapshot-gib", d)) return 2;
      so.compaction_host_snapshot_bytes =
          static_cast<std::uint64_t>(d * static_cast<double>(sim::kGiB));
    } else if (a == "--decode-step-s") {
      if (!number("--decode-step-s", d)) return 2;
      opt.decode_step_s = d;
    } else {
      std::fprintf(stderr, "radixtier sim: unexpected argument '%s'\n", a.c_str());
      help(stderr);
      return 2;
    }
  }
  if (scenario.empty()) {
    std::fprintf(stderr, "radixtier sim: --scenario is required\n");
    help(stderr);
    return 2;
  }
  if (!policy_text.empty()) {
    auto p = sched::SnapshotPolicy::parse(policy_text);
    if (!p) {
      std::fprintf(stderr, "radixtier sim: %s\n", p.status().message().c_str());
      return 2;
    }
    opt.policy = policy_text;
  }
  auto model = sim::find_model(opt.model);
  if (!model) {
    std::fprintf(stderr, "radixtier sim: %s\n", model.status().message().c_str());
    return 2;
  }
  auto s = sim::make_scenario(scenario, *model, so);
  if (!s) {
    std::fprintf(stderr, "radixtier sim: %s\n", s.status().message().c_str());
    return 2;
  }
  sim::ProgressMeter meter(stderr, sim::ProgressMeter::stream_is_terminal(stderr));
  meter.phase(std::string("sim ") + scenario + "/" + sim::to_string(opt.cache), s->size(),
              "requests");
  opt.progress = [&](const sched::Progress& p) { meter.update(p.finished + p.failed); };
  auto r = sim::simulate(*s, opt);
  if (r) meter.update(r->requests);
  meter.finish();
  if (!r) {
    std::fprintf(stderr, "radixtier sim: %s\n", r.status().message().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", sim::to_json(*r, rows).c_str());
  } else {
    std::printf("%s: %s\ncache %s, model %s, hardware %s, policy %s, eviction %s\n\n",
                s->name.c_str(), s->description.c_str(), r->cache.c_str(), r->model.c_str(),
                r->hardware.c_str(), r->policy.c_str(), r->eviction.c_str());
    if (!s->is_trace() || rows) {
      std::printf("%-16s %9s %9s %9s %9s %10s %9s %9s %5s\n", "request", "prompt", "cached",
                  "on host", "recomp.", "reload s", "TTFT s", "floor s", "snaps");
      for (const auto& w : r->rows) {
        std::printf("%-16s %9zu %9zu %9zu %9zu %10.4f %9.3f %9.3f %5u%s%s\n", w.label.c_str(),
                    w.prompt_tokens, w.cached_tokens, w.host_cached_tokens, w.recomputed_tokens,
                    w.reload_s, w.ttft_s, w.floor_s, w.snapshots_kept,
                    w.ok ? "" : "  FAILED: ", w.error.c_str());
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
    if (s->is_trace()) {
      std::printf(
          "infinite-cache ceiling %.4f\n"
          "instances %zu (router %s), modeled utilization %.3f (busy %.3f), GPU KV %u pages "
          "per instance\n"
          "TTFT p50 %.3f s, p90 %.3f s, p99 %.3f s\n",
          r->ceiling_ratio, r->instances, r->router.c_str(), r->utilization, r->busy_utilization,
          r->config.gpu_pages, r->ttft_s_p50, r->ttft_s_p90, r->ttft_s_p99);
    }
  }
  return r->status.empty() ? 0 : 1;
}

const radixtier::cli::CommandRegistrar kSim{"sim", "replay a workload in the cost-model simulator",
                                            &run_sim};

}  // namespace
