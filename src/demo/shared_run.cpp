// The shared scenario's cache run: two processes on one Redis Cluster (shared_run.hpp).
#include "demo/shared_run.hpp"

#ifdef RADIXTIER_HAVE_SHARED

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "model/model_executor.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/shared/redis_cluster.hpp"
#include "radixtier/shared/shared_tier.hpp"
#include "shared/local_cluster.hpp"

namespace radixtier::demo {

namespace {

using nlohmann::json;

/// A trivially copyable struct as bytes and back (both processes are this binary).
template <class T>
std::vector<std::uint8_t> raw(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::uint8_t> out(sizeof v);
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}
template <class T>
T from_raw(const json& j) {
  T v{};
  const auto bytes = j.get<std::vector<std::uint8_t>>();
  if (bytes.size() == sizeof v) std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

/// Floats as their bit patterns: the comparison with the no-reuse run is bit for bit.
std::vector<std::uint32_t> bits(const std::vector<float>& f) {
  std::vector<std::uint32_t> out(f.size());
  if (!f.empty()) std::memcpy(out.data(), f.data(), f.size() * sizeof(float));
  return out;
}
std::vector<float> floats(const json& j) {
  const auto b = j.get<std::vector<std::uint32_t>>();
  std::vector<float> out(b.size());
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size() * sizeof(float));
  return out;
}

json to_json(const sched::RequestResult& r) {
  json j;
  j["id"] = r.id;
  j["ok"] = r.status.is_ok();
  j["code"] = static_cast<int>(r.status.code());
  j["message"] = r.status.message();
  j["output"] = r.output;
  j["first_logits"] = bits(r.first_logits);
  j["final_logits"] = bits(r.final_logits);
  j["counts"] = std::vector<std::uint64_t>{
      r.prompt_tokens,      r.cached_tokens,     r.kv_tokens,       r.gpu_cached_tokens,
      r.host_cached_tokens, r.recomputed_tokens, r.computed_tokens, r.bytes_h2d,
      r.bytes_d2h,          r.snapshots_kept,    r.admissions,      r.shared_tokens,
      r.shared_bytes};
  return j;
}

sched::RequestResult from_json(const json& j) {
  sched::RequestResult r;
  r.id = j["id"].get<sched::RequestId>();
  if (!j["ok"].get<bool>())
    r.status =
        Status(static_cast<ErrorCode>(j["code"].get<int>()), j["message"].get<std::string>());
  r.output = j["output"].get<std::vector<Token>>();
  r.first_logits = floats(j["first_logits"]);
  r.final_logits = floats(j["final_logits"]);
  const auto c = j["counts"].get<std::vector<std::uint64_t>>();
  if (c.size() == 13) {
    r.prompt_tokens = c[0];
    r.cached_tokens = c[1];
    r.kv_tokens = c[2];
    r.gpu_cached_tokens = c[3];
    r.host_cached_tokens = c[4];
    r.recomputed_tokens = c[5];
    r.computed_tokens = c[6];
    r.bytes_h2d = c[7];
    r.bytes_d2h = c[8];
    r.snapshots_kept = static_cast<std::uint32_t>(c[9]);
    r.admissions = static_cast<std::uint32_t>(c[10]);
    r.shared_tokens = c[11];
    r.shared_bytes = c[12];
  }
  return r;
}

/// What makes the tiny model's bytes: its layers, its weights' seed and its geometry.
shared::SharedTierConfig tier_config(const model::TinyHybridModel& model, const CacheConfig& c) {
  shared::SharedTierConfig t;
  t.model.model_id = "radixtier-tiny-hybrid/" + model.config().layers;
  t.model.weights_version = "seed-" + std::to_string(model.config().seed);
  t.model.kv_dtype = "f32";
  t.model.page_size = c.page_size;
  t.model.page_bytes = c.page_bytes;
  t.model.snapshot_bytes = c.snapshot_bytes;
  t.prefill_tokens_per_s = 1.0 / kSecondsPerToken;  // the demo's clock prices recompute
  return t;
}

/// One process's life: its requests with a shared tier on `seeds`; what it sends back.
json life(const Workload& w, const model::TinyHybridModel& model, const CacheConfig& c,
          const sched::SchedulerConfig& sc, const std::vector<std::string>& seeds, int n) {
  json j;
  auto fail = [&](const Status& s) {
    j["status"] = s.to_string();
    return j;
  };
  HostArenas memory(c);
  HostTransferEngine engine(memory, c.slice_pages, w.engine_mode);
  auto cache = PrefixCache::create(c, engine);
  if (!cache) return fail(cache.status());
  shared::RedisClusterConfig rc;
  rc.seeds = seeds;
  auto cluster = shared::RedisCluster::connect(rc);
  if (!cluster) return fail(cluster.status());
  auto tier = shared::SharedTier::create(tier_config(model, c), **cache, memory, **cluster);
  if (!tier) return fail(tier.status());
  sched::ModelExecutor executor(model, memory, {kSecondsPerToken});
  RunOutcome out;
  const std::size_t begin = n == 0 ? 0 : w.shared_before;
  const std::size_t end = n == 0 ? w.shared_before : w.requests.size();
  Status st = play(w, begin, end, **cache, executor, sc, n == 0 ? "first process" : "second", {},
                   out, tier->get());
  (*cache)->drain();  // the write-through copies land: the last request's pages publish too
  (*tier)->flush_publishes();
  if (!st) return fail(st);
  j["status"] = "ok";
  json& results = j["results"] = json::array();
  for (const auto& [id, r] : out.results) results.push_back(to_json(r));
  j["cache"] = raw((*cache)->stats());
  j["sched"] = raw(out.sched);
  j["tier"] = raw((*tier)->stats());
  return j;
}

/// Runs life n in a child process (fork: this process has no other thread now) and returns
/// what it sent.
Result<json> in_child(const Workload& w, const model::TinyHybridModel& model, const CacheConfig& c,
                      const sched::SchedulerConfig& sc, const std::vector<std::string>& seeds,
                      int n) {
  int fds[2];
  if (::pipe(fds) != 0) return Status(ErrorCode::kFailedPrecondition, "pipe() failed");
  const pid_t pid = ::fork();
  if (pid < 0) return Status(ErrorCode::kFailedPrecondition, "fork() failed");
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    std::string text;
    try {
      text = life(w, model, c, sc, seeds, n).dump();
    } catch (const std::exception& e) {
      text = json{{"status", std::string("exception: ") + e.what()}}.dump();
      code = 2;
    }
    for (std::size_t at = 0; at < text.size();) {
      const ssize_t k = ::write(fds[1], text.data() + at, text.size() - at);
      if (k <= 0) break;
      at += static_cast<std::size_t>(k);
    }
    ::_exit(code);  // no destructor of the parent's objects runs here (the cluster's)
  }
  ::close(fds[1]);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k <= 0) break;
    text.append(buf, static_cast<std::size_t>(k));
  }
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("status")) {
    return Status(ErrorCode::kFailedPrecondition, "the process " + std::to_string(n + 1) +
                                                      " of the shared scenario died (status " +
                                                      std::to_string(wstatus) + ")");
  }
  if (j["status"] != "ok") {
    return Status(ErrorCode::kFailedPrecondition,
                  "process " + std::to_string(n + 1) + ": " + j["status"].get<std::string>());
  }
  return j;
}

}  // namespace

