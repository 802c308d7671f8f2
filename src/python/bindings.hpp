// The parts of the radixtier Python module (module.cpp calls them in this order).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <optional>

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

/// What PrefixCache needs to know about the engine object a caller hands it: the engine and
/// the sizes of its pools, to reject a cache config that does not match them.
struct EngineRef {
  TransferEngine* engine = nullptr;
  const char* kind = "";
  std::uint32_t gpu_pages = 0, host_pages = 0, gpu_slots = 0, host_slots = 0;
  std::size_t page_bytes = 0, snapshot_bytes = 0;
};

/// The host engine behind `obj`, or nullopt when it is not one.
std::optional<EngineRef> host_engine_ref(py::handle obj);
#ifdef RADIXTIER_PYTHON_CUDA
/// The CUDA engine behind `obj`, or nullopt when it is not one.
std::optional<EngineRef> cuda_engine_ref(py::handle obj);
#endif

}  // namespace radixtier::python
