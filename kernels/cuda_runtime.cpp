// The real CUDA runtime behind detail::CudaRuntime, and the error classes (see
// cuda_runtime.hpp).
#include "cuda_runtime.hpp"

#include <cudaTypedefs.h>

namespace radixtier::cuda::detail {
namespace {

// The driver API functions the engine needs, resolved once through the runtime (no link
// against libcuda: the static runtime loads the driver itself). A function the driver does
// not have stays null and its call reports cudaErrorNotSupported.
struct DriverApi {
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_release = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
};

template <class Fn>
void resolve(const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &status);
#endif
  if (err == cudaSuccess && status == cudaDriverEntryPointSuccess) fn = reinterpret_cast<Fn>(p);
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    const bool clean = cudaPeekAtLastError() == cudaSuccess;
    resolve("cuCtxGetCurrent", a.ctx_get_current);
    resolve("cuCtxSetCurrent", a.ctx_set_current);
    resolve("cuDeviceGet", a.device_get);
    resolve("cuDevicePrimaryCtxRetain", a.primary_retain);
    resolve("cuDevicePrimaryCtxRelease", a.primary_release);
    resolve("cuMemGetAddressRange", a.address_range);
    if (clean) (void)cudaGetLastError();  // a missing driver is reported by the calls
    return a;
  }();
  return api;
}

// CUresult and cudaError_t share their codes for every error these calls return (invalid
// value 1, not initialized 3, deinitialized 4, invalid device 101, invalid context 201...).
cudaError_t from_driver(CUresult r) {
  return static_cast<cudaError_t>(static_cast<int>(r));
}

}  // namespace

cudaError_t RealRuntime::get_device_count(int* count) {
  return cudaGetDeviceCount(count);
}

cudaError_t RealRuntime::get_device(int* device) {
  return cudaGetDevice(device);
}

cudaError_t RealRuntime::set_device(int device) {
  return cudaSetDevice(device);
}

cudaError_t RealRuntime::driver_get_version(int* version) {
  return cudaDriverGetVersion(version);
}

cudaError_t RealRuntime::runtime_get_version(int* version) {
  return cudaRuntimeGetVersion(version);
}

cudaError_t RealRuntime::device_get_attribute(int* value, cudaDeviceAttr attr, int device) {
  return cudaDeviceGetAttribute(value, attr, device);
}

cudaError_t RealRuntime::device_get_pci_bus_id(char* id, int len, int device) {
  return cudaDeviceGetPCIBusId(id, len, device);
}

cudaError_t RealRuntime::device_get_stream_priority_range(int* least, int* greatest) {
  return cudaDeviceGetStreamPriorityRange(least, greatest);
}

cudaError_t RealRuntime::pointer_get_attributes(cudaPointerAttributes* attr, const void* ptr) {
  return cudaPointerGetAttributes(attr, ptr);
}

cudaError_t RealRuntime::stream_create_with_priority(cudaStream_t* stream, unsigned flags,
                                                     int priority) {
  return cudaStreamCreateWithPriority(stream, flags, priority);
}

cudaError_t RealRuntime::stream_destroy(cudaStream_t stream) {
  return cudaStreamDestroy(stream);
}

cudaError_t RealRuntime::stream_synchronize(cudaStream_t stream) {
  return cudaStreamSynchronize(stream);
}

cudaError_t RealRuntime::stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamIsCapturing(stream, status);
}

cudaError_t RealRuntime::stream_get_device(cudaStream_t stream, int* device) {
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(stream, device);
#else
  (void)stream;
  (void)device;
  return cudaErrorNotSupported;
#endif
}

cudaError_t RealRuntime::stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  return cudaStreamWaitEvent(stream, event, flags);
}

cudaError_t RealRuntime::event_create_with_flags(cudaEvent_t* event, unsigned flags) {
  return cudaEventCreateWithFlags(event, flags);
}

cudaError_t RealRuntime::event_destroy(cudaEvent_t event) {
  return cudaEventDestroy(event);
}

cudaError_t RealRuntime::event_record(cudaEvent_t event, cudaStream_t stream) {
  return cudaEventRecord(event, stream);
}

cudaError_t RealRuntime::event_query(cudaEvent_t event) {
  return cudaEventQuery(event);
}

cudaError_t RealRuntime::event_synchronize(cudaEvent_t event) {
  return cudaEventSynchronize(event);
}

cudaError_t RealRuntime::malloc_device(void** ptr, std::size_t bytes) {
  return cudaMalloc(ptr, bytes);
}

cudaError_t RealRuntime::free_device(void* ptr) {
  return cudaFree(ptr);
}

cudaError_t RealRuntime::memcpy_sync(void* dst, const void* src, std::size_t bytes,
                                     cudaMemcpyKind kind) {
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t RealRuntime::memcpy_async(void* dst, const void* src, std::size_t bytes,
                                      cudaMemcpyKind kind, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, src, bytes, kind, stream);
}

cudaError_t RealRuntime::memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                            const std::size_t* sizes, std::size_t count,
                                            bool invalid_order, cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder =
      invalid_order ? cudaMemcpySrcAccessOrderInvalid : cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  std::size_t attr_index = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, stream);
#else
  std::size_t fail_index = 0;
  return cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs),
                              const_cast<std::size_t*>(sizes), count, &attr, &attr_index, 1,
                              &fail_index, stream);
