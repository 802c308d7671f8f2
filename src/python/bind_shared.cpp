// The `shared` submodule: the fleet's shared tier (radixtier::shared, docs/shared-tier.md) as an
// engine written in Python builds it over its cache:
//
//   cluster = rt.shared.RedisCluster(["10.0.0.5:7000", ...])
//   tier = rt.shared.SharedTier(cache, cluster, "Qwen/Qwen3-Next-80B-A3B", weights_version=...)
//   fetched = tier.before_admit(prompt)       # before cache.admit(prompt)
//   ...                                       # serve the request
//   tier.after_finish(tokens)                 # after cache.release(lock): publish
//
// The tier's geometry (page tokens, page and snapshot bytes) is the cache's config; it reads
// and writes the host pages of the cache's engine. Its calls that touch the cache (lookup,
// finish, before_admit, after_finish, publish, pump, flush_publishes) take the cache's mutex
// with the GIL released, as the cache's own calls do; the fetch and publisher threads touch
// only their private buffers and the store. The tier keeps its cache and its store alive.
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/shared/redis_cluster.hpp"
#include "radixtier/shared/shared_tier.hpp"
#include "records.hpp"

namespace radixtier::python {

namespace {

std::chrono::milliseconds ms_from(std::int64_t v, const char* what) {
  return std::chrono::milliseconds(count_from<std::uint32_t>(v, what));
}

std::unique_ptr<shared::RedisCluster> connect_cluster(
    const std::vector<std::string>& seeds, const std::string& user, const std::string& password,
    std::int64_t connect_timeout_ms, std::int64_t breaker_failures,
    std::int64_t breaker_cooldown_ms, std::int64_t max_inflight_bytes,
    std::int64_t expected_value_bytes, std::int64_t slot_refresh_interval_ms,
    std::int64_t max_redirects, std::int64_t max_value_bytes,
    const std::vector<std::string>& auth_networks) {
  shared::RedisClusterConfig c;
  c.seeds = seeds;
  c.user = user;
  c.password = password;
  c.connect_timeout = ms_from(connect_timeout_ms, "RedisCluster: connect_timeout_ms");
  c.breaker_failures =
      count_from<std::uint32_t>(breaker_failures, "RedisCluster: breaker_failures");
  c.breaker_cooldown = ms_from(breaker_cooldown_ms, "RedisCluster: breaker_cooldown_ms");
  c.max_inflight_bytes =
      count_from<std::size_t>(max_inflight_bytes, "RedisCluster: max_inflight_bytes");
  c.expected_value_bytes =
      count_from<std::size_t>(expected_value_bytes, "RedisCluster: expected_value_bytes");
  c.slot_refresh_interval =
      ms_from(slot_refresh_interval_ms, "RedisCluster: slot_refresh_interval_ms");
  c.max_redirects = count_from<std::uint32_t>(max_redirects, "RedisCluster: max_redirects");
  c.max_value_bytes = count_from<std::size_t>(max_value_bytes, "RedisCluster: max_value_bytes");
  c.auth_networks = auth_networks;
  check(c.validate());
  Result<std::unique_ptr<shared::RedisCluster>> made = [&] {
    py::gil_scoped_release nogil;
    return shared::RedisCluster::connect(c);
  }();
  return unwrap(std::move(made));
}

class PySharedTier {
 public:
  PySharedTier(py::object cache, py::object store, const shared::SharedTierConfig& config)
      : cache_obj_(std::move(cache)), store_obj_(std::move(store)) {
    mu_ = cache_mutex(cache_obj_);
    py::object engine = cache_engine(cache_obj_);
    TransferEngine* e = host_engine_of(engine);
#ifdef RADIXTIER_PYTHON_CUDA
    if (e == nullptr) e = cuda_engine_of(engine);
#endif
    HostPages* host = e != nullptr ? e->host_memory() : nullptr;
    if (host == nullptr)
      raise_invalid(
          "SharedTier: the cache's engine has no host pages (the tier fetches into "
          "and publishes from host pages)");
    PrefixCache& c = cache_of(cache_obj_);
    auto& cluster = store_obj_.cast<shared::RedisCluster&>();
    Result<std::unique_ptr<shared::SharedTier>> made = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard lock(*mu_);
      return shared::SharedTier::create(config, c, *host, cluster);
    }();
    tier_ = unwrap(std::move(made));
  }
  ~PySharedTier() {
    close();
  }
  PySharedTier(const PySharedTier&) = delete;
  PySharedTier& operator=(const PySharedTier&) = delete;

