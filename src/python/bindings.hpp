// The parts of the radixtier Python module (module.cpp calls them in this order).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/transfer/store_engine.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::python {

namespace py = pybind11;

void bind_config(py::module_& m);  ///< enums, CacheConfig (before register_errors)
void bind_host(py::module_& m);    ///< ArenaView, HostArenas, HostTransferEngine, Ticket
void bind_cache(py::module_& m);   ///< PrefixCache and its results
void bind_policy(py::module_& m);  ///< SnapshotPolicy, SnapshotQuery (radixtier::scheduler)
#ifdef RADIXTIER_PYTHON_CUDA
void bind_cuda(py::module_& m);  ///< the `cuda` submodule
#endif
/// block_hash(es), and where built EventPublisher (radixtier_events) and MetricsServer
/// (radixtier_metrics): after bind_cache.
void bind_observers(py::module_& m);

// The engine behind an engine object a caller hands PrefixCache (PrefixCache::create checks
// the config against its pools).
/// The host engine behind `obj`, or nullptr when it is not one.
TransferEngine* host_engine_of(py::handle obj);
#ifdef RADIXTIER_PYTHON_CUDA
/// The CUDA engine behind `obj`, or nullptr when it is not one.
TransferEngine* cuda_engine_of(py::handle obj);
/// The stream a call on CUDA engine `engine` is ordered on: `stream` (an int or an object
/// with cuda_stream), or None: torch.cuda.current_stream() of the engine's device when torch
/// has CUDA, else the engine's default compute stream.
StreamHandle cuda_call_stream(py::handle engine, const py::object& stream);
#endif
/// The per-call stream argument for the engine object `engine`: cuda_call_stream for the
/// CUDA engine; for an engine without streams the argument is checked (None, an int or an
/// object with cuda_stream) and passed on, where it is ignored.
StreamHandle stream_for(py::handle engine, const py::object& stream);

/// Runs f on the cache behind a Python PrefixCache, GIL released, under its mutex.
void with_cache(py::handle cache, const std::function<void(PrefixCache&)>& f);
/// The cache behind a Python PrefixCache (call it under cache_mutex, GIL released), the
/// mutex its calls take, and its engine object.
PrefixCache& cache_of(py::handle cache);
std::shared_ptr<std::mutex> cache_mutex(py::handle cache);
py::object cache_engine(py::handle cache);

/// The `disk` submodule: DiskStore, DiskStoreEngine (radixtier::disk).
void bind_disk(py::module_& m);
/// The store engine behind a Python disk.DiskStoreEngine for a cache on `engine`: a TypeError
/// for another type; InvalidArgumentError when it was built over another engine's host pages
/// or already serves a cache. From now on its queries take `mutex` (the cache's).
StoreEngine* attach_store(py::handle store, py::handle engine,
                          const std::shared_ptr<std::mutex>& mutex);
/// The cache is gone (or was never made): the store engine may serve another one.
void detach_store(py::handle store);
#ifdef RADIXTIER_PYTHON_SHARED
/// The `shared` submodule: RedisCluster, SharedTier (radixtier::shared).
void bind_shared(py::module_& m);
#endif

}  // namespace radixtier::python
