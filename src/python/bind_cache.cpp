// PrefixCache: every call of the CacheBackend interface plus match, stats, occupancy,
// check_invariants, poll, drain and drop_host.
//
// Threading: the C++ cache is not thread-safe, and every call here releases the GIL (admit,
// alloc_pages and insert may wait for copies; wait and drain do), so each cache carries a
// mutex taken with the GIL released: Python threads may share one cache safely. Arguments
// are converted before the GIL is released and results after it is taken back, so no Python
// object is touched without it.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <unordered_set>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "records.hpp"

namespace radixtier::python {

namespace {

/// The engine behind a Python engine object, or a TypeError naming the accepted ones.
TransferEngine& engine_of(py::handle engine) {
  if (TransferEngine* e = host_engine_of(engine)) return *e;
#ifdef RADIXTIER_PYTHON_CUDA
  if (TransferEngine* e = cuda_engine_of(engine)) return *e;
  constexpr const char* kAccepted = "a HostTransferEngine or a cuda.CudaTransferEngine";
#else
  constexpr const char* kAccepted = "a HostTransferEngine";
#endif
  throw py::type_error(std::string("PrefixCache: engine must be ") + kAccepted + ", got " +
                       std::string(py::str(py::type::of(engine))));
}

/// The engines serving a PrefixCache now (touched with the GIL held; never destroyed, so a
/// cache collected at exit finds it). A cache owns its engine's pools: a second cache over
/// one engine would hand out the same page ids, and each would serve the other's bytes.
std::unordered_set<const TransferEngine*>& engines_in_use() {
  static auto* const in_use = new std::unordered_set<const TransferEngine*>();
  return *in_use;
}

struct PyInsertResult {
  py::array_t<std::int64_t> not_taken;
  bool snapshot_taken = false;
};

class PyPrefixCache {
 public:
  PyPrefixCache(const CacheConfig& config, py::object engine, py::object store)
      : engine_obj_(std::move(engine)), store_obj_(std::move(store)) {
    TransferEngine& e = engine_of(engine_obj_);
    // The store engine must be built over this engine's host pages and serve no other
    // cache; it then takes this cache's mutex for its own queries.
    StoreEngine* st = store_obj_.is_none() ? nullptr : attach_store(store_obj_, engine_obj_, mu_);
    // The engine is claimed before create() lets the GIL go: a thread building a cache over
    // the same engine meanwhile finds it taken.
    if (!engines_in_use().insert(&e).second) {
      if (st != nullptr) detach_store(store_obj_);
      raise_invalid(
          "PrefixCache: this engine already serves a PrefixCache (one cache per engine: the "
          "cache hands out the engine's pages and slots); drop that cache first (`cache = "
          "None`: a new cache assigned to the same name is built before the old one goes), "
          "or build another engine over other arenas");
    }
    engine_ = &e;
    // create() validates the config and checks it against the engine's pools (and the
    // store's geometry); with a store it rebuilds the tree from the store's records.
    Result<std::unique_ptr<PrefixCache>> made = [&] {
      py::gil_scoped_release nogil;
      return PrefixCache::create(config, e, st);
    }();
    if (!made.is_ok()) {
      engines_in_use().erase(&e);
      if (st != nullptr) detach_store(store_obj_);
    }
    cache_ = unwrap(std::move(made));
  }
  ~PyPrefixCache() {
    // The cache's destructor waits for its copies: let the engine's threads run meanwhile.
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(*mu_);
      cache_.reset();
    }
    if (!store_obj_.is_none()) detach_store(store_obj_);
    engines_in_use().erase(engine_);
  }
  PyPrefixCache(const PyPrefixCache&) = delete;
  PyPrefixCache& operator=(const PyPrefixCache&) = delete;

  /// Runs f(cache) with the GIL released and the cache's mutex held.
  template <class F>
  auto locked(F&& f) {
    py::gil_scoped_release nogil;
    std::lock_guard lock(*mu_);
    return f(*cache_);
  }
  /// Same, for cheap const queries that never wait: the GIL stays held (no other Python
  /// thread can run), the mutex still excludes a thread inside a GIL-free call.
  template <class F>
  auto query(F&& f) const {
    std::unique_lock lock(*mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      py::gil_scoped_release nogil;
      lock.lock();
    }
    return f(*cache_);
  }

