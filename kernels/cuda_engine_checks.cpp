// The CUDA engine's checks for create(): the host pools are pinned (and mapped when needed),
// the device pools lie in the engine's device memory, a PinnedHostPool's memory and chunk size,
// the stream rule; and the CUDA error text every part of the engine writes.
#include <sstream>
#include <string>

#include "cuda_engine_internal.hpp"
#include "cuda_runtime.hpp"

namespace radixtier::cuda::detail {
namespace {

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

std::string cuda_error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

std::string versions(detail::CudaRuntime& rt) {
  int driver = 0, runtime = 0;
  (void)rt.driver_get_version(&driver);
  (void)rt.runtime_get_version(&runtime);
  return "driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
}

// The host pool must be pinned (registered or cudaHostAlloc'd) for async DMA, and mapped for
// the zero-copy kernels; its last byte too (a pool shorter than its page count is refused).
// `mapped` tells whether both ends are mapped at their host address.
Status check_host_pool(detail::CudaRuntime& rt, const char* name, const std::byte* ptr,
                       std::size_t bytes, bool need_mapped, bool& mapped) {
  mapped = true;
  for (const std::byte* p : {ptr, ptr + bytes - 1}) {
    const char* where = p == ptr ? "" : " (its last byte)";
    cudaPointerAttributes attr{};
    const cudaError_t err = rt.pointer_get_attributes(&attr, p);
    if (err != cudaSuccess)
      return invalid_argument(std::string("CudaPools.") + name + where + ": " +
                              cuda_error("cudaPointerGetAttributes", err));
    if (attr.type != cudaMemoryTypeHost)
      return invalid_argument(std::string("CudaPools.") + name + where +
                              " is not pinned host memory (use PinnedHostPool)");
    mapped = mapped && attr.devicePointer == p;
    if (need_mapped && attr.devicePointer != p)
      return invalid_argument(
          std::string("CudaPools.") + name + where +
          " is not mapped at its host address (a zero-copy method needs "
          "cudaHostRegisterMapped and cudaDevAttrCanUseHostPointerForRegisteredMem)");
  }
  return Status::ok();
}

// Every segment of a device pool must lie in device memory of the engine's device: its first
// byte is device (or managed) memory of `device`, and the allocations that cuMemGetAddressRange
// reports, walked from it, reach its last byte without a gap (one cudaMalloc, or the VMM
// mappings of one reserved range, as PyTorch's expandable segments make).
Status check_device_layout(detail::CudaRuntime& rt, const char* name, const DeviceLayout& layout,
                           int device) {
  for (std::size_t i = 0; i < layout.segments.size(); ++i) {
    const StridedSegment& s = layout.segments[i];
    const std::string what = std::string("CudaPools.") + name + " segment " + std::to_string(i);
    const std::uintptr_t first = s.base;
    const std::uintptr_t last =
        s.base + std::size_t{layout.items - 1} * s.item_stride + s.bytes - 1;
    cudaPointerAttributes attr{};
    if (cudaError_t err = rt.pointer_get_attributes(&attr, reinterpret_cast<const void*>(first));
        err != cudaSuccess)
      return invalid_argument(what + ": " + cuda_error("cudaPointerGetAttributes", err));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      return invalid_argument(what + ": base " + hex(first) + " is not device memory");
    if (attr.device != device)
      return invalid_argument(what + ": memory of device " + std::to_string(attr.device) +
                              ", but the engine is on device " + std::to_string(device));
    std::uintptr_t at = first;
    for (std::size_t step = 0;; ++step) {
      std::uintptr_t base = 0;
      std::size_t bytes = 0;
      const cudaError_t err = rt.mem_get_address_range(at, &base, &bytes);
      if (classify(err) == ErrorClass::kUnsupported) break;  // no driver call to ask: unchecked
      if (err != cudaSuccess || base > at || at - base >= bytes)
        return invalid_argument(what + " [" + hex(first) + ", " + hex(last + 1) + ") of " +
                                std::to_string(layout.items) + " items: byte " + hex(at) +
                                " is in no device allocation" +
                                (err != cudaSuccess
                                     ? " (" + cuda_error("cuMemGetAddressRange", err) + ")"
                                     : std::string()) +
                                "; check the pool's base, stride, size and item count");
      if (last - base < bytes) break;
      at = base + bytes;
      if (step > (std::size_t{1} << 20))
        return invalid_argument(what + ": more than 2^20 allocations under one segment");
      // The next mapping must be this device's memory too.
      cudaPointerAttributes next{};
      if (rt.pointer_get_attributes(&next, reinterpret_cast<const void*>(at)) == cudaSuccess &&
          (next.type == cudaMemoryTypeDevice || next.type == cudaMemoryTypeManaged) &&
          next.device != device)
        return invalid_argument(what + ": byte " + hex(at) + " is memory of device " +
                                std::to_string(next.device) + ", but the engine is on device " +
                                std::to_string(device));
    }
  }
  return Status::ok();
}

// Takes memory and chunk size from a PinnedHostPool when one is given.
Status resolve_host_pool(const char* name, const PinnedHostPool* pool, std::byte*& data,
                         std::size_t& chunk, std::size_t needed) {
  if (pool == nullptr) return Status::ok();
  const std::string field = std::string("CudaPools.") + name;
  if (pool->data() == nullptr) return invalid_argument(field + "_pool: an empty PinnedHostPool");
  if (data == nullptr) data = pool->data();
  if (data != pool->data())
    return invalid_argument(field + ": differs from " + name + "_pool->data()");
  if (chunk != 0 && chunk != pool->register_chunk_bytes())
    return invalid_argument(field + "_chunk_bytes: " + std::to_string(chunk) + " but " + name +
                            "_pool registers in chunks of " +
                            std::to_string(pool->register_chunk_bytes()) + " bytes");
  chunk = pool->register_chunk_bytes();
  if (needed > pool->bytes())
    return invalid_argument(field + "_pool: " + std::to_string(pool->bytes()) + " bytes, but " +
                            std::to_string(needed) + " needed");
  return Status::ok();
}

Status stream_rule(const char* field, cudaStream_t s) {
  if (s == cudaStreamPerThread)
    return invalid_argument(std::string(field) +
                            ": cudaStreamPerThread is the calling thread's per-thread default "
                            "stream, a different stream on every thread; pass the model's own "
                            "stream, or nullptr for the legacy default stream (PyTorch's "
                            "default stream)");
  return Status::ok();
}

}  // namespace radixtier::cuda::detail
