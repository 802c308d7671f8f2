// The pinned host pool (see include/radixtier/cuda/pinned_host_pool.hpp).
#include "radixtier/cuda/pinned_host_pool.hpp"

#include <cuda_runtime_api.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "cuda_runtime.hpp"
#include "host_memory.hpp"

namespace radixtier::cuda {
namespace {

std::string gib(std::size_t bytes) {
  return std::to_string(static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30)) +
         " GiB";
}

std::string memlock_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "unknown";
  if (lim.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(lim.rlim_cur) + " bytes";
}

// Writes one byte per OS page from several threads, so every page is backed before pinning.
void touch(std::byte* data, std::size_t bytes, unsigned threads) {
  const std::size_t os_page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t pages = (bytes + os_page - 1) / os_page;
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(pages)));
  auto work = [&](unsigned t) {
    const std::size_t first = pages * t / threads, last = pages * (t + 1) / threads;
    for (std::size_t p = first; p < last; ++p) data[p * os_page] = std::byte{0};
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

// The NUMA node to bind to: the explicit one, or the device's (the runtime's attribute, else
// the PCI device's numa_node in sysfs), or kNoNuma.
int resolve_numa_node(detail::CudaRuntime& rt, const PinnedHostPool::Options& o) {
  if (o.numa_node >= 0) return o.numa_node;
  if (o.numa_node != PinnedHostPool::kNumaOfDevice) return PinnedHostPool::kNoNuma;
  int node = -1;
  if (rt.device_get_attribute(&node, cudaDevAttrHostNumaId, o.device) == cudaSuccess && node >= 0)
    return node;
  char bus[64] = {};
  if (rt.device_get_pci_bus_id(bus, sizeof(bus), o.device) == cudaSuccess) {
    if (auto text = detail::read_text_file(detail::pci_numa_node_path(bus)))
      return detail::parse_numa_node(*text);
  }
  return PinnedHostPool::kNoNuma;
}

// mbind(2) of [p, p + bytes) to `node`; errno text on failure.
std::string bind_to_node(void* p, std::size_t bytes, int node, bool strict) {
  constexpr std::size_t kBits = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask(static_cast<std::size_t>(node) / kBits + 1, 0);
  mask[static_cast<std::size_t>(node) / kBits] |= 1ul << (static_cast<std::size_t>(node) % kBits);
  // The kernel reads maxnode - 1 bits.
  const long r = syscall(SYS_mbind, p, bytes, strict ? MPOL_BIND : MPOL_PREFERRED, mask.data(),
                         mask.size() * kBits + 1, 0u);
  return r == 0 ? std::string() : std::string(std::strerror(errno));
}

}  // namespace

Result<PinnedHostPool> PinnedHostPool::create(std::size_t bytes, std::size_t item_bytes,
                                              Options options) {
  return create(bytes, item_bytes, std::move(options), detail::real_runtime());
}