  const py::object& engine() const { return engine_obj_; }
  const py::object& store() const { return store_obj_; }
  PrefixCache& cache() { return *cache_; }
  const std::shared_ptr<std::mutex>& mutex() const { return mu_; }

 private:
  py::object engine_obj_;  // keeps the engine (and through it the arenas) alive
  py::object store_obj_;   // keeps the store engine (and its store) alive; None: no store
  std::unique_ptr<PrefixCache> cache_;
  const TransferEngine* engine_ = nullptr;  // in engines_in_use() while cache_ lives
  // Shared with the store engine (its queries take it) and the tiers built on this cache.
  std::shared_ptr<std::mutex> mu_ = std::make_shared<std::mutex>();
};

NamespaceId namespace_from(std::int64_t v) {
  return id_from<NamespaceId>(v, "namespace");
}

RequestOptions options_from(std::int64_t ns, std::int64_t priority, StreamHandle stream = nullptr) {
  if (priority < kMinPriority || priority > kMaxPriority)
    raise_invalid("priority = " + std::to_string(priority) + " is not in [0, 100]");
  RequestOptions o;
  o.ns = namespace_from(ns);
  o.priority = static_cast<RetentionPriority>(priority);
  o.stream = stream;
  return o;
}

LockId lock_from(std::int64_t v) {
  return id_from<LockId>(v, "lock");
}

// Every CacheStats counter, once: the Python attributes, __repr__ and to_dict() come from
// this list.
struct StatField {
  const char* name;
  std::uint64_t CacheStats::*member;
};
constexpr StatField kStatFields[] = {
    {"admissions", &CacheStats::admissions},
    {"requested_tokens", &CacheStats::requested_tokens},
    {"hit_tokens_gpu", &CacheStats::hit_tokens_gpu},
    {"hit_tokens_host", &CacheStats::hit_tokens_host},
    {"bytes_d2h", &CacheStats::bytes_d2h},
    {"bytes_d2d", &CacheStats::bytes_d2d},
    {"bytes_h2d", &CacheStats::bytes_h2d},
    {"copies_d2h", &CacheStats::copies_d2h},
    {"copies_h2d", &CacheStats::copies_h2d},
    {"kv_pages_demoted", &CacheStats::kv_pages_demoted},
    {"kv_pages_promoted", &CacheStats::kv_pages_promoted},
    {"kv_pages_dropped_gpu", &CacheStats::kv_pages_dropped_gpu},
    {"kv_pages_dropped_host", &CacheStats::kv_pages_dropped_host},
    {"snapshots_demoted", &CacheStats::snapshots_demoted},
    {"snapshots_promoted", &CacheStats::snapshots_promoted},
    {"snapshots_dropped", &CacheStats::snapshots_dropped},
    {"snapshots_inserted", &CacheStats::snapshots_inserted},
    {"transfers_failed", &CacheStats::transfers_failed},
    {"host_bytes_peak", &CacheStats::host_bytes_peak},
    {"snapshot_slot_misses", &CacheStats::snapshot_slot_misses},
    {"dead_kv_pages_dropped", &CacheStats::dead_kv_pages_dropped},
    {"frontier_resumes", &CacheStats::frontier_resumes},
    {"spent_resumes", &CacheStats::spent_resumes},
    {"alloc_copy_waits", &CacheStats::alloc_copy_waits},
    {"host_waits", &CacheStats::host_waits},
    {"alloc_wait_bytes", &CacheStats::alloc_wait_bytes},
    {"alloc_wait_copies", &CacheStats::alloc_wait_copies},
    {"background_evictions", &CacheStats::background_evictions},
    {"bytes_to_store", &CacheStats::bytes_to_store},
    {"bytes_from_store", &CacheStats::bytes_from_store},
    {"store_writes", &CacheStats::store_writes},
    {"store_reads", &CacheStats::store_reads},
    {"kv_pages_stored", &CacheStats::kv_pages_stored},
    {"kv_pages_loaded", &CacheStats::kv_pages_loaded},
    {"snapshots_stored", &CacheStats::snapshots_stored},
    {"snapshots_loaded", &CacheStats::snapshots_loaded},
    {"kv_pages_dropped_store", &CacheStats::kv_pages_dropped_store},
    {"store_records_lost", &CacheStats::store_records_lost},
    {"store_failures", &CacheStats::store_failures},
    {"store_copy_waits", &CacheStats::store_copy_waits},
    {"store_wait_bytes", &CacheStats::store_wait_bytes},
    {"restored_kv_pages", &CacheStats::restored_kv_pages},
    {"restored_snapshots", &CacheStats::restored_snapshots},
    {"hit_tokens_store", &CacheStats::hit_tokens_store},
    {"staged_loads", &CacheStats::staged_loads},
    {"store_load_misses", &CacheStats::store_load_misses},
};
static_assert(sizeof(CacheStats) == std::size(kStatFields) * sizeof(std::uint64_t),
              "a CacheStats counter is missing from kStatFields");

/// admit + release `iterations` times, timed in C++: the reference the binding's overhead is
/// measured against (python/tests/test_binding_overhead.py, docs/performance.md).
double admit_release_loop(PyPrefixCache& self, const py::object& tokens, std::int64_t iterations) {
  TokenArg t(tokens);
  const auto n = count_from<std::uint64_t>(iterations, "iterations");
  return self.locked([&](PrefixCache& c) {
    const auto t0 = std::chrono::steady_clock::now();
    Status bad;
    for (std::uint64_t i = 0; i < n && bad.is_ok(); ++i) {
      auto a = c.admit(t.span());
      if (!a) {
        bad = a.status();
        break;
      }
      bad = c.release(a->lock);
    }
    const auto t1 = std::chrono::steady_clock::now();
    return bad.is_ok() ? std::chrono::duration<double>(t1 - t0).count() : -1.0;
  });
}

}  // namespace

