// The simulator (see simulator.hpp).
#include "sim/simulator.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "baseline/index_tier_cache.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "sim/block_lru_ideal.hpp"
#include "sim/cost_executor.hpp"
#include "sim/counting_transfer_engine.hpp"

namespace radixtier::sim {

const char* to_string(CacheKind kind) {
  switch (kind) {
    case CacheKind::kNode:
      return "node";
    case CacheKind::kIndex:
      return "index";
    case CacheKind::kGpuOnly:
      return "gpu-only";
    case CacheKind::kIdeal:
      return "ideal";
  }
  return "?";
}

Result<CacheKind> parse_cache_kind(std::string_view text) {
  for (CacheKind k :
       {CacheKind::kNode, CacheKind::kIndex, CacheKind::kGpuOnly, CacheKind::kIdeal}) {
    if (text == to_string(k)) return k;
  }
  return invalid_argument("unknown cache '" + std::string(text) +
                          "' (known: node, index, gpu-only, ideal)");
}

namespace {

double floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                     std::size_t prompt) {
  const std::uint64_t bytes =
      reusable == 0 ? 0 : reusable * m.kv_bytes_per_token() + m.snapshot_bytes();
  return ttft_seconds(
      hw, reload_seconds(hw, 0, bytes),
      prefill_seconds(hw, static_cast<double>(reusable), static_cast<double>(prompt)));
}

void finish_totals(SimResult& out) {
  for (const RequestRow& row : out.rows) {
    out.input_tokens += row.prompt_tokens;
    if (!row.ok) {
      ++out.failed;
      continue;
    }
    out.cached_tokens += row.cached_tokens;
    out.recomputed_tokens += row.recomputed_tokens;
    out.ttft_s_total += row.ttft_s;
  }
  out.requests = out.rows.size();
  out.hit_ratio = out.input_tokens == 0 ? 0.0
                                        : static_cast<double>(out.cached_tokens) /
                                              static_cast<double>(out.input_tokens);
  if (!out.rows.empty()) {
    const RequestRow& last = out.rows.back();
    out.ttft_s_last = last.ttft_s;
    out.floor_s_last = last.floor_s;
    out.cached_tokens_last = last.cached_tokens;
    out.recomputed_tokens_last = last.recomputed_tokens;
  }
}

std::uint64_t total_bytes(const CacheConfig& c) {
  return (std::uint64_t{c.gpu_pages} + c.host_pages) * c.page_bytes +
         (std::uint64_t{c.gpu_snapshot_slots} + c.host_snapshot_slots) * c.snapshot_bytes;
}

Result<SimResult> simulate_ideal(const Scenario& s, const ModelGeometry& m,
                                 const HardwarePreset& hw, SimResult out) {
  if (!s.is_trace()) {
    return invalid_argument("cache 'ideal' is the trace's reference column: scenario '" + s.name +
                            "' is not a trace");
  }
  BlockLruIdeal ideal(
      total_bytes(out.config) / (std::uint64_t{kTraceBlockTokens} * m.kv_bytes_per_token()),
      s.page_size);
  out.rows.reserve(s.trace.size());
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const TraceRequest& t = s.trace[i];
    RequestRow row;
    row.id = i + 1;
    row.label = "request " + std::to_string(i + 1);
    row.prompt_tokens = t.input_length;
    row.output_tokens = t.output_length;
    row.cached_tokens = ideal.access(t);
    row.recomputed_tokens = row.prompt_tokens - row.cached_tokens;
    row.bytes_h2d = row.cached_tokens * m.kv_bytes_per_token();
    row.reload_s = reload_seconds(hw, 0, row.bytes_h2d);
    row.prefill_s = prefill_seconds(hw, static_cast<double>(row.cached_tokens),
                                    static_cast<double>(row.prompt_tokens));
    row.ttft_s = ttft_seconds(hw, row.reload_s, row.prefill_s);  // no queueing modeled
    out.rows.push_back(std::move(row));
  }
  out.policy = std::string(1, '-');
  out.eviction = std::string("lru-blocks");
  finish_totals(out);
  return out;
}

}  // namespace