void run_with_shared(const Workload& w, const model::TinyHybridModel& model, const CacheConfig& c,
                     const sched::SchedulerConfig& sc, RunOutcome& out) {
  std::unique_ptr<shared::LocalCluster> local;
  std::vector<std::string> seeds = w.shared_seeds;
  if (seeds.empty()) {
    auto started = shared::LocalCluster::start(3, 0);
    if (!started) {
      out.status = started.status();
      return;
    }
    local = std::move(started).value();
    seeds = local->seeds();
  }
  for (int n = 0; n < 2; ++n) {
    auto j = in_child(w, model, c, sc, seeds, n);
    if (!j) {
      out.status = j.status();
      return;
    }
    for (const json& r : (*j)["results"]) {
      sched::RequestResult res = from_json(r);
      out.results[res.id] = std::move(res);
    }
    const auto tier = from_raw<shared::SharedTierStats>((*j)["tier"]);
    const auto st = from_raw<sched::SchedulerStats>((*j)["sched"]);
    out.sched.preemptions += st.preemptions;
    out.sched.finished += st.finished;
    out.sched.failed += st.failed;
    out.sched.forwarded_tokens += st.forwarded_tokens;
    if (n == 0) {
      out.before_restart = from_raw<CacheStats>((*j)["cache"]);
      out.shared.published_keys = tier.published_keys;
      out.shared.published_bytes = tier.bytes_published;
    } else {
      out.cache = from_raw<CacheStats>((*j)["cache"]);
      out.shared.fetches = tier.fetches;
      out.shared.imports = tier.imports;
      out.shared.imported_tokens = tier.imported_tokens;
      out.shared.bytes_fetched = tier.bytes_fetched;
      out.shared.values_rejected = tier.values_rejected;
    }
  }
  out.shared.ran = true;
}

}  // namespace radixtier::demo

#else  // built without hiredis

namespace radixtier::demo {

void run_with_shared(const Workload&, const model::TinyHybridModel&, const CacheConfig&,
                     const sched::SchedulerConfig&, RunOutcome& out) {
  out.status = Status(ErrorCode::kFailedPrecondition,
                      "the shared scenario needs radixtier::shared, built with libhiredis-dev "
                      "(scripts/setup.sh)");
}

}  // namespace radixtier::demo

#endif
