// The `disk` submodule: the disk tier below host (radixtier::disk), as an engine written in
// Python builds it beside its cache:
//
//   store = rt.disk.DiskStore(directory, budget_bytes, config, model_id, weights_version)
//   disk = rt.disk.DiskStoreEngine(store, engine)     # engine: host or CUDA engine
//   cache = rt.PrefixCache(config, engine, store=disk) # tree rebuilt from the records
//   ...
//   cache.persist()                                    # graceful shutdown
//
// The store's fingerprint takes its geometry (page tokens, page and snapshot bytes) from the
// CacheConfig, so a store always matches the cache it is made for; model_id and
// weights_version name the model (another one's store is refused, or wiped on request).
//
// Threading: DiskStore and DiskStoreEngine are not thread-safe; the cache's thread drives
// them. Each Python object carries a mutex (the cache's, once its engine serves a cache), and
// every call takes it with the GIL released, so a query from another Python thread never runs
// beside a cache call. Lifetimes: a DiskStoreEngine keeps its store and its engine alive, a
// PrefixCache its store engine.
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/disk/disk_config.hpp"
#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_store_engine.hpp"
#include "records.hpp"

namespace radixtier::python {

namespace {

struct PyDiskStore {
  std::unique_ptr<disk::DiskStore> store;
  /// Taken (GIL released) by every call; the cache's once its store engine serves one.
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  bool has_engine = false;  ///< a DiskStoreEngine was built over it (one per store)

  disk::DiskStore& get() const {
    if (!store) {
      raise(Status(ErrorCode::kFailedPrecondition, "DiskStore: closed"));
    }
    return *store;
  }
  template <class F>
  auto locked(F&& f) {
    disk::DiskStore& s = get();
    std::shared_ptr<std::mutex> m = mu;
    py::gil_scoped_release nogil;
    std::lock_guard lock(*m);
    return f(s);
  }
};

struct PyDiskStoreEngine {
  std::unique_ptr<disk::DiskStoreEngine> engine;
  py::object store_obj;   ///< the PyDiskStore (kept alive)
  py::object engine_obj;  ///< the transfer engine whose host pages it reads and writes
  HostPages* host = nullptr;
  bool attached = false;  ///< serves a PrefixCache

