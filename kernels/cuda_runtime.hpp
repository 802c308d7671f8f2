// Internal: the CUDA runtime calls of the CUDA engine and the pinned pool, behind one
// interface, so that the CPU tests (tests/cuda_engine_test.cpp) can put a fake runtime under
// the real engine and check its planning, validation, error classification, fallback,
// capture behaviour, contexts and streams on a machine without a GPU.
//
// real_runtime() forwards each call to the CUDA runtime of the same name, or to the driver
// API function named in its comment (resolved once through cudaGetDriverEntryPointByVersion:
// nothing links libcuda). Nothing here changes what the calls do; version differences
// (cudaMemcpyBatchAsync before 12.8, its CUDA 13 signature, cudaStreamGetDevice) are hidden
// in the real implementation.
//
// Also here: the pure helpers of the engine that the CPU tests check directly (error
// classes, the pseudo-stream test, ticket id allocation) and the RAII guards every entry
// point opens (EntryScope: last-error hygiene, relaxed capture mode, the engine's context).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "copy_kernels.hpp"
#include "radixtier/ids.hpp"

namespace radixtier::cuda::detail {

class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;

  virtual cudaError_t get_device_count(int* count) = 0;
  virtual cudaError_t get_device(int* device) = 0;
  virtual cudaError_t set_device(int device) = 0;
  virtual cudaError_t driver_get_version(int* version) = 0;
  virtual cudaError_t runtime_get_version(int* version) = 0;
  virtual cudaError_t device_get_attribute(int* value, cudaDeviceAttr attr, int device) = 0;
  virtual cudaError_t device_get_pci_bus_id(char* id, int len, int device) = 0;
  virtual cudaError_t device_get_stream_priority_range(int* least, int* greatest) = 0;
  virtual cudaError_t pointer_get_attributes(cudaPointerAttributes* attr, const void* ptr) = 0;

  virtual cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned flags,
                                                  int priority) = 0;
  virtual cudaError_t stream_destroy(cudaStream_t stream) = 0;
  virtual cudaError_t stream_synchronize(cudaStream_t stream) = 0;
  virtual cudaError_t stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) = 0;
  /// cudaStreamGetDevice (CUDA 12.8+); cudaErrorNotSupported when the runtime lacks it.
  virtual cudaError_t stream_get_device(cudaStream_t stream, int* device) = 0;
  virtual cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned flags) = 0;

  virtual cudaError_t event_create_with_flags(cudaEvent_t* event, unsigned flags) = 0;
  virtual cudaError_t event_destroy(cudaEvent_t event) = 0;
  virtual cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) = 0;
  virtual cudaError_t event_query(cudaEvent_t event) = 0;
  virtual cudaError_t event_synchronize(cudaEvent_t event) = 0;

  virtual cudaError_t malloc_device(void** ptr, std::size_t bytes) = 0;
  virtual cudaError_t free_device(void* ptr) = 0;
  virtual cudaError_t memcpy_sync(void* dst, const void* src, std::size_t bytes,
                                  cudaMemcpyKind kind) = 0;
  virtual cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes,
                                   cudaMemcpyKind kind, cudaStream_t stream) = 0;
  /// cudaMemcpyBatchAsync with one attribute (source access order: stream, prefer overlap
  /// with compute) for every copy; `invalid_order` passes cudaMemcpySrcAccessOrderInvalid
  /// instead (the engine's error-injection hook: CUDA rejects it with cudaErrorInvalidValue).
  /// cudaErrorNotSupported when the runtime is older than 12.8.
  virtual cudaError_t memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                         const std::size_t* sizes, std::size_t count,
                                         bool invalid_order, cudaStream_t stream) = 0;
  /// The zero-copy gather/scatter kernel (copy_kernels.cu); returns the launch's own error.
  virtual cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                            std::byte* host_base, std::size_t host_item_bytes,
                                            const LaunchItems& items, bool to_host, int blocks,
                                            cudaStream_t stream) = 0;

  /// The device-to-device slot copy kernel (copy_kernels.cu); returns the launch's own error.
  virtual cudaError_t launch_slot_copy(const DeviceSegment* page_segments, int num_page_segments,
                                       const DeviceSegment* slot_segments, int num_slot_segments,
                                       std::size_t page_bytes, std::size_t snapshot_bytes,
                                       const SlotLaunch& launch, int blocks,
                                       cudaStream_t stream) = 0;

  virtual cudaError_t host_register(void* ptr, std::size_t bytes, unsigned flags) = 0;
  virtual cudaError_t host_unregister(void* ptr) = 0;

  virtual cudaError_t get_last_error() = 0;
  virtual cudaError_t peek_at_last_error() = 0;

  /// cudaThreadExchangeStreamCaptureMode: the calling thread's capture interaction mode.
  virtual cudaError_t thread_exchange_stream_capture_mode(cudaStreamCaptureMode* mode) = 0;
  /// cudaStreamGetFlags (cudaStreamNonBlocking or cudaStreamDefault).
  virtual cudaError_t stream_get_flags(cudaStream_t stream, unsigned* flags) = 0;
  /// cudaFuncGetAttributes of the gather/scatter and slot copy kernels (which also loads them
  /// under lazy module loading): cudaErrorNoKernelImageForDevice (or
  /// cudaErrorInvalidDeviceFunction...) when the binary has no image for this device.
  virtual cudaError_t probe_kernel() = 0;

  // Driver API (contexts are a driver notion; CUresult codes map onto cudaError_t ones).
  /// cuCtxGetCurrent: the calling thread's current context; nullptr when it has none.
  virtual cudaError_t ctx_get_current(CUcontext* ctx) = 0;
  /// cuCtxSetCurrent (nullptr: the thread has no current context afterwards).
  virtual cudaError_t ctx_set_current(CUcontext ctx) = 0;
  /// cuDeviceGet + cuDevicePrimaryCtxRetain: the device's primary context (the one the
  /// runtime and PyTorch use), created if it does not exist yet.
  virtual cudaError_t primary_ctx_retain(CUcontext* ctx, int device) = 0;
  /// cuDeviceGet + cuDevicePrimaryCtxRelease.
  virtual cudaError_t primary_ctx_release(int device) = 0;
  /// cuMemGetAddressRange: the device allocation (or VMM mapping) that holds `ptr`.
  virtual cudaError_t mem_get_address_range(std::uintptr_t ptr, std::uintptr_t* base,
                                            std::size_t* bytes) = 0;
};