#endif
#else
  (void)dsts;
  (void)srcs;
  (void)sizes;
  (void)count;
  (void)invalid_order;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

cudaError_t RealRuntime::launch_gather_scatter(const DeviceSegment* segments, int num_segments,
                                               std::byte* host_base, std::size_t host_item_bytes,
                                               const LaunchItems& items, bool to_host, int blocks,
                                               cudaStream_t stream) {
  return detail::launch_gather_scatter(segments, num_segments, host_base, host_item_bytes, items,
                                       to_host, blocks, stream);
}

cudaError_t RealRuntime::launch_slot_copy(const DeviceSegment* page_segments, int num_page_segments,
                                          const DeviceSegment* slot_segments, int num_slot_segments,
                                          std::size_t page_bytes, std::size_t snapshot_bytes,
                                          const SlotLaunch& launch, int blocks,
                                          cudaStream_t stream) {
  return detail::launch_slot_copy(page_segments, num_page_segments, slot_segments,
                                  num_slot_segments, page_bytes, snapshot_bytes, launch, blocks,
                                  stream);
}

cudaError_t RealRuntime::host_register(void* ptr, std::size_t bytes, unsigned flags) {
  return cudaHostRegister(ptr, bytes, flags);
}

cudaError_t RealRuntime::host_unregister(void* ptr) {
  return cudaHostUnregister(ptr);
}

cudaError_t RealRuntime::get_last_error() {
  return cudaGetLastError();
}

cudaError_t RealRuntime::peek_at_last_error() {
  return cudaPeekAtLastError();
}

cudaError_t RealRuntime::thread_exchange_stream_capture_mode(cudaStreamCaptureMode* mode) {
  return cudaThreadExchangeStreamCaptureMode(mode);
}

cudaError_t RealRuntime::stream_get_flags(cudaStream_t stream, unsigned* flags) {
  return cudaStreamGetFlags(stream, flags);
}

cudaError_t RealRuntime::probe_kernel() {
  if (const cudaError_t err = detail::probe_gather_scatter(); err != cudaSuccess) return err;
  return detail::probe_slot_copy();
}

cudaError_t RealRuntime::ctx_get_current(CUcontext* ctx) {
  const DriverApi& d = driver();
  if (d.ctx_get_current == nullptr) return cudaErrorNotSupported;
  return from_driver(d.ctx_get_current(ctx));
}

cudaError_t RealRuntime::ctx_set_current(CUcontext ctx) {
  const DriverApi& d = driver();
  if (d.ctx_set_current == nullptr) return cudaErrorNotSupported;
  return from_driver(d.ctx_set_current(ctx));
}

cudaError_t RealRuntime::primary_ctx_retain(CUcontext* ctx, int device) {
  const DriverApi& d = driver();
  if (d.device_get == nullptr || d.primary_retain == nullptr) return cudaErrorNotSupported;
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, device); r != CUDA_SUCCESS) return from_driver(r);
  return from_driver(d.primary_retain(ctx, dev));
}

cudaError_t RealRuntime::primary_ctx_release(int device) {
  const DriverApi& d = driver();
  if (d.device_get == nullptr || d.primary_release == nullptr) return cudaErrorNotSupported;
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, device); r != CUDA_SUCCESS) return from_driver(r);
  return from_driver(d.primary_release(dev));
}

cudaError_t RealRuntime::mem_get_address_range(std::uintptr_t ptr, std::uintptr_t* base,
                                               std::size_t* bytes) {
  const DriverApi& d = driver();
  if (d.address_range == nullptr) return cudaErrorNotSupported;
  CUdeviceptr b = 0;
  std::size_t n = 0;
  const CUresult r = d.address_range(&b, &n, static_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return from_driver(r);
  *base = static_cast<std::uintptr_t>(b);
  *bytes = n;
  return cudaSuccess;
}

CudaRuntime& real_runtime() {
  static RealRuntime runtime;
  return runtime;
}

ErrorClass classify(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return ErrorClass::kOk;
    case cudaErrorNotReady:
      return ErrorClass::kNotReady;
    case cudaErrorNotSupported:
    case cudaErrorCallRequiresNewerDriver:
      return ErrorClass::kUnsupported;
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
      return ErrorClass::kCapture;
    // The errors driver_types.h documents as leaving the process in an inconsistent state
    // ("any further CUDA work will return the same error"), the uncorrectable hardware
    // errors, a destroyed or unloading context, and an unknown internal error (a context
    // that cannot say it is usable is treated as lost).
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorExternalDevice:
    case cudaErrorMpsClientTerminated:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorCudartUnloading:
    case cudaErrorUnknown:
      return ErrorClass::kFatal;
    default:
      return ErrorClass::kFailed;
  }
}

const char* to_string(ErrorClass c) {
  switch (c) {
    case ErrorClass::kOk:
      return "ok";
    case ErrorClass::kNotReady:
      return "not ready";
    case ErrorClass::kUnsupported:
      return "unsupported";
    case ErrorClass::kCapture:
      return "capture";
    case ErrorClass::kFatal:
      return "fatal";
    case ErrorClass::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace radixtier::cuda::detail

namespace radixtier::cuda {

std::string driver_floor(int runtime_version) {
  const int major = runtime_version / 1000;
  if (major >= 13) return "580";
  if (major == 12) return "525";
  if (major == 11) return "450";
  return "the driver of CUDA " + std::to_string(major);
}

}  // namespace radixtier::cuda