Result<SimResult> simulate(const Scenario& s, const SimOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  auto model = find_model(o.model);
  if (!model) return model.status();
  auto hw = find_hardware(o.hardware);
  if (!hw) return hw.status();

  SimResult out;
  out.scenario = s.name;
  out.cache = to_string(o.cache);
  out.model = std::string(model->name);
  out.hardware = std::string(hw->name);
  out.config = cache_config(s.budget, *model, s.page_size);
  out.config.snapshot_eviction = o.eviction;
  out.config.write_policy = o.write_policy;
  out.total_budget_bytes = total_bytes(out.config);
  if (s.is_trace()) out.ceiling_ratio = infinite_cache_ceiling(s.trace).ratio();
  if (o.cache == CacheKind::kIdeal) {
    auto r = simulate_ideal(s, *model, *hw, std::move(out));
    if (r)
      r->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }

  CacheConfig config = out.config;
  if (o.cache == CacheKind::kGpuOnly) {
    config.host_pages = 0;
    config.host_snapshot_slots = 0;
    config.write_policy = WritePolicy::kWriteBack;
  }
  auto policy = sched::SnapshotPolicy::parse(
      !o.policy.empty() ? o.policy : (o.cache == CacheKind::kNode ? kDefaultPolicy : "end-only"));
  if (!policy) return policy.status();
  CountingTransferEngine engine(config);
  std::unique_ptr<CacheBackend> cache;
  if (o.cache == CacheKind::kNode) {
    auto c = PrefixCache::create(config, engine);
    if (!c) return c.status();
    cache = std::move(*c);
  } else {
    auto c = index_tier::IndexTierCache::create(config, engine);
    if (!c) return c.status();
    cache = std::move(*c);
  }

  sched::SchedulerConfig sc;
  sc.chunk_tokens = s.chunk_tokens;
  sc.max_running = s.max_running;
  sc.policy = *policy;
  sc.max_admissions = 64;
  sc.check_invariants = o.check_invariants;
  sc.kv_bytes_per_token = model->kv_bytes_per_token();
  out.policy = policy->name();
  out.eviction = o.cache == CacheKind::kNode ? radixtier::to_string(o.eviction) : "lru";

  CostExecutorOptions eo;
  eo.decode_step_s = o.decode_step_s;
  eo.decode_batch = s.max_running;
  eo.gpu_slots = config.gpu_snapshot_slots;
  CostExecutor executor(*hw, model->snapshot_bytes(), eo);
  auto made = sched::Scheduler::create(*cache, executor, sc);
  if (!made) return made.status();
  sched::Scheduler& sched = **made;

  // Submit lazily (a trace's prompts are synthesized when they are about to arrive): before
  // each step, everything that has arrived, and when idle everything that arrives at the
  // next arrival time, so the scheduler sees exactly what it would with all of it queued.
  const std::size_t n = s.size();
  auto arrival = [&](std::size_t i) {
    return s.is_trace() ? static_cast<double>(s.trace[i].timestamp_ms) / 1000.0
                        : s.requests[i].request.arrival_s;
  };
  auto request = [&](std::size_t i) {
    return s.is_trace() ? trace_request(s, i) : s.requests[i].request;
  };
  std::size_t next = 0;
  Status run_status;
  for (;;) {
    if (next < n && sched.idle()) {
      const double t = std::max(arrival(next), sched.now());
      while (next < n && arrival(next) <= t) (void)sched.submit(request(next++));
    }
    while (next < n && arrival(next) <= sched.now()) (void)sched.submit(request(next++));
    if (sched.idle()) break;
    if (Status st = sched.step(); !st) {
      run_status = st;
      break;
    }
    if (o.progress && sched.stats().steps % 4096 == 0) {
      sched::Progress p;
      p.submitted = n;
      p.finished = sched.stats().finished;
      p.failed = sched.stats().failed;
      p.running = sched.running();
      p.queued = sched.queued();
      p.forwarded_tokens = sched.stats().forwarded_tokens;
      p.now_s = sched.now();
      o.progress(p);
    }
  }
  if (!run_status) out.status = run_status.to_string();

  out.rows.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    RequestRow row;
    row.id = s.is_trace() ? i + 1 : s.requests[i].request.id;
    row.label = s.is_trace() ? "request " + std::to_string(i + 1) : s.requests[i].label;
    row.prompt_tokens =
        s.is_trace() ? s.trace[i].input_length : s.requests[i].request.prompt.size();
    row.reusable_tokens = s.is_trace() ? 0 : s.requests[i].reusable_tokens;
    const sched::RequestResult* res = sched.result(row.id);
    if (res == nullptr) {
      row.ok = false;
      row.error = "not finished";
    } else {
      row.ok = res->status.is_ok();
      if (!row.ok) row.error = res->status.to_string();
      row.output_tokens = res->output.size();
      row.cached_tokens = res->cached_tokens;
      row.gpu_cached_tokens = res->gpu_cached_tokens;
      row.host_cached_tokens = res->host_cached_tokens;
      row.recomputed_tokens = res->recomputed_tokens;
      row.bytes_h2d = res->admit_bytes_h2d;
      row.copies_h2d = res->admit_copies_h2d;
      row.reload_s = reload_seconds(*hw, row.copies_h2d, row.bytes_h2d);
      row.prefill_s = res->prefill_s;
      row.queue_s = res->queue_s();
      row.ttft_s =
          ttft_seconds(*hw, row.reload_s,
                       s.include_queue ? res->first_token_s - res->arrival_s : res->prefill_s);
      row.snapshots_kept = res->snapshots_kept;
      row.preemptions = res->preemptions;
      out.snapshots_kept += res->snapshots_kept;
    }
    if (!s.is_trace()) {
      row.floor_s = floor_seconds(*hw, *model, row.reusable_tokens, row.prompt_tokens);
    }
    out.rows.push_back(std::move(row));
  }
  out.stats = cache->stats();
  out.sched = sched.stats();
  out.placement_alignment = sched.learner().alignment();
  out.keep_finish = sched.learner().keep_finish();
  out.bytes_h2d = out.stats.bytes_h2d;
  out.bytes_d2h = out.stats.bytes_d2h;
  out.host_bytes_peak = out.stats.host_bytes_peak;
  out.sim_clock_s = sched.now();
  finish_totals(out);
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