PrefixCache& cache_of(py::handle cache) {
  return py::cast<PyPrefixCache&>(cache).cache();
}

std::shared_ptr<std::mutex> cache_mutex(py::handle cache) {
  return py::cast<PyPrefixCache&>(cache).mutex();
}

py::object cache_engine(py::handle cache) {
  return py::cast<PyPrefixCache&>(cache).engine();
}

void with_cache(py::handle cache, const std::function<void(PrefixCache&)>& f) {
  py::cast<PyPrefixCache&>(cache).locked([&](PrefixCache& c) {
    f(c);
    return 0;
  });
}

void bind_cache(py::module_& m) {
  Record<Admission>(m, "Admission", "What admit() matched and locked.")
      .property(
          "lock", [](const Admission& a) { return a.lock.value(); },
          "the request's lock (an int); also the ticket of its promotion")
      .field("cached_tokens", &Admission::cached_tokens, "usable match length")
      .field("gpu_tokens", &Admission::gpu_tokens)
      .field("host_tokens", &Admission::host_tokens)
      .field("snapshot_from_host", &Admission::snapshot_from_host)
      .field("promoting", &Admission::promoting, "wait(lock) before reading the pages")
      .field("kv_tokens", &Admission::kv_tokens,
             "where the prompt leaves the cached KV path (>= cached_tokens)")
      .done();

  Record<PyInsertResult>(m, "InsertResult", "What insert() adopted.")
      .field("not_taken", &PyInsertResult::not_taken,
             "the caller's pages the tree did not adopt (int64 array; still the "
             "caller's: free them when done)")
      .field("snapshot_taken", &PyInsertResult::snapshot_taken,
             "False: the caller still owns its snapshot slot")
      .done();

  Record<MatchResult>(m, "MatchResult", "What match() and peek() found (read-only).")
      .field("usable_tokens", &MatchResult::usable_tokens)
      .field("kv_tokens", &MatchResult::kv_tokens)
      .field("host_tokens", &MatchResult::host_tokens)
      .field("snapshot_on_gpu", &MatchResult::snapshot_on_gpu)
      .field("gpu_usable_tokens", &MatchResult::gpu_usable_tokens,
             "deepest usable boundary that needs no copy")
      .field("resume_tokens", &MatchResult::resume_tokens,
             "where admit resumes under the load-back threshold, GPU room allowing")
      .field("load_back", &MatchResult::load_back, "resume_tokens needs a host copy")
      .done();

  py::enum_<Tier>(m, "Tier", "A tier of the cache, for evict() and sizes().")
      .value("GPU", Tier::kGpu)
      .value("HOST", Tier::kHost)
      .value("STORE", Tier::kStore);
  Record<EvictResult>(m, "EvictResult", "What evict() freed on its tier.")
      .field("kv_pages", &EvictResult::kv_pages)
      .field("snapshots", &EvictResult::snapshots)
      .field("bytes", &EvictResult::bytes)
      .done()
      .def(
          "__eq__", [](const EvictResult& a, const EvictResult& b) { return a == b; },
          py::is_operator());
  Record<TierSizes>(m, "TierSizes", "Evictable and locked data of one tier.")
      .field("kv_pages_evictable", &TierSizes::kv_pages_evictable)
      .field("kv_pages_locked", &TierSizes::kv_pages_locked)
      .field("snapshots_evictable", &TierSizes::snapshots_evictable)
      .field("snapshots_locked", &TierSizes::snapshots_locked)
      .field("bytes_evictable", &TierSizes::bytes_evictable)
      .field("bytes_locked", &TierSizes::bytes_locked)
      .done()
      .def(
          "__eq__", [](const TierSizes& a, const TierSizes& b) { return a == b; },
          py::is_operator());
  Record<CacheSizes>(m, "CacheSizes", "sizes(): one TierSizes per tier.")
      .field("gpu", &CacheSizes::gpu)
      .field("host", &CacheSizes::host)
      .field("store", &CacheSizes::store)
      .done();

  py::enum_<Residency>(m, "Residency", "Where a node's KV or snapshot is.")
      .value("NONE", Residency::kNone)
      .value("GPU", Residency::kGpu)
      .value("HOST", Residency::kHost)
      .value("BOTH", Residency::kBoth);
  py::enum_<Xfer>(m, "Copy", "The copy of a node's resource in flight.")
      .value("NONE", Xfer::kNone)
      .value("DEMOTE", Xfer::kDemote)
      .value("WRITE_THROUGH", Xfer::kWriteThrough)
      .value("PROMOTE", Xfer::kPromote)
      .value("STORE", Xfer::kStore)
      .value("LOAD", Xfer::kLoad)
      .value("STAGE", Xfer::kStage);
  Record<NodeInfo>(m, "NodeInfo", "One node on a path, as inspect() reports it.")
      .field("boundary", &NodeInfo::boundary)
      .field("tokens", &NodeInfo::tokens)
      .field("matched", &NodeInfo::matched)
      .field("kv", &NodeInfo::kv)
      .field("snapshot", &NodeInfo::snapshot)
      .field("kv_copy", &NodeInfo::kv_copy)
      .field("snapshot_copy", &NodeInfo::snapshot_copy)
      .field("locks", &NodeInfo::locks)
      .field("snapshot_locks", &NodeInfo::snapshot_locks)
      .field("kv_priority", &NodeInfo::kv_priority, "retention level of its KV")
      .field("snapshot_priority", &NodeInfo::snapshot_priority)
      .field("pins", &NodeInfo::pins, "host pins whose prefix includes it")
      .field("kv_on_store", &NodeInfo::kv_on_store, "its KV has a store copy")
      .field("snapshot_on_store", &NodeInfo::snapshot_on_store)
      .done()
      .def(
          "__eq__", [](const NodeInfo& a, const NodeInfo& b) { return a == b; }, py::is_operator());

  Record<Occupancy>(m, "Occupancy", "Free entries of each pool and the tree's size.")
      .field("gpu_pages_free", &Occupancy::gpu_pages_free)
      .field("host_pages_free", &Occupancy::host_pages_free)
      .field("gpu_slots_free", &Occupancy::gpu_slots_free)
      .field("host_slots_free", &Occupancy::host_slots_free)
      .field("nodes", &Occupancy::nodes)
      .done();

  Record<CacheStats> stats(m, "CacheStats", "Counters since the cache was made.");
  for (const StatField& f : kStatFields) stats.field(f.name, f.member);
  stats.done(/*counters=*/true);

  py::class_<PyPrefixCache>(
      m, "PrefixCache",
      "The node-residency prefix cache. Ids cross as ints and int64 numpy arrays; token and "
      "page arguments take numpy arrays, CPU torch tensors or sequences of ints. Errors raise "
      "radixtier.Error subclasses carrying the library's message.")
      .def(py::init([](const CacheConfig& config, py::object engine, py::object store) {
             return std::make_unique<PyPrefixCache>(config, std::move(engine), std::move(store));
           }),
           py::arg("config"), py::arg("engine"), py::kw_only(), py::arg("store") = py::none(),
           "store: a disk.DiskStoreEngine built over this engine (the tier below host); the "
           "cache rebuilds its tree from the store's records.")
      .def_property_readonly("page_size",
                             [](PyPrefixCache& s) {
                               return s.query([](const PrefixCache& c) { return c.page_size(); });
                             })
      .def_property_readonly(
          "config",
          [](PyPrefixCache& s) { return s.query([](const PrefixCache& c) { return c.config(); }); })
      .def_property_readonly("engine", &PyPrefixCache::engine)
      .def_property_readonly("store", &PyPrefixCache::store, "the store engine, or None")
      .def(
          "health", [](PyPrefixCache& s) { return s.engine().attr("health")(); },
          "The engine's health(): EngineHealth, ok or DEVICE_LOST with the CUDA error.")
      .def(
          "persist",
          [](PyPrefixCache& s) { check(s.locked([](PrefixCache& c) { return c.persist(); })); },
          "Graceful shutdown with a store: every node of the default namespace the store has "
          "room for gets a store copy, then the store syncs, so the next cache on the same "
          "directory serves it all. FailedPreconditionError without a store; "
          "OutOfMemoryError when some of it found no room (the rest is durable).")
      .def_property_readonly(
          "in_flight",
          [](PyPrefixCache& s) {
            return s.query([](const PrefixCache& c) { return c.in_flight(); });
          },
          "transfers in flight")
      // --- the CacheBackend interface -------------------------------------------------------
      .def(
          "admit",
          [](PyPrefixCache& s, const py::object& prompt, std::int64_t ns, std::int64_t priority,
             const py::object& stream) {
            // int64 (torch's and numpy's default, what tokenizers return) is read in place.
            TokenArg t(prompt, "prompt", /*wide_ok=*/true);
            const RequestOptions o = options_from(ns, priority, stream_for(s.engine(), stream));
            return unwrap(s.locked([&](PrefixCache& c) {
              return t.wide().empty() ? c.admit(t.span(), o) : c.admit(t.wide(), o);
            }));
          },
          py::arg("prompt"), py::kw_only(), py::arg("namespace") = 0,
          py::arg("priority") = kDefaultPriority, py::arg("stream") = py::none(),
          "Matches on all but the last prompt token in the key namespace `namespace` (an int: "
          "an adapter, a cache salt, a tenant; 0 is the default one), locks the usable match, "
          "starts promoting what of it is on host. What the request uses and inserts is kept "
          "at least at `priority` (0-100: lower leaves first). `stream`: the stream the "
          "request's forward runs on (the CUDA engine; None: torch.cuda.current_stream(); an "
          "engine without streams ignores it): every copy made for the request is ordered "
          "after the work queued on it.")
      .def(
          "stream_wait",
          [](PyPrefixCache& s, std::int64_t lock, const py::object& stream,
             std::optional<std::int64_t> layer) {
            const LockId l = lock_from(lock);
            const StreamHandle h = stream_for(s.engine(), stream);
            std::optional<std::uint32_t> ly;
            if (layer) ly = count_from<std::uint32_t>(*layer, "layer");
            check(s.locked([&](PrefixCache& c) { return c.stream_wait(l, h, ly); }));
          },
          py::arg("lock"), py::arg("stream") = py::none(), py::arg("layer") = py::none(),
          "Makes `stream` (None: torch.cuda.current_stream() on the CUDA engine) wait on the "
          "device for the lock's resumed prefix (with `layer`: the KV of the layers up to it, "
          "and the whole snapshot); the host engine waits on the host. path_pages() and "
          "path_snapshot() then hand out the ids at once: read them on that stream only, and "
          "check poll(lock) == DONE before committing what was computed from them.")
      .def(
          "poll",
          [](PyPrefixCache& s, std::optional<std::int64_t> lock) -> py::object {
            if (!lock) {
              s.locked([](PrefixCache& c) {
                c.poll();
                return 0;
              });
              return py::none();
            }
            const LockId l = lock_from(*lock);
            return py::cast(unwrap(s.locked([&](PrefixCache& c) { return c.poll(l); })));
          },
          py::arg("lock") = py::none(),
          "poll(lock): the lock's promotion state; poll(): reaps finished transfers.")
      .def(
          "wait",
          [](PyPrefixCache& s, std::int64_t lock) {
            const LockId l = lock_from(lock);
            return unwrap(s.locked([&](PrefixCache& c) { return c.wait(l); }));
          },
          py::arg("lock"),
          "Waits for the path's promotions (GIL released) and returns the tokens the request "
          "resumes from: the admission's match, or less when a copy failed (the lock then sits "
          "at the deepest boundary still usable). TransferFailedError: the engine refused a "
          "copy; release and admit again.")
      .def(
          "path_pages",
          [](PyPrefixCache& s, std::int64_t lock) {
            const LockId l = lock_from(lock);
            auto pages = unwrap(s.locked([&](PrefixCache& c) { return c.path_pages(l); }));
            return to_array<GpuPageId>(pages);
          },
          py::arg("lock"), "GPU pages of the matched prefix (int64 array).")
      .def(
          "path_snapshot",
          [](PyPrefixCache& s, std::int64_t lock) {
            const LockId l = lock_from(lock);
            return unwrap(s.locked([&](PrefixCache& c) { return c.path_snapshot(l); })).value();
          },
          py::arg("lock"), "GPU snapshot slot at the match: copy it into the live state.")
      .def(
          "alloc_pages",
          [](PyPrefixCache& s, std::int64_t lock, std::int64_t n) {
            const LockId l = lock_from(lock);
            const auto count = count_from<std::uint32_t>(n, "n");
            auto pages = unwrap(s.locked([&](PrefixCache& c) { return c.alloc_pages(l, count); }));
            return to_array<GpuPageId>(pages);
          },
          py::arg("lock"), py::arg("n"),
          "n GPU pages owned by the request (may demote or drop LRU victims).")
      .def(
          "alloc_snapshot_slot",
          [](PyPrefixCache& s, std::int64_t lock) {
            const LockId l = lock_from(lock);
            return unwrap(s.locked([&](PrefixCache& c) { return c.alloc_snapshot_slot(l); }))
                .value();
          },
          py::arg("lock"))
      .def(
          "free_pages",
          [](PyPrefixCache& s, std::int64_t lock, const py::object& pages) {
            const LockId l = lock_from(lock);
            const auto ids = ids_from<GpuPageId>(pages, "pages");
            check(s.locked([&](PrefixCache& c) { return c.free_pages(l, ids); }));
          },
          py::arg("lock"), py::arg("pages"))
      .def(
          "free_snapshot_slot",
          [](PyPrefixCache& s, std::int64_t lock, std::int64_t slot) {
            const LockId l = lock_from(lock);
            const GpuSlotId id = id_from<GpuSlotId>(slot, "slot");
            check(s.locked([&](PrefixCache& c) { return c.free_snapshot_slot(l, id); }));
          },
          py::arg("lock"), py::arg("slot"))
      .def(
          "insert",
          [](PyPrefixCache& s, std::int64_t lock, const py::object& tokens, const py::object& pages,
             std::optional<std::int64_t> snapshot) {
            const LockId l = lock_from(lock);
            TokenArg t(tokens);
            const auto ids = ids_from<GpuPageId>(pages, "pages");
            std::optional<GpuSlotId> slot;
            if (snapshot) slot = id_from<GpuSlotId>(*snapshot, "snapshot");
            auto r =
                unwrap(s.locked([&](PrefixCache& c) { return c.insert(l, t.span(), ids, slot); }));
            return PyInsertResult{to_array<GpuPageId>(r.not_taken), r.snapshot_taken};
          },
          py::arg("lock"), py::arg("tokens"), py::arg("pages"), py::arg("snapshot") = py::none(),
          "Hands pages (and a snapshot slot) to the tree after a chunk; the lock moves down "
          "to the inserted boundary.")
      .def(
          "release",
          [](PyPrefixCache& s, std::int64_t lock) {
            const LockId l = lock_from(lock);
            check(s.locked([&](PrefixCache& c) { return c.release(l); }));
          },
          py::arg("lock"), "Unlocks; every page and slot the request still owns is freed.")
      // --- queries and maintenance -------------------------------------------------------------
      .def(
          "match",
          [](PyPrefixCache& s, const py::object& tokens, std::int64_t ns) {
            TokenArg t(tokens);
            const NamespaceId n = namespace_from(ns);
            return s.locked([&](PrefixCache& c) { return c.match(t.span(), n); });
          },
          py::arg("tokens"), py::kw_only(), py::arg("namespace") = 0,
          "Read-only lookup of all the tokens.")
      .def(
          "peek",
          [](PyPrefixCache& s, const py::object& prompt) {
            TokenArg t(prompt);
            return unwrap(s.locked([&](PrefixCache& c) { return c.peek(t.span()); }));
          },
          py::arg("prompt"),
          "What admit(prompt) would find (all but the last token), read-only: no promotion, "
          "no change of recency.")
      .def(
          "evict",
          [](PyPrefixCache& s, std::int64_t tokens, std::int64_t snapshots, Tier tier) {
            EvictRequest r;
            r.tokens = count_from<std::size_t>(tokens, "evict: tokens");
            r.snapshots = count_from<std::uint32_t>(snapshots, "evict: snapshots");
            r.tier = tier;
            return unwrap(s.locked([&](PrefixCache& c) { return c.evict(r); }));
          },
          py::arg("tokens") = 0, py::arg("snapshots") = 0, py::arg("tier") = Tier::kGpu,
          "Frees at least `tokens` of KV and `snapshots` snapshots on one tier, as far as "
          "unlocked data allows; returns what it freed.")
      .def(
          "sizes",
          [](PyPrefixCache& s) { return s.query([](const PrefixCache& c) { return c.sizes(); }); },
          "Evictable and locked KV pages, snapshots and bytes per tier.")
      .def(
          "inspect",
          [](PyPrefixCache& s, const py::object& tokens, std::int64_t ns) {
            TokenArg t(tokens);
            const NamespaceId n = namespace_from(ns);
            return s.locked([&](PrefixCache& c) { return c.inspect(t.span(), n); });
          },
          py::arg("tokens"), py::kw_only(), py::arg("namespace") = 0,
          "Per node on the path of `tokens`: residency, locks, copies (read-only).")
      .def(
          "flush",
          [](PyPrefixCache& s, std::optional<std::int64_t> ns) {
            const std::optional<NamespaceId> n =
                ns ? std::optional(namespace_from(*ns)) : std::nullopt;
            s.locked([&](PrefixCache& c) {
              n ? c.flush(*n) : c.flush();
              return 0;
            });
          },
          py::kw_only(), py::arg("namespace") = py::none(),
          "Drops every copy no running request and no pin holds, on every tier (waits for "
          "copies in flight first); flush(namespace=n): only namespace n's.")
      .def(
          "pin",
          [](PyPrefixCache& s, const py::object& tokens, std::int64_t ns) {
            TokenArg t(tokens);
            const NamespaceId n = namespace_from(ns);
            return unwrap(s.locked([&](PrefixCache& c) { return c.pin(t.span(), n); })).value();
          },
          py::arg("tokens"), py::kw_only(), py::arg("namespace") = 0,
          "Host-only pin of a cached prefix (whole pages, a snapshot at its end): its host "
          "copies are never dropped until unpin(pin). Returns the pin (an int). "
          "OutOfMemoryError beyond CacheConfig.host_pin_share of the host pool.")
      .def(
          "unpin",
          [](PyPrefixCache& s, std::int64_t pin) {
            const PinId p = id_from<PinId>(pin, "pin");
            check(s.locked([&](PrefixCache& c) { return c.unpin(p); }));
          },
          py::arg("pin"), "Ends a pin: its host copies become evictable again.")
      .def_property_readonly(
          "pinned_host_pages",
          [](PyPrefixCache& s) {
            return s.query([](const PrefixCache& c) { return c.pinned_host_pages(); });
          })
      .def("stats",
           [](PyPrefixCache& s) { return s.query([](const PrefixCache& c) { return c.stats(); }); })
      .def("occupancy",
           [](PyPrefixCache& s) {
             return s.query([](const PrefixCache& c) { return c.occupancy(); });
           })
      .def(
          "check_invariants",
          [](PyPrefixCache& s) {
            return s.locked([](PrefixCache& c) { return c.check_invariants(); });
          },
          "Empty when every rule holds, else the first violation.")
      .def(
          "drain",
          [](PyPrefixCache& s) {
            s.locked([](PrefixCache& c) {
              c.drain();
              return 0;
            });
          },
          "Waits for every in-flight transfer (GIL released).")
      .def(
          "drop_host",
          [](PyPrefixCache& s) {
            s.locked([](PrefixCache& c) {
              c.drop_host();
              return 0;
            });
          },
          "Drops every unpinned host copy.")
      .def("_admit_release_loop", &admit_release_loop, py::arg("prompt"), py::arg("iterations"),
           "Benchmark reference: admit + release N times in C++; returns seconds.");
}

}  // namespace radixtier::python