  /// Runs f(tier) with the GIL released under the cache's mutex.
  template <class F>
  auto locked(F&& f) {
    if (!tier_) raise(Status(ErrorCode::kFailedPrecondition, "SharedTier: closed"));
    py::gil_scoped_release nogil;
    std::lock_guard lock(*mu_);
    return f(*tier_);
  }
  shared::SharedTier& tier() const {
    if (!tier_) raise(Status(ErrorCode::kFailedPrecondition, "SharedTier: closed"));
    return *tier_;
  }
  /// Stops the fetch and publisher threads (queued publishes not yet written are dropped:
  /// flush_publishes() first to keep them).
  void close() {
    if (!tier_) return;
    py::gil_scoped_release nogil;
    std::lock_guard lock(*mu_);
    tier_.reset();
  }
  const py::object& cache() const {
    return cache_obj_;
  }
  const py::object& store() const {
    return store_obj_;
  }

 private:
  py::object cache_obj_;  // keeps the cache (and its engine) alive
  py::object store_obj_;  // keeps the store alive
  std::shared_ptr<std::mutex> mu_;
  std::unique_ptr<shared::SharedTier> tier_;
};

shared::SharedTierConfig tier_config(
    py::handle cache, const std::string& model_id, const std::string& weights_version,
    const std::string& kv_dtype, std::int64_t layout_version, std::int64_t tp_rank,
    std::int64_t tp_size, const std::map<std::int64_t, std::string>& namespace_salts,
    const std::map<std::int64_t, py::bytes>& namespace_keys, bool share_default,
    std::int64_t probe_deadline_ms, std::int64_t fetch_deadline_ms,
    std::int64_t publish_deadline_ms, std::int64_t min_tokens, std::int64_t max_probe_pages,
    std::int64_t chunk_bytes, double bandwidth, double latency_s, double prefill_tokens_per_s,
    std::int64_t publish_queue_bytes, std::int64_t fetch_buffer_bytes, std::int64_t max_pending,
    std::int64_t pending_tries) {
  if (model_id.empty())
    raise_invalid("SharedTier: model_id is empty (instances share only with the same model)");
  const CacheConfig& cc = cache_of(cache).config();
  shared::SharedTierConfig c;
  c.model.model_id = model_id;
  c.model.weights_version = weights_version;
  c.model.kv_dtype = kv_dtype;
  c.model.layout_version = count_from<std::uint32_t>(layout_version, "SharedTier: layout_version");
  c.model.tp_rank = count_from<std::uint32_t>(tp_rank, "SharedTier: tp_rank");
  c.model.tp_size = count_from<std::uint32_t>(tp_size, "SharedTier: tp_size");
  if (c.model.tp_size == 0 || c.model.tp_rank >= c.model.tp_size)
    raise_invalid("SharedTier: tp_rank = " + std::to_string(tp_rank) +
                  " is not below tp_size = " + std::to_string(tp_size));
  c.model.page_size = cc.page_size;
  c.model.page_bytes = cc.page_bytes;
  c.model.snapshot_bytes = cc.snapshot_bytes;
  for (const auto& [ns, salt] : namespace_salts)
    c.namespace_salts[id_from<NamespaceId>(ns, "SharedTier: namespace_salts key").value()] = salt;
  for (const auto& [ns, key] : namespace_keys)
    c.namespace_keys[id_from<NamespaceId>(ns, "SharedTier: namespace_keys key").value()] =
        std::string(key);
  c.share_default = share_default;
  c.probe_deadline = ms_from(probe_deadline_ms, "SharedTier: probe_deadline_ms");
  c.fetch_deadline = ms_from(fetch_deadline_ms, "SharedTier: fetch_deadline_ms");
  c.publish_deadline = ms_from(publish_deadline_ms, "SharedTier: publish_deadline_ms");
  c.min_tokens = count_from<std::size_t>(min_tokens, "SharedTier: min_tokens");
  c.max_probe_pages = count_from<std::size_t>(max_probe_pages, "SharedTier: max_probe_pages");
  c.chunk_bytes = count_from<std::size_t>(chunk_bytes, "SharedTier: chunk_bytes");
  c.bandwidth = bandwidth;
  c.latency_s = latency_s;
  c.prefill_tokens_per_s = prefill_tokens_per_s;
  c.publish_queue_bytes =
      count_from<std::size_t>(publish_queue_bytes, "SharedTier: publish_queue_bytes");
  c.fetch_buffer_bytes =
      count_from<std::size_t>(fetch_buffer_bytes, "SharedTier: fetch_buffer_bytes");
  c.max_pending = count_from<std::size_t>(max_pending, "SharedTier: max_pending");
  c.pending_tries = count_from<std::uint32_t>(pending_tries, "SharedTier: pending_tries");
  check(c.validate());
  return c;
}

NamespaceId ns_from(std::int64_t v) {
  return id_from<NamespaceId>(v, "namespace");
}

}  // namespace

