// The parts of the radixtier Python module (module.cpp calls them in this order).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "radixtier/cache/prefix_cache.hpp"
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
#endif

/// Runs f on the cache behind a Python PrefixCache, GIL released, under its mutex.
void with_cache(py::handle cache, const std::function<void(PrefixCache&)>& f);

}  // namespace radixtier::python