/// The CUDA runtime itself (not final: a GPU test may override one call, e.g. to make
/// cudaMemcpyBatchAsync report cudaErrorNotSupported on a real device).
class RealRuntime : public CudaRuntime {
 public:
  cudaError_t get_device_count(int* count) override;
  cudaError_t get_device(int* device) override;
  cudaError_t set_device(int device) override;
  cudaError_t driver_get_version(int* version) override;
  cudaError_t runtime_get_version(int* version) override;
  cudaError_t device_get_attribute(int* value, cudaDeviceAttr attr, int device) override;
  cudaError_t device_get_pci_bus_id(char* id, int len, int device) override;
  cudaError_t device_get_stream_priority_range(int* least, int* greatest) override;
  cudaError_t pointer_get_attributes(cudaPointerAttributes* attr, const void* ptr) override;
  cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned flags,
                                          int priority) override;
  cudaError_t stream_destroy(cudaStream_t stream) override;
  cudaError_t stream_synchronize(cudaStream_t stream) override;
  cudaError_t stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) override;
  cudaError_t stream_get_device(cudaStream_t stream, int* device) override;
  cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned flags) override;
  cudaError_t event_create_with_flags(cudaEvent_t* event, unsigned flags) override;
  cudaError_t event_destroy(cudaEvent_t event) override;
  cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) override;
  cudaError_t event_query(cudaEvent_t event) override;
  cudaError_t event_synchronize(cudaEvent_t event) override;
  cudaError_t malloc_device(void** ptr, std::size_t bytes) override;
  cudaError_t free_device(void* ptr) override;
  cudaError_t memcpy_sync(void* dst, const void* src, std::size_t bytes,
                          cudaMemcpyKind kind) override;
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                           cudaStream_t stream) override;
  cudaError_t memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                 const std::size_t* sizes, std::size_t count, bool invalid_order,
                                 cudaStream_t stream) override;
  cudaError_t launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                    std::byte* host_base, std::size_t host_item_bytes,
                                    const LaunchItems& items, bool to_host, int blocks,
                                    cudaStream_t stream) override;
  cudaError_t launch_slot_copy(const DeviceSegment* page_segments, int num_page_segments,
                               const DeviceSegment* slot_segments, int num_slot_segments,
                               std::size_t page_bytes, std::size_t snapshot_bytes,
                               const SlotLaunch& launch, int blocks, cudaStream_t stream) override;
  cudaError_t host_register(void* ptr, std::size_t bytes, unsigned flags) override;
  cudaError_t host_unregister(void* ptr) override;
  cudaError_t get_last_error() override;
  cudaError_t peek_at_last_error() override;
  cudaError_t thread_exchange_stream_capture_mode(cudaStreamCaptureMode* mode) override;
  cudaError_t stream_get_flags(cudaStream_t stream, unsigned* flags) override;
  cudaError_t probe_kernel() override;
  cudaError_t ctx_get_current(CUcontext* ctx) override;
  cudaError_t ctx_set_current(CUcontext ctx) override;
  cudaError_t primary_ctx_retain(CUcontext* ctx, int device) override;
  cudaError_t primary_ctx_release(int device) override;
  cudaError_t mem_get_address_range(std::uintptr_t ptr, std::uintptr_t* base,
                                    std::size_t* bytes) override;
};

/// The CUDA runtime itself (one RealRuntime).
CudaRuntime& real_runtime();

/// What a test may substitute when it creates an engine (CudaTransferEngine::create).
struct EngineSeams {
  CudaRuntime* runtime = nullptr;     ///< nullptr: real_runtime()
  std::uint32_t first_ticket_id = 0;  ///< where ticket ids start (tests of the wrap)
};

