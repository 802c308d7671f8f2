// The Python module radixtier._core (re-exported by the `radixtier` package).
//
//   CacheConfig, PrefixCache                    the cache (every CacheBackend call + queries)
//   HostArenas, HostTransferEngine, ArenaView   the host engine; arenas as zero-copy buffers
//   SnapshotPolicy, SnapshotQuery               the placement policies (radixtier::scheduler)
//   disk.*                                      the disk tier (DiskStore, DiskStoreEngine)
//   shared.*                                    the shared tier (RedisCluster, SharedTier)
//   cuda.*                                      the CUDA engine, when built with nvcc
//   Error and its subclasses                    a Status that is not ok
//
// Later additions hook in here, beside the cache: KV events (a callback and a bounded queue
// fed by the cache) and Prometheus metrics register from their own bind_*.cpp without
// changing these.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "errors.hpp"

#ifndef RADIXTIER_VERSION
#define RADIXTIER_VERSION "0"
#endif

PYBIND11_MODULE(_core, m) {
  namespace rp = radixtier::python;
  m.doc() = "radixtier: a node-residency prefix cache for hybrid attention + GDN models";
  m.attr("__version__") = RADIXTIER_VERSION;
  rp::bind_config(m);
  rp::register_errors(m);
  rp::bind_host(m);
  rp::bind_cache(m);
  rp::bind_observers(m);
  rp::bind_policy(m);
  auto disk = m.def_submodule("disk", "The disk tier below host (radixtier::disk).");
  rp::bind_disk(disk);
#ifdef RADIXTIER_PYTHON_SHARED
  auto shared =
      m.def_submodule("shared", "The shared tier over a Redis Cluster (radixtier::shared).");
  rp::bind_shared(shared);
  m.attr("HAVE_SHARED") = true;
#else
  m.attr("HAVE_SHARED") = false;
#endif
#ifdef RADIXTIER_PYTHON_CUDA
  auto cuda = m.def_submodule("cuda", "The CUDA transfer engine (built with nvcc).");
  rp::bind_cuda(cuda);
  m.attr("HAVE_CUDA") = true;
#else
  m.attr("HAVE_CUDA") = false;
#endif
}
