// Internal: the CUDA runtime calls of the CUDA engine and the pinned pool, behind one
// interface, so that the CPU tests (tests/cuda_engine_test.cpp) can put a fake runtime under
// the real engine and check its planning, validation, error classification, fallback,
// capture refusal and error hygiene on a machine without a GPU.
//
// real_runtime() forwards each call to the CUDA runtime of the same name. Nothing here
// changes what the calls do; version differences (cudaMemcpyBatchAsync before 12.8, its
// CUDA 13 signature, cudaStreamGetDevice) are hidden in the real implementation.
//
// Also here: the pure helpers of the engine that the CPU tests check directly (error
// classes, the pseudo-stream test, ticket id allocation) and two RAII guards.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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

  virtual cudaError_t host_register(void* ptr, std::size_t bytes, unsigned flags) = 0;
  virtual cudaError_t host_unregister(void* ptr) = 0;

  virtual cudaError_t get_last_error() = 0;
  virtual cudaError_t peek_at_last_error() = 0;
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
  cudaError_t host_register(void* ptr, std::size_t bytes, unsigned flags) override;
  cudaError_t host_unregister(void* ptr) override;
  cudaError_t get_last_error() override;
  cudaError_t peek_at_last_error() override;
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

/// nullptr (the legacy default stream), cudaStreamLegacy and cudaStreamPerThread: handles
/// whose meaning depends on the calling thread, not on the model's stream.
inline bool is_pseudo_stream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
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

/// Makes `device` current for the scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  DeviceGuard(CudaRuntime& rt, int device) : rt_(rt) {
    err_ = rt_.get_device(&previous_);
    if (err_ == cudaSuccess && previous_ != device) {
      err_ = rt_.set_device(device);
      changed_ = err_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (changed_) (void)rt_.set_device(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t error() const { return err_; }

 private:
  CudaRuntime& rt_;
  int previous_ = 0;
  bool changed_ = false;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace radixtier::cuda::detail