// --- error classes -------------------------------------------------------------------------

enum class ErrorClass {
  kOk,
  kNotReady,     ///< cudaErrorNotReady: not an error, the work is still running
  kUnsupported,  ///< the call is not available here (NotSupported, CallRequiresNewerDriver)
  kCapture,      ///< a stream-capture rule refused the call (9xx capture errors)
  kFatal,        ///< sticky: the context is lost, every later call fails (restart the process)
  kFailed,       ///< any other error: this call failed, the context is fine
};

ErrorClass classify(cudaError_t err);
const char* to_string(ErrorClass c);

/// nullptr (the legacy default stream), cudaStreamLegacy and cudaStreamPerThread: the
/// handles that name no stream object.
inline bool is_pseudo_stream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/// The stream a caller's handle means to the engine: 0 is PyTorch's default stream, the
/// legacy default stream (torch.cuda.current_stream().cuda_stream == 0 unless PyTorch was
/// built for per-thread default streams), so it becomes cudaStreamLegacy, which means the
/// legacy stream whatever flags this library was compiled with.
inline cudaStream_t resolve_stream(cudaStream_t s) {
  return s == nullptr ? cudaStreamLegacy : s;
}

/// The next ticket id from `next`: never TicketId::kInvalid and never one still in `live`
/// (after 2^32 tickets the counter wraps). `live` has contains(TicketId).
template <class Map>
std::uint32_t take_ticket_id(std::uint32_t& next, const Map& live) {
  while (true) {
    const std::uint32_t id = next++;
    if (id != TicketId::kInvalid && !live.contains(TicketId(id))) return id;
  }
}

/// Last-error hygiene of every engine entry point: the engine never leaves an error of its
/// own (cudaErrorNotReady from a pending poll, a refused call) as the thread's last error,
/// where the caller's next launch check (PyTorch's) would throw on it, and never clears an
/// error that was already pending when the call began (the caller's own).
class ErrorScope {
 public:
  explicit ErrorScope(CudaRuntime& rt) : rt_(rt), clean_(rt.peek_at_last_error() == cudaSuccess) {}
  ~ErrorScope() {
    if (clean_) (void)rt_.get_last_error();  // a sticky error survives this (and is reported)
  }
  ErrorScope(const ErrorScope&) = delete;
  ErrorScope& operator=(const ErrorScope&) = delete;

 private:
  CudaRuntime& rt_;
  bool clean_;
};

/// Sets the calling thread's capture interaction mode to relaxed for the scope and restores
/// the caller's mode afterwards. In the default (global) mode, an event query, a synchronize
/// or a cudaMalloc made while *any* thread captures a graph in global mode (torch.cuda.graph
/// does, on a side stream) is refused and invalidates that capture; relaxed mode allows the
/// engine's calls, none of which touches a captured stream.
class CaptureModeGuard {
 public:
  explicit CaptureModeGuard(CudaRuntime& rt) : rt_(rt) {
    changed_ = rt_.thread_exchange_stream_capture_mode(&mode_) == cudaSuccess;
  }
  ~CaptureModeGuard() {
    if (changed_) (void)rt_.thread_exchange_stream_capture_mode(&mode_);
  }
  CaptureModeGuard(const CaptureModeGuard&) = delete;
  CaptureModeGuard& operator=(const CaptureModeGuard&) = delete;

 private:
  CudaRuntime& rt_;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool changed_ = false;
};

/// Makes `ctx` (the engine's primary context) current for the scope and restores the
/// caller's current context afterwards, "none" included. Unlike cudaGetDevice/cudaSetDevice,
/// which report device 0 on a thread that never chose one and create a primary context there
/// when it is "restored", this never creates a context.
class ContextGuard {
 public:
  ContextGuard(CudaRuntime& rt, CUcontext ctx) : rt_(rt) {
    err_ = rt_.ctx_get_current(&previous_);
    if (err_ == cudaSuccess && previous_ != ctx) {
      err_ = rt_.ctx_set_current(ctx);
      changed_ = err_ == cudaSuccess;
    }
  }
  ~ContextGuard() {
    if (changed_) (void)rt_.ctx_set_current(previous_);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  cudaError_t error() const { return err_; }

 private:
  CudaRuntime& rt_;
  CUcontext previous_ = nullptr;
  bool changed_ = false;
  cudaError_t err_ = cudaSuccess;
};

/// What every entry point of the engine and the pool opens, in this order (and closes in the
/// reverse one): last-error hygiene, relaxed capture mode, the engine's context.
class EntryScope {
 public:
  EntryScope(CudaRuntime& rt, CUcontext ctx) : errors_(rt), capture_(rt), context_(rt, ctx) {}
  cudaError_t error() const { return context_.error(); }

 private:
  ErrorScope errors_;
  CaptureModeGuard capture_;
  ContextGuard context_;
};

}  // namespace radixtier::cuda::detail