void bind_shared(py::module_& m) {
  Record<shared::RedisClusterStats>(m, "RedisClusterStats", "The client's counters.")
      .field("calls", &shared::RedisClusterStats::calls)
      .field("keys_found", &shared::RedisClusterStats::keys_found)
      .field("keys_missing", &shared::RedisClusterStats::keys_missing)
      .field("keys_failed", &shared::RedisClusterStats::keys_failed)
      .field("moved", &shared::RedisClusterStats::moved)
      .field("ask", &shared::RedisClusterStats::ask)
      .field("timeouts", &shared::RedisClusterStats::timeouts)
      .field("reconnects", &shared::RedisClusterStats::reconnects)
      .field("connect_errors", &shared::RedisClusterStats::connect_errors)
      .field("breaker_opens", &shared::RedisClusterStats::breaker_opens)
      .field("breaker_closes", &shared::RedisClusterStats::breaker_closes)
      .field("bytes_read", &shared::RedisClusterStats::bytes_read)
      .field("bytes_written", &shared::RedisClusterStats::bytes_written)
      .field("slot_map_refreshes", &shared::RedisClusterStats::slot_map_refreshes)
      .field("protocol_errors", &shared::RedisClusterStats::protocol_errors)
      .field("internal_errors", &shared::RedisClusterStats::internal_errors)
      .done(/*counters=*/true);

  py::class_<shared::RedisCluster>(
      m, "RedisCluster",
      "A Redis 7 Cluster client (plain TCP, a RESP client of radixtier's own): slot routing, "
      "MOVED/ASK, a breaker per shard, deadlines on every call (docs/shared-tier.md).")
      .def(py::init(&connect_cluster), py::arg("seeds"), py::kw_only(), py::arg("user") = "",
           py::arg("password") = "", py::arg("connect_timeout_ms") = 500,
           py::arg("breaker_failures") = 3, py::arg("breaker_cooldown_ms") = 1000,
           py::arg("max_inflight_bytes") = 8 << 20, py::arg("expected_value_bytes") = 1 << 20,
           py::arg("slot_refresh_interval_ms") = 100, py::arg("max_redirects") = 5,
           py::arg("max_value_bytes") = std::int64_t{512} << 20,
           py::arg("auth_networks") = std::vector<std::string>{},
           "Validates the options (InvalidArgumentError names the first bad one), asks CLUSTER "
           "SLOTS of the first seed (\"host:port\") that answers and builds the slot map.")
      .def("stats", &shared::RedisCluster::stats)
      .def(
          "shards",
          [](const shared::RedisCluster& c) {
            std::vector<std::pair<std::string, std::string>> out;
            for (const auto& s : c.shards()) out.emplace_back(s.address, to_string(s.breaker));
            return out;
          },
          "(address, breaker state) of every shard the client knows")
      .def("describe", &shared::RedisCluster::describe, "the config, password masked")
      .def("__repr__",
           [](const shared::RedisCluster& c) { return "<RedisCluster " + c.describe() + ">"; });

  Record<sched::SharedFetch>(m, "SharedFetch", "What a fetch entered into the cache.")
      .field("tokens", &sched::SharedFetch::tokens,
             "the boundary the cache can now resume at thanks to it (0: none)")
      .field("bytes", &sched::SharedFetch::bytes, "bytes fetched")
      .field("seconds", &sched::SharedFetch::seconds, "the wait for the lookup and the fetch")
      .done();

  Record<shared::SharedTierStats>(m, "SharedTierStats", "The shared tier's counters.")
      .field("lookups", &shared::SharedTierStats::lookups)
      .field("probe_failures", &shared::SharedTierStats::probe_failures)
      .field("probe_keys", &shared::SharedTierStats::probe_keys)
      .field("fetches", &shared::SharedTierStats::fetches)
      .field("fetches_refused", &shared::SharedTierStats::fetches_refused)
      .field("fetches_abandoned", &shared::SharedTierStats::fetches_abandoned)
      .field("fetch_failures", &shared::SharedTierStats::fetch_failures)
      .field("fallbacks", &shared::SharedTierStats::fallbacks)
      .field("imports", &shared::SharedTierStats::imports)
      .field("import_refused", &shared::SharedTierStats::import_refused)
      .field("imported_pages", &shared::SharedTierStats::imported_pages)
      .field("imported_snapshots", &shared::SharedTierStats::imported_snapshots)
      .field("imported_tokens", &shared::SharedTierStats::imported_tokens)
      .field("bytes_fetched", &shared::SharedTierStats::bytes_fetched)
      .field("values_rejected", &shared::SharedTierStats::values_rejected)
      .field("values_missing", &shared::SharedTierStats::values_missing)
      .field("publish_jobs", &shared::SharedTierStats::publish_jobs)
      .field("publish_dropped", &shared::SharedTierStats::publish_dropped)
      .field("publish_failures", &shared::SharedTierStats::publish_failures)
      .field("published_keys", &shared::SharedTierStats::published_keys)
      .field("publish_skipped", &shared::SharedTierStats::publish_skipped)
      .field("bytes_published", &shared::SharedTierStats::bytes_published)
      .done(/*counters=*/true);

  py::class_<PySharedTier>(
      m, "SharedTier",
      "One instance's shared tier over a PrefixCache: lookup and fetch on a local miss (into "
      "host pages, then promoted like any host node), publish what a request computed. Run "
      "the cache with WritePolicy.WRITE_THROUGH so what a request inserts has host copies to "
      "publish.")
      .def(py::init([](py::object cache, py::object store, const std::string& model_id,
                       const std::string& weights_version, const std::string& kv_dtype,
                       std::int64_t layout_version, std::int64_t tp_rank, std::int64_t tp_size,
                       const std::map<std::int64_t, std::string>& namespace_salts,
                       const std::map<std::int64_t, py::bytes>& namespace_keys, bool share_default,
                       std::int64_t probe_deadline_ms, std::int64_t fetch_deadline_ms,
                       std::int64_t publish_deadline_ms, std::int64_t min_tokens,
                       std::int64_t max_probe_pages, std::int64_t chunk_bytes, double bandwidth,
                       double latency_s, double prefill_tokens_per_s,
                       std::int64_t publish_queue_bytes, std::int64_t fetch_buffer_bytes,
                       std::int64_t max_pending, std::int64_t pending_tries) {
             // The cache type is checked by cache_of (a cast error names it).
             try {
               (void)cache_of(cache);
             } catch (const py::cast_error&) {
               throw py::type_error("SharedTier: cache must be a PrefixCache, got " +
                                    std::string(py::str(py::type::of(cache))));
             }
             if (!py::isinstance<shared::RedisCluster>(store)) {
               throw py::type_error("SharedTier: store must be a shared.RedisCluster, got " +
                                    std::string(py::str(py::type::of(store))));
             }
             const shared::SharedTierConfig c = tier_config(
                 cache, model_id, weights_version, kv_dtype, layout_version, tp_rank, tp_size,
                 namespace_salts, namespace_keys, share_default, probe_deadline_ms,
                 fetch_deadline_ms, publish_deadline_ms, min_tokens, max_probe_pages, chunk_bytes,
                 bandwidth, latency_s, prefill_tokens_per_s, publish_queue_bytes,
                 fetch_buffer_bytes, max_pending, pending_tries);
             return std::make_unique<PySharedTier>(std::move(cache), std::move(store), c);
           }),
           py::arg("cache"), py::arg("store"), py::arg("model_id"), py::kw_only(),
           py::arg("weights_version") = "", py::arg("kv_dtype") = "", py::arg("layout_version") = 1,
           py::arg("tp_rank") = 0, py::arg("tp_size") = 1,
           py::arg("namespace_salts") = std::map<std::int64_t, std::string>{},
           py::arg("namespace_keys") = std::map<std::int64_t, py::bytes>{},
           py::arg("share_default") = true, py::arg("probe_deadline_ms") = 20,
           py::arg("fetch_deadline_ms") = 2000, py::arg("publish_deadline_ms") = 5000,
           py::arg("min_tokens") = 256, py::arg("max_probe_pages") = 4096,
           py::arg("chunk_bytes") = 4 << 20, py::arg("bandwidth") = 2e9,
           py::arg("latency_s") = 0.0005, py::arg("prefill_tokens_per_s") = 20000.0,
           py::arg("publish_queue_bytes") = std::int64_t{1} << 30,
           py::arg("fetch_buffer_bytes") = std::int64_t{512} << 20, py::arg("max_pending") = 64,
           py::arg("pending_tries") = 8,
           "The model fingerprint is model_id, weights_version, kv_dtype, layout_version, the "
           "TP rank and size, and the cache's geometry: instances share only when all are "
           "equal. namespace_salts {namespace: salt} shares more namespaces than the default "
           "one; namespace_keys {namespace: bytes of 16-64} keys them (docs/shared-tier.md, "
           "Security).")
      .def_property_readonly("cache", &PySharedTier::cache)
      .def_property_readonly("store", &PySharedTier::store)
      .def(
          "lookup",
          [](PySharedTier& t, const py::object& prompt, std::int64_t ns) {
            TokenArg p(prompt, "prompt");
            const NamespaceId n = ns_from(ns);
            return t.locked([&](shared::SharedTier& s) { return s.lookup(p.span(), n); });
          },
          py::arg("prompt"), py::kw_only(), py::arg("namespace") = 0,
          "Probes for the prompt (at most probe_deadline) and starts the fetch worth making; "
          "returns its id, 0 when none.")
      .def(
          "ready",
          [](PySharedTier& t, std::int64_t id) {
            return t.tier().ready(count_from<std::uint64_t>(id, "fetch id"));
          },
          py::arg("fetch"), "True when the fetch has ended (never blocks).")
      .def(
          "finish",
          [](PySharedTier& t, std::int64_t id) {
            const auto f = count_from<std::uint64_t>(id, "fetch id");
            return t.locked([&](shared::SharedTier& s) { return s.finish(f); });
          },
          py::arg("fetch"),
          "Waits for the fetch (at most its deadline) and enters what arrived whole into the "
          "cache as host-resident nodes.")
      .def(
          "before_admit",
          [](PySharedTier& t, const py::object& prompt, std::int64_t ns) {
            TokenArg p(prompt, "prompt");
            const NamespaceId n = ns_from(ns);
            return t.locked([&](shared::SharedTier& s) { return s.before_admit(0, p.span(), n); });
          },
          py::arg("prompt"), py::kw_only(), py::arg("namespace") = 0,
          "lookup() + finish(): call it before cache.admit(prompt).")
      .def(
          "after_finish",
          [](PySharedTier& t, const py::object& tokens, std::int64_t ns) {
            TokenArg p(tokens);
            const NamespaceId n = ns_from(ns);
            t.locked([&](shared::SharedTier& s) {
              s.after_finish(0, p.span(), n);
              return 0;
            });
          },
          py::arg("tokens"), py::kw_only(), py::arg("namespace") = 0,
          "After a request released its lock: publishes what the cache holds on host along "
          "`tokens` (what it inserted), and retries waiting publishes.")
      .def(
          "publish",
          [](PySharedTier& t, const py::object& tokens, std::int64_t ns) {
            TokenArg p(tokens);
            const NamespaceId n = ns_from(ns);
            t.locked([&](shared::SharedTier& s) {
              s.publish(p.span(), n);
              return 0;
            });
          },
          py::arg("tokens"), py::kw_only(), py::arg("namespace") = 0,
          "Queues the cache's host copies along `tokens` for publishing.")
      .def(
          "pump",
          [](PySharedTier& t) {
            t.locked([](shared::SharedTier& s) {
              s.pump();
              return 0;
            });
          },
          "Retries the publishes waiting for host copies.")
      .def(
          "flush_publishes",
          [](PySharedTier& t) {
            t.locked([](shared::SharedTier& s) {
              s.flush_publishes();
              return 0;
            });
          },
          "Waits until every queued publish was written (a graceful shutdown, tests).")
      .def("stats", [](PySharedTier& t) { return t.tier().stats(); })
      .def("close", &PySharedTier::close,
           "Stops the tier's threads (call flush_publishes() first to keep queued publishes).");
}

}  // namespace radixtier::python