Result<PinnedHostPool> PinnedHostPool::create(std::size_t bytes, std::size_t item_bytes,
                                              Options options, detail::CudaRuntime& rt) {
  if (bytes == 0) return invalid_argument("PinnedHostPool: bytes must be > 0");
  if (item_bytes == 0) return invalid_argument("PinnedHostPool: item_bytes must be > 0");
  const std::size_t os_page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t max_chunk = std::min(options.max_register_chunk, kMaxRegisterChunk);
  // A chunk is a whole number of items and of OS pages, as large as max_chunk allows; when
  // one such unit is larger than max_chunk, a whole number of OS pages (items may then
  // straddle two registrations: the planner splits pieces there).
  const std::size_t unit = std::lcm(item_bytes, os_page);
  const std::size_t chunk =
      unit <= max_chunk ? max_chunk / unit * unit : max_chunk / os_page * os_page;
  if (chunk == 0) return invalid_argument("PinnedHostPool: max_register_chunk below one OS page");
  const std::size_t mapped_bytes = (bytes + os_page - 1) / os_page * os_page;
  if (options.check_memory) {
    if (Status s = detail::check_host_memory(mapped_bytes, detail::read_host_memory_limits()); !s)
      return s;
  }
  detail::ErrorScope errors(rt);
  detail::CaptureModeGuard relaxed(rt);
  CUcontext ctx = nullptr;
  if (cudaError_t err = rt.primary_ctx_retain(&ctx, options.device); err != cudaSuccess)
    return Status(ErrorCode::kFailedPrecondition,
                  std::string("PinnedHostPool: cuDevicePrimaryCtxRetain(device ") +
                      std::to_string(options.device) + ") failed: " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err) + " (is a CUDA device visible?)");

  PinnedHostPool pool;
  pool.rt_ = &rt;
  pool.ctx_ = ctx;
  pool.device_ = options.device;
  pool.bytes_ = bytes;
  pool.mapped_bytes_ = mapped_bytes;
  pool.chunk_ = chunk;
  void* p = mmap(nullptr, pool.mapped_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    pool.mapped_bytes_ = 0;
    return out_of_memory("PinnedHostPool: mmap of " + gib(bytes) +
                         " failed: " + std::strerror(errno) + " (is that much host RAM free?)");
  }
  pool.data_ = static_cast<std::byte*>(p);
  // A fork() must not share the pinned pages copy-on-write with a child.
  if (madvise(p, pool.mapped_bytes_, MADV_DONTFORK) != 0)
    return Status(
        ErrorCode::kFailedPrecondition,
        std::string("PinnedHostPool: madvise(MADV_DONTFORK) failed: ") + std::strerror(errno));
  if (options.huge_pages) (void)madvise(p, pool.mapped_bytes_, MADV_HUGEPAGE);
  const int node = resolve_numa_node(rt, options);
  if (node >= 0) {
    const std::string err = bind_to_node(p, pool.mapped_bytes_, node, options.numa_strict);
    if (err.empty()) {
      pool.numa_node_ = node;
    } else if (options.numa_strict) {
      return Status(ErrorCode::kFailedPrecondition, "PinnedHostPool: mbind to NUMA node " +
                                                        std::to_string(node) + " failed: " + err);
    }
  }
  const unsigned threads = options.touch_threads != 0
                               ? options.touch_threads
                               : std::min(16u, std::max(1u, std::thread::hardware_concurrency()));
  touch(pool.data_, pool.mapped_bytes_, threads);

  unsigned flags = cudaHostRegisterPortable;
  if (options.mapped) flags |= cudaHostRegisterMapped;
  detail::ContextGuard guard(rt, ctx);
  if (guard.error() != cudaSuccess)
    return Status(
        ErrorCode::kFailedPrecondition,
        std::string("PinnedHostPool: cuCtxSetCurrent failed: ") + cudaGetErrorName(guard.error()));
  for (std::size_t off = 0; off < pool.mapped_bytes_; off += chunk) {
    const std::size_t len = std::min(chunk, pool.mapped_bytes_ - off);
    const cudaError_t err = rt.host_register(pool.data_ + off, len, flags);
    if (err != cudaSuccess) {
      const std::string msg =
          "PinnedHostPool: cudaHostRegister of chunk " + std::to_string(off / chunk) + " (" +
          gib(len) + " at offset " + gib(off) + " of a " + gib(bytes) +
          " pool) failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) +
          ". Check that a CUDA device is visible, RLIMIT_MEMLOCK (now " + memlock_limit() +
          "; containers: --ulimit memlock=-1), the container's memory "
          "limit and free host RAM.";
      return Status(ErrorCode::kOutOfMemory, msg);  // pool's destructor undoes the rest
    }
    pool.registered_.push_back(pool.data_ + off);
  }
  return pool;
}

PinnedHostPool& PinnedHostPool::operator=(PinnedHostPool&& other) noexcept {
  if (this != &other) {
    reset();
    rt_ = std::exchange(other.rt_, nullptr);
    ctx_ = std::exchange(other.ctx_, nullptr);
    device_ = std::exchange(other.device_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    chunk_ = std::exchange(other.chunk_, 0);
    numa_node_ = std::exchange(other.numa_node_, kNoNuma);
    registered_ = std::exchange(other.registered_, {});
  }
  return *this;
}

void PinnedHostPool::reset() {
  if (rt_ != nullptr && !registered_.empty()) {
    detail::EntryScope scope(*rt_, ctx_);
    for (std::byte* chunk : registered_) (void)rt_->host_unregister(chunk);
  }
  registered_.clear();
  if (rt_ != nullptr && ctx_ != nullptr) {
    detail::ErrorScope errors(*rt_);
    (void)rt_->primary_ctx_release(device_);
  }
  ctx_ = nullptr;
  rt_ = nullptr;
  if (data_ != nullptr) munmap(data_, mapped_bytes_);
  data_ = nullptr;
  bytes_ = mapped_bytes_ = chunk_ = 0;
  numa_node_ = kNoNuma;
}

}  // namespace radixtier::cuda