  PyDiskStore& store() const { return store_obj.cast<PyDiskStore&>(); }
  template <class F>
  auto locked(F&& f) {
    std::shared_ptr<std::mutex> m = store().mu;
    py::gil_scoped_release nogil;
    std::lock_guard lock(*m);
    return f(*engine);
  }
  ~PyDiskStoreEngine() {
    if (store_obj) {
      PyDiskStore& s = store();
      if (engine) {
        std::shared_ptr<std::mutex> m = s.mu;
        py::gil_scoped_release nogil;
        std::lock_guard lock(*m);
        engine.reset();  // waits for its tickets' I/O
      }
      s.has_engine = false;
    }
  }
};

disk::ModelFingerprint fingerprint_of(const CacheConfig& c, std::string model_id,
                                      std::string weights_version) {
  disk::ModelFingerprint f;
  f.page_tokens = c.page_size;
  f.page_bytes = c.page_bytes;
  f.snapshot_bytes = c.snapshot_bytes;
  f.model_id = std::move(model_id);
  f.weights_version = std::move(weights_version);
  return f;
}

py::dict fingerprint_dict(const disk::ModelFingerprint& f) {
  py::dict d;
  d["page_tokens"] = f.page_tokens;
  d["page_bytes"] = f.page_bytes;
  d["snapshot_bytes"] = f.snapshot_bytes;
  d["model_id"] = f.model_id;
  d["weights_version"] = f.weights_version;
  return d;
}

std::unique_ptr<PyDiskStore> open_store(const std::string& directory, std::int64_t budget_bytes,
                                        const CacheConfig& config, const std::string& model_id,
                                        const std::string& weights_version,
                                        disk::OnMismatch on_mismatch, std::int64_t journal_batch,
                                        std::int64_t compact_slack, disk::IoEngineKind io_engine,
                                        std::int64_t io_threads, std::int64_t queue_depth,
                                        std::int64_t slice_bytes) {
  check(config.validate());
  if (directory.empty()) raise_invalid("DiskStore: directory is empty");
  if (model_id.empty())
    raise_invalid(
        "DiskStore: model_id is empty (it names the model whose bytes the store "
        "keeps: another model's store is refused)");
  disk::DiskStoreConfig dc;
  dc.directory = directory;
  dc.budget_bytes = count_from<std::uint64_t>(budget_bytes, "DiskStore: budget_bytes");
  dc.fingerprint = fingerprint_of(config, model_id, weights_version);
  dc.on_mismatch = on_mismatch;
  dc.journal_batch = count_from<std::uint32_t>(journal_batch, "DiskStore: journal_batch");
  dc.compact_slack = count_from<std::uint64_t>(compact_slack, "DiskStore: compact_slack");
  dc.io.kind = io_engine;
  dc.io.io_threads = count_from<std::uint32_t>(io_threads, "DiskStore: io_threads");
  dc.io.queue_depth = count_from<std::uint32_t>(queue_depth, "DiskStore: queue_depth");
  dc.io.slice_bytes = count_from<std::size_t>(slice_bytes, "DiskStore: slice_bytes");
  check(dc.validate());
  Result<std::unique_ptr<disk::DiskStore>> made = [&] {
    py::gil_scoped_release nogil;
    return disk::DiskStore::open(dc);
  }();
  auto out = std::make_unique<PyDiskStore>();
  out->store = unwrap(std::move(made));
  return out;
}

}  // namespace

StoreEngine* attach_store(py::handle store, py::handle engine,
                          const std::shared_ptr<std::mutex>& mutex) {
  if (!py::isinstance<PyDiskStoreEngine>(store)) {
    throw py::type_error("PrefixCache: store must be a disk.DiskStoreEngine, got " +
                         std::string(py::str(py::type::of(store))));
  }
  auto& e = store.cast<PyDiskStoreEngine&>();
  if (e.attached) {
    raise_invalid(
        "PrefixCache: this DiskStoreEngine already serves a cache (one cache per "
        "store: its records are one tree)");
  }
  if (!e.engine_obj.is(engine)) {
    raise_invalid(
        "PrefixCache: the DiskStoreEngine was built over another transfer engine's "
        "host pages; build it with DiskStoreEngine(store, engine) over this cache's "
        "engine");
  }
  e.attached = true;
  e.store().mu = mutex;
  return e.engine.get();
}

void detach_store(py::handle store) {
  if (!py::isinstance<PyDiskStoreEngine>(store)) return;
  auto& e = store.cast<PyDiskStoreEngine&>();
  if (!e.attached) return;
  e.attached = false;
  e.store().mu = std::make_shared<std::mutex>();
}

void bind_disk(py::module_& m) {
  py::enum_<disk::OnMismatch>(m, "OnMismatch",
                              "What DiskStore does with a store of another model or geometry.")
      .value("REFUSE", disk::OnMismatch::kRefuse)
      .value("WIPE", disk::OnMismatch::kWipe);
  py::enum_<disk::IoEngineKind>(m, "IoEngineKind")
      .value("AUTO", disk::IoEngineKind::kAuto)
      .value("IO_URING", disk::IoEngineKind::kIoUring)
      .value("THREAD_POOL", disk::IoEngineKind::kThreadPool);

  Record<disk::DiskStoreStats> stats(m, "DiskStoreStats", "The disk store's counters.");
  stats.field("capacity_slots", &disk::DiskStoreStats::capacity_slots)
      .field("free_slots", &disk::DiskStoreStats::free_slots)
      .field("freeing_slots", &disk::DiskStoreStats::freeing_slots)
      .field("writing_slots", &disk::DiskStoreStats::writing_slots)
      .field("records", &disk::DiskStoreStats::records)
      .field("unsynced_entries", &disk::DiskStoreStats::unsynced_entries)
      .field("records_written", &disk::DiskStoreStats::records_written)
      .field("records_read", &disk::DiskStoreStats::records_read)
      .field("records_lost", &disk::DiskStoreStats::records_lost)
      .field("write_failures", &disk::DiskStoreStats::write_failures)
      .field("read_failures", &disk::DiskStoreStats::read_failures)
      .field("syncs", &disk::DiskStoreStats::syncs)
      .field("compactions", &disk::DiskStoreStats::compactions)
      .done(/*counters=*/true);

  Record<disk::RecoveryReport>(m, "RecoveryReport", "What DiskStore found on disk when opened.")
      .field("created", &disk::RecoveryReport::created)
      .field("wiped", &disk::RecoveryReport::wiped)
      .field("wipe_reason", &disk::RecoveryReport::wipe_reason)
      .field("journal_entries", &disk::RecoveryReport::journal_entries)
      .field("torn_tail_bytes", &disk::RecoveryReport::torn_tail_bytes)
      .field("records", &disk::RecoveryReport::records)
      .field("dropped_truncated", &disk::RecoveryReport::dropped_truncated)
      .field("dropped_over_budget", &disk::RecoveryReport::dropped_over_budget)
      .field("io_engine", &disk::RecoveryReport::io_engine)
      .field("io_fallback_reason", &disk::RecoveryReport::io_fallback_reason)
      .done();

  py::class_<PyDiskStore>(m, "DiskStore",
                          "KV pages and snapshots as checked records in one directory within a "
                          "byte budget, surviving restarts and crashes (docs/architecture.md, "
                          "\"The disk store\").")
      .def(py::init(&open_store), py::arg("directory"), py::arg("budget_bytes"), py::arg("config"),
           py::arg("model_id"), py::arg("weights_version") = "", py::kw_only(),
           py::arg("on_mismatch") = disk::OnMismatch::kRefuse, py::arg("journal_batch") = 64,
           py::arg("compact_slack") = 4096, py::arg("io_engine") = disk::IoEngineKind::kAuto,
           py::arg("io_threads") = 4, py::arg("queue_depth") = 32, py::arg("slice_bytes") = 1 << 20,
           "Opens (or creates) the store in `directory` (its parent must exist) and recovers "
           "it. The fingerprint is the config's geometry (page_size, page_bytes, "
           "snapshot_bytes) with model_id and weights_version: a store of another one is "
           "refused (FailedPreconditionError naming each field) or, on_mismatch=WIPE, deleted "
           "and made afresh. One process (one DiskStore) per directory.")
      .def_property_readonly("directory",
                             [](const PyDiskStore& s) { return s.get().config().directory; })
      .def_property_readonly("budget_bytes",
                             [](const PyDiskStore& s) { return s.get().config().budget_bytes; })
      .def_property_readonly(
          "fingerprint",
          [](const PyDiskStore& s) { return fingerprint_dict(s.get().config().fingerprint); })
      .def_property_readonly(
          "recovery",
          [](PyDiskStore& s) { return s.locked([](disk::DiskStore& d) { return d.recovery(); }); })
      .def("stats",
           [](PyDiskStore& s) { return s.locked([](disk::DiskStore& d) { return d.stats(); }); })
      .def_property_readonly(
          "records",
          [](PyDiskStore& s) {
            return s.locked([](disk::DiskStore& d) { return d.records().size(); });
          },
          "live records")
      .def(
          "sync",
          [](PyDiskStore& s) { check(s.locked([](disk::DiskStore& d) { return d.sync(); })); },
          "Makes every queued commit and erase durable.")
      .def(
          "scrub",
          [](PyDiskStore& s) {
            return unwrap(s.locked([](disk::DiskStore& d) { return d.scrub(); }));
          },
          "Reads and checks every live record; lost ones are erased. Returns how many.")
      .def("check_invariants",
           [](PyDiskStore& s) {
             return s.locked([](disk::DiskStore& d) { return d.check_invariants(); });
           })
      .def_property_readonly(
          "disabled_reason", [](const PyDiskStore& s) { return s.get().disabled_reason(); },
          "non-empty once a failed fsync switched the store off for good: why")
      .def_property_readonly("closed", [](const PyDiskStore& s) { return !s.store; })
      .def(
          "close",
          [](PyDiskStore& s) {
            if (!s.store) return;
            if (s.has_engine) {
              raise(Status(ErrorCode::kFailedPrecondition,
                           "DiskStore.close: a DiskStoreEngine still uses it (drop the cache "
                           "and the DiskStoreEngine first)"));
            }
            py::gil_scoped_release nogil;
            s.store.reset();  // releases the directory's lock
          },
          "Closes the store (its directory may then be opened again).");

  py::class_<PyDiskStoreEngine>(
      m, "DiskStoreEngine",
      "The disk store as the cache's tier below host: it reads and writes the host pages of a "
      "transfer engine (HostTransferEngine's arenas, or the CUDA engine's pinned pool). Give "
      "it to PrefixCache(config, engine, store=...).")
      .def(py::init([](py::object store, py::object engine) {
             if (!py::isinstance<PyDiskStore>(store)) {
               throw py::type_error("DiskStoreEngine: store must be a disk.DiskStore, got " +
                                    std::string(py::str(py::type::of(store))));
             }
             TransferEngine* e = host_engine_of(engine);
#ifdef RADIXTIER_PYTHON_CUDA
             if (e == nullptr) e = cuda_engine_of(engine);
#endif
             if (e == nullptr) {
               throw py::type_error(
                   "DiskStoreEngine: engine must be a HostTransferEngine or a "
                   "cuda.CudaTransferEngine, got " +
                   std::string(py::str(py::type::of(engine))));
             }
             auto& s = store.cast<PyDiskStore&>();
             disk::DiskStore& d = s.get();
             if (s.has_engine) {
               raise_invalid(
                   "DiskStoreEngine: this DiskStore already has a DiskStoreEngine "
                   "(one per store)");
             }
             HostPages* host = e->host_memory();
             if (host == nullptr) {
               raise_invalid(
                   "DiskStoreEngine: the engine has no host pages (a CUDA engine "
                   "built without a host_kv pool)");
             }
             const std::uint64_t store_page = d.config().fingerprint.page_bytes;
             if (host->page_bytes() != store_page) {
               raise_invalid("DiskStoreEngine: the engine's host pages are " +
                             std::to_string(host->page_bytes()) + " bytes, the store's pages " +
                             std::to_string(store_page));
             }
             auto out = std::make_unique<PyDiskStoreEngine>();
             out->engine = std::make_unique<disk::DiskStoreEngine>(d, *host);
             out->store_obj = store;
             out->engine_obj = engine;
             out->host = host;
             s.has_engine = true;
             return out;
           }),
           py::arg("store"), py::arg("engine"))
      .def_readonly("disk_store", &PyDiskStoreEngine::store_obj)
      .def_readonly("engine", &PyDiskStoreEngine::engine_obj)
      .def_readonly("attached", &PyDiskStoreEngine::attached, "serves a PrefixCache")
      .def_property_readonly(
          "free_slots",
          [](PyDiskStoreEngine& e) {
            return e.locked([](disk::DiskStoreEngine& d) { return d.free_slots(); });
          })
      .def_property_readonly(
          "capacity_slots",
          [](PyDiskStoreEngine& e) {
            return e.locked([](disk::DiskStoreEngine& d) { return d.geometry().capacity_slots; });
          })
      .def_property_readonly(
          "pending_tickets",
          [](PyDiskStoreEngine& e) {
            return e.locked([](disk::DiskStoreEngine& d) { return d.pending_tickets(); });
          })
      .def_property_readonly(
          "syncs_for_room",
          [](PyDiskStoreEngine& e) {
            return e.locked([](disk::DiskStoreEngine& d) { return d.syncs_for_room(); });
          })
      .def(
          "sync",
          [](PyDiskStoreEngine& e) {
            check(e.locked([](disk::DiskStoreEngine& d) { return d.sync(); }));
          },
          "Makes every record written so far durable.");
}

}  // namespace radixtier::python
