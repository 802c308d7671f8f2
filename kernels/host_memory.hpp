// Internal: how much host memory a pinned pool may take, and the GPU's NUMA node from sysfs.
//
// Pure host code (no CUDA): built into radixtier_cuda_plan, so the CPU tests check the
// parsers and the decision on any machine. The pinned pool calls read_host_memory_limits()
// and check_host_memory() before it maps anything: a pool larger than MemAvailable or than
// the cgroup's headroom would be pre-touched into the OOM killer's hands (MAP_NORESERVE
// reserves nothing), so it is refused with the numbers instead.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "radixtier/status.hpp"

namespace radixtier::cuda::detail {

/// "MemAvailable:   23928144 kB" in /proc/meminfo, in bytes; nullopt when absent.
std::optional<std::size_t> parse_meminfo_available(std::string_view meminfo);

/// A cgroup memory limit file (v2 memory.max, v1 memory.limit_in_bytes) or usage file:
/// bytes, or nullopt for "max", an unlimited v1 value (>= 2^62) or unreadable text.
std::optional<std::size_t> parse_cgroup_bytes(std::string_view text);

/// The "inactive_file N" line of a cgroup's memory.stat (v1 and v2): page cache the kernel
/// reclaims before it kills; 0 when absent.
std::size_t parse_cgroup_inactive_file(std::string_view memory_stat);

/// The cgroup path of the memory controller in /proc/self/cgroup text: the v1 line
/// "N:...memory...:/path" when there is one (v1 and hybrid hierarchies), else the v2 line
/// "0::/path". `v1` tells which. nullopt when neither is present.
struct CgroupPath {
  std::string path;
  bool v1 = false;
};
std::optional<CgroupPath> parse_memory_cgroup(std::string_view proc_self_cgroup);

struct HostMemoryLimits {
  std::optional<std::size_t> mem_available;    ///< MemAvailable; nullopt: unknown
  std::optional<std::size_t> cgroup_headroom;  ///< min over the cgroup and its ancestors of
                                               ///< limit - usage + inactive_file; nullopt: no limit
  std::string cgroup;                          ///< the limiting cgroup's directory (messages)
  std::size_t cgroup_limit = 0;                ///< its limit (messages)
};

/// Reads /proc/meminfo, /proc/self/cgroup and the cgroup files under `cgroup_root`.
HostMemoryLimits read_host_memory_limits(const std::string& cgroup_root = "/sys/fs/cgroup");

/// kOutOfMemory, with the numbers and what to do, when `bytes` exceed MemAvailable or the
/// cgroup's headroom; ok otherwise (and when nothing is known).
Status check_host_memory(std::size_t bytes, const HostMemoryLimits& limits);

/// sysfs path of a PCI device's NUMA node: "0000:3B:00.0" (cudaDeviceGetPCIBusId, upper
/// case) -> "/sys/bus/pci/devices/0000:3b:00.0/numa_node".
std::string pci_numa_node_path(std::string_view pci_bus_id);

/// The contents of a numa_node file: the node, or -1 (no NUMA, or unreadable).
int parse_numa_node(std::string_view text);

/// The whole file, or nullopt when it cannot be read.
std::optional<std::string> read_text_file(const std::string& path);

}  // namespace radixtier::cuda::detail
