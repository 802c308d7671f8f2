// Plays a workload through the Scheduler with the PrefixCache and with the no-reuse baseline,
// and compares the two runs request by request.
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>

#include "demo/scenarios.hpp"
#include "demo/shared_run.hpp"
#include "model/model_executor.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_store_engine.hpp"
#include "radixtier/scheduler/no_reuse_cache.hpp"

namespace radixtier::demo {

namespace {

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// The disk store's directory of a restart run: made under the system's temp directory,
/// removed with everything in it when the run ends.
class StoreDir {
 public:
  StoreDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "radixtier-demo-store-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~StoreDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  StoreDir(const StoreDir&) = delete;
  StoreDir& operator=(const StoreDir&) = delete;
  /// "" when mkdtemp failed.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The tiny model's store: its geometry and weights, room for every page and snapshot the
/// GPU and host pools can hold (what persist() may write).
disk::DiskStoreConfig demo_store_config(const std::string& dir, const CacheConfig& c,
                                        const model::TinyHybridModel& model) {
  disk::DiskStoreConfig d;
  d.directory = dir + "/store";
  d.fingerprint.page_tokens = c.page_size;
  d.fingerprint.page_bytes = c.page_bytes;
  d.fingerprint.snapshot_bytes = c.snapshot_bytes;
  d.fingerprint.model_id = "radixtier-tiny-hybrid/" + model.config().layers;
  d.fingerprint.weights_version = "seed-" + std::to_string(model.config().seed);
  const std::uint64_t slots =
      std::uint64_t{c.gpu_pages} + c.host_pool_pages() +
      std::uint64_t{c.gpu_snapshot_slots + c.host_snapshot_slots} * c.snapshot_pages();
  d.budget_bytes = slots * c.page_bytes;
  return d;
}

void add_stats(sched::SchedulerStats& to, const sched::SchedulerStats& s) {
  to.steps += s.steps;
  to.admissions += s.admissions;
  to.transfer_failures += s.transfer_failures;
  to.preemptions += s.preemptions;
  to.stalls += s.stalls;
  to.finished += s.finished;
  to.failed += s.failed;
  to.forwarded_tokens += s.forwarded_tokens;
  to.snapshots_offered += s.snapshots_offered;
  to.snapshots_kept += s.snapshots_kept;
  to.snapshot_slot_misses += s.snapshot_slot_misses;
  to.snapshots_captured += s.snapshots_captured;
  to.copy_wait_s += s.copy_wait_s;
  to.store_wait_s += s.store_wait_s;
}

/// The cache run of a workload with a restart: requests before w.restart_before, persist(),
/// then the cache, its disk store and the engine and memory destroyed (a process exit), then
/// everything made afresh on the same store directory for the rest.
void run_with_restart(const Workload& w, const model::TinyHybridModel& model, const CacheConfig& c,
                      const sched::SchedulerConfig& sc, const ProgressFn& progress,
                      RunOutcome& out) {
  const StoreDir dir;
  if (dir.path().empty()) {
    out.status = Status(ErrorCode::kTransferFailed, "cannot make a temporary store directory");
    return;
  }
  const disk::DiskStoreConfig dc = demo_store_config(dir.path(), c, model);
  for (int life = 0; life < 2; ++life) {
    HostArenas memory(c);
    HostTransferEngine engine(memory, c.slice_pages, w.engine_mode);
    if (life == 0) {
      for (std::uint64_t n : w.failing_submissions) engine.fail_nth_submission(n);
    }
    auto store = disk::DiskStore::open(dc);
    if (!store) {
      out.status = store.status();
      return;
    }
    disk::DiskStoreEngine store_engine(**store, memory);
    auto cache = PrefixCache::create(c, engine, &store_engine);
    if (!cache) {
      out.status = cache.status();
      return;
    }
    sched::ModelExecutor executor(model, memory, {kSecondsPerToken});
    const std::size_t begin = life == 0 ? 0 : w.restart_before;
    const std::size_t end = life == 0 ? w.restart_before : w.requests.size();
    out.status = play(w, begin, end, **cache, executor, sc,
                      life == 0 ? "cache" : "cache after restart", progress, out);
    if (out.status && life == 0) out.status = (*cache)->persist();  // the disk holds it all
    if (out.status && life == 0) {
      if (std::string err = (*cache)->check_invariants(); !err.empty()) {
        out.status = Status(ErrorCode::kFailedPrecondition, "cache invariant broken: " + err);
      }
    }
    if (life == 0) {
      out.before_restart = (*cache)->stats();
    } else {
      out.cache = (*cache)->stats();
    }
    if (!out.status) return;
  }
  out.restarted = true;
}

}  // namespace

/// One process's life: requests [begin, end) of `w` through a scheduler over `cache`
/// (the demo's virtual clock: 0.1 ms per forwarded token, so arrival-time scheduling is the
/// same on every machine; wall time is reported separately); their results go to `out`.
Status play(const Workload& w, std::size_t begin, std::size_t end, CacheBackend& cache,
            sched::Executor& executor, const sched::SchedulerConfig& sc, const std::string& phase,
            const ProgressFn& progress, RunOutcome& out, sched::SharedHook* shared) {
  auto made = sched::Scheduler::create(cache, executor, sc);
  if (!made) return made.status();
  sched::Scheduler& s = **made;
  s.set_shared_hook(shared);
  for (std::size_t i = begin; i < end; ++i) {
    if (Status st = s.submit(w.requests[i]); !st) return st;
  }
  Status st = s.run_until_idle([&](const sched::Progress& p) {
    if (progress) progress(phase, p);
  });
  for (const auto& [id, r] : s.results()) out.results[id] = r;
  add_stats(out.sched, s.stats());
  if (!st) return st;
  if (std::string err = cache.check_invariants(); !err.empty()) {
    return Status(ErrorCode::kFailedPrecondition, "cache invariant broken: " + err);
  }
  return Status::ok();
}

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
  sched::SchedulerConfig sc = w.sched;
  sc.kv_bytes_per_token = c.page_bytes / c.page_size;
  if (reuse && w.shared_before > 0) {
    run_with_shared(w, model, c, sc, out);
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  if (reuse && w.restart_before > 0) {
    run_with_restart(w, model, c, sc, progress, out);
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  out.status = play(w, 0, w.requests.size(), *cache, executor, sc, reuse ? "cache" : "no-reuse",
                    progress, out);
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
  rep.restarted = with.restarted;
  rep.before_restart = with.before_restart;
  rep.shared = with.shared;
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
      row.shared_tokens = ra.shared_tokens;
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
