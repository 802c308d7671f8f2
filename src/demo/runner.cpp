// Plays a workload through the Scheduler with the PrefixCache and with the no-reuse baseline,
// and compares the two runs request by request.
#include <chrono>
#include <cstring>
#include <memory>

#include "demo/scenarios.hpp"
#include "model/model_executor.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/scheduler/no_reuse_cache.hpp"

namespace radixtier::demo {

namespace {

/// The demo's virtual clock: 0.1 ms per forwarded token, so arrival-time scheduling is the
/// same on every machine (wall time is reported separately).
constexpr double kSecondsPerToken = 1e-4;

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

sched::RequestResult reference_run(const model::TinyHybridModel& model,
                                   const sched::Request& request) {
  sched::RequestResult out;
  out.id = request.id;
  out.prompt_tokens = request.prompt.size();
  const std::size_t total = request.prompt.size() + request.max_new_tokens;
  CacheConfig c;
  c.page_size = model.page_size();
  c.page_bytes = model.page_bytes();
  c.snapshot_bytes = model.state_bytes();
  c.gpu_pages = static_cast<std::uint32_t>(model.pages_for(total));
  c.gpu_snapshot_slots = 1;
  HostArenas mem(c);
  std::vector<GpuPageId> table;
  for (std::uint32_t i = 0; i < c.gpu_pages; ++i) table.emplace_back(i);
  std::vector<std::byte> state(model.state_bytes());
  model.reset_state(state);
  std::vector<float> logits(model.vocab());
  out.status = model.forward(request.prompt, 0, table, mem, state, logits);
  if (!out.status) return out;
  out.first_logits = logits;
  std::size_t pos = request.prompt.size();
  for (std::size_t i = 0; i < request.max_new_tokens; ++i) {
    const Token t = model.greedy(logits);
    out.output.push_back(t);
    if (i + 1 == request.max_new_tokens) break;
    out.status = model.forward(std::span<const Token>(&t, 1), pos++, table, mem, state, logits);
    if (!out.status) return out;
  }
  out.final_logits = logits;
  return out;
}

bool same_answer(const sched::RequestResult& a, const sched::RequestResult& b) {
  return a.status.is_ok() && b.status.is_ok() && a.output == b.output &&
         same_floats(a.first_logits, b.first_logits) &&
         same_floats(a.final_logits, b.final_logits) && !a.final_logits.empty();
}

RunOutcome run_workload(const Workload& w, const model::TinyHybridModel& model, bool reuse,
                        const ProgressFn& progress) {
  RunOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  CacheConfig c = w.cache;
  c.page_size = model.page_size();
  c.page_bytes = model.page_bytes();
  c.snapshot_bytes = model.state_bytes();
  if (Status s = c.validate(); !s) {
    out.status = s;
    return out;
  }
  HostArenas memory(c);
  HostTransferEngine engine(memory, c.slice_pages, w.engine_mode);
  for (std::uint64_t n : w.failing_submissions) engine.fail_nth_submission(n);
  std::unique_ptr<CacheBackend> cache;
  if (reuse) {
    auto made = PrefixCache::create(c, engine);
    if (!made) {
      out.status = made.status();
      return out;
    }
    cache = std::move(made).value();
  } else {
    cache = std::make_unique<sched::NoReuseCache>(c.page_size, c.gpu_pages, c.gpu_snapshot_slots);
  }
  sched::ModelExecutor executor(model, memory, {kSecondsPerToken});
  sched::SchedulerConfig sc = w.sched;
  sc.kv_bytes_per_token = c.page_bytes / c.page_size;
  {
    auto made = sched::Scheduler::create(*cache, executor, sc);
    if (!made) {
      out.status = made.status();
      return out;
    }
    sched::Scheduler& s = **made;
    for (const auto& r : w.requests) {
      if (Status st = s.submit(r); !st) {
        out.status = st;
        return out;
      }
    }
    const std::string phase = reuse ? "cache" : "no-reuse";
    out.status = s.run_until_idle([&](const sched::Progress& p) {
      if (progress) progress(phase, p);
    });
    out.results = s.results();
    out.sched = s.stats();
  }
  if (out.status) {
    if (std::string err = cache->check_invariants(); !err.empty()) {
      out.status = Status(ErrorCode::kFailedPrecondition, "cache invariant broken: " + err);
    }
  }
  out.cache = cache->stats();
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

ScenarioReport run_scenario(const Workload& w, const ProgressFn& progress) {
  ScenarioReport rep;
  rep.name = w.name;
  rep.description = w.description;
  rep.policy = w.sched.policy.name();
  if (Status s = w.model.validate(); !s) {
    rep.status = s;
    return rep;
  }
  const model::TinyHybridModel model(w.model);
  rep.snapshot_bytes = model.state_bytes();
  rep.page_bytes = model.page_bytes();
  const RunOutcome with = run_workload(w, model, true, progress);
  const RunOutcome base = run_workload(w, model, false, progress);
  rep.cache = with.cache;
  rep.sched = with.sched;
  rep.cache_wall_s = with.wall_s;
  rep.baseline_wall_s = base.wall_s;
  rep.status = !with.status ? with.status : base.status;
  rep.all_identical = rep.status.is_ok();
  rep.total.label = "total";
  rep.total.identical = true;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    const auto id = w.requests[i].id;
    Row row;
    row.label = i < w.labels.size() ? w.labels[i] : "request " + std::to_string(id);
    row.id = id;
    row.prompt_tokens = w.requests[i].prompt.size();
    auto a = with.results.find(id);
    auto b = base.results.find(id);
    if (a == with.results.end() || b == base.results.end()) {
      row.error = "no result";
    } else {
      const auto& ra = a->second;
      const auto& rb = b->second;
      row.output_tokens = ra.output.size();
      row.cached_tokens = ra.cached_tokens;
      row.host_cached_tokens = ra.host_cached_tokens;
      row.recomputed_tokens = ra.recomputed_tokens;
      row.baseline_recomputed = rb.recomputed_tokens;
      row.bytes_promoted = ra.bytes_h2d;
      row.bytes_demoted = ra.bytes_d2h;
      row.snapshots_kept = ra.snapshots_kept;
      if (!ra.status)
        row.error = "cache run: " + ra.status.to_string();
      else if (!rb.status)
        row.error = "baseline run: " + rb.status.to_string();
      row.identical = row.error.empty() && same_answer(ra, rb);
    }
    Row& t = rep.total;
    t.prompt_tokens += row.prompt_tokens;
    t.output_tokens += row.output_tokens;
    t.cached_tokens += row.cached_tokens;
    t.host_cached_tokens += row.host_cached_tokens;
    t.recomputed_tokens += row.recomputed_tokens;
    t.baseline_recomputed += row.baseline_recomputed;
    t.bytes_promoted += row.bytes_promoted;
    t.bytes_demoted += row.bytes_demoted;
    t.snapshots_kept += row.snapshots_kept;
    t.identical = t.identical && row.identical;
    rep.all_identical = rep.all_identical && row.identical;
    rep.rows.push_back(std::move(row));
  }
  return rep;
}

}  // namespace radixtier::demo
