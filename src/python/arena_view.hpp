// ArenaView: a pool of fixed-size items (KV pages or snapshot slots) in host memory, exposed
// through the buffer protocol as a writable uint8 array [items, item_bytes], so numpy
// (np.asarray), torch (torch.frombuffer, radixtier.as_tensor) and memoryview see the cache's
// own bytes: a model writes K/V straight into the pages, no copy. The view keeps the memory's
// owner (HostArenas, PinnedHostPool) alive.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

namespace radixtier::python {

namespace py = pybind11;

struct ArenaView {
  std::byte* data = nullptr;
  std::size_t items = 0;
  std::size_t item_bytes = 0;
  const char* name = "";
  py::object owner;  ///< keeps the memory alive
};

/// Registers the ArenaView class (once).
void bind_arena_view(py::module_& m);

}  // namespace radixtier::python