std::string to_json(const SimResult& r, bool rows) {
  std::ostringstream o;
  o << "{\"scenario\": \"" << esc(r.scenario) << "\", \"cache\": \"" << esc(r.cache)
    << "\", \"model\": \"" << esc(r.model) << "\", \"hardware\": \"" << esc(r.hardware)
    << "\", \"policy\": \"" << esc(r.policy) << "\", \"eviction\": \"" << esc(r.eviction)
    << "\", \"requests\": " << r.requests << ", \"failed\": " << r.failed
    << ", \"input_tokens\": " << r.input_tokens << ", \"cached_tokens\": " << r.cached_tokens
    << ", \"hit_ratio\": " << num(r.hit_ratio) << ", \"recomputed_tokens\": " << r.recomputed_tokens
    << ", \"ttft_s_total\": " << num(r.ttft_s_total) << ", \"ttft_s_last\": " << num(r.ttft_s_last)
    << ", \"floor_s_last\": " << num(r.floor_s_last)
    << ", \"cached_tokens_last\": " << r.cached_tokens_last
    << ", \"recomputed_tokens_last\": " << r.recomputed_tokens_last
    << ", \"bytes_h2d\": " << r.bytes_h2d << ", \"bytes_d2h\": " << r.bytes_d2h
    << ", \"host_bytes_peak\": " << r.host_bytes_peak
    << ", \"snapshots_kept\": " << r.snapshots_kept
    << ", \"total_budget_bytes\": " << r.total_budget_bytes
    << ", \"ceiling_ratio\": " << num(r.ceiling_ratio)
    << ", \"sim_clock_s\": " << num(r.sim_clock_s) << ", \"wall_s\": " << num(r.wall_s)
    << ", \"config\": {\"page_size\": " << r.config.page_size
    << ", \"gpu_pages\": " << r.config.gpu_pages << ", \"host_pages\": " << r.config.host_pages
    << ", \"gpu_snapshot_slots\": " << r.config.gpu_snapshot_slots
    << ", \"host_snapshot_slots\": " << r.config.host_snapshot_slots
    << ", \"page_bytes\": " << r.config.page_bytes
    << ", \"snapshot_bytes\": " << r.config.snapshot_bytes << "}"
    << ", \"snapshots_dropped\": " << r.stats.snapshots_dropped
    << ", \"preemptions\": " << r.sched.preemptions
    << ", \"snapshot_slot_misses\": " << r.sched.snapshot_slot_misses
    << ", \"placement_alignment\": " << r.placement_alignment
    << ", \"keep_finish\": " << (r.keep_finish ? "true" : "false") << ", \"status\": \""
    << esc(r.status) << "\"";
  if (rows) {
    o << ", \"rows\": [";
    for (std::size_t i = 0; i < r.rows.size(); ++i) {
      const RequestRow& w = r.rows[i];
      o << (i ? ", " : "") << "{\"label\": \"" << esc(w.label)
        << "\", \"ok\": " << (w.ok ? "true" : "false") << ", \"prompt_tokens\": " << w.prompt_tokens
        << ", \"output_tokens\": " << w.output_tokens << ", \"cached_tokens\": " << w.cached_tokens
        << ", \"host_cached_tokens\": " << w.host_cached_tokens
        << ", \"recomputed_tokens\": " << w.recomputed_tokens
        << ", \"reusable_tokens\": " << w.reusable_tokens << ", \"bytes_h2d\": " << w.bytes_h2d
        << ", \"reload_s\": " << num(w.reload_s) << ", \"prefill_s\": " << num(w.prefill_s)
        << ", \"queue_s\": " << num(w.queue_s) << ", \"ttft_s\": " << num(w.ttft_s)
        << ", \"floor_s\": " << num(w.floor_s) << ", \"snapshots_kept\": " << w.snapshots_kept
        << ", \"error\": \"" << esc(w.error) << "\"}";
    }
    o << "]";
  }
  o << "}";
  return o.str();
}

}  // namespace radixtier::sim
