// A CUDA runtime without a device, for the CPU tests of the CUDA engine and the pinned pool
// (tests/cuda_engine_test.cpp, tests/cuda_contract_test.cpp): the real engine code runs and
// every CUDA call it makes lands here. Handles are distinct fake addresses.
//
// What it models, after CUDA's documented rules:
//   - the last error is per thread: a failing call sets the calling thread's, get_last_error()
//     returns and resets it; a sticky error can never be reset and every call returns it;
//   - contexts: each thread has a current context (none at first). A runtime call that needs
//     one on a thread without one binds device 0's primary context, creating it (the runtime's
//     lazy initialization); cudaSetDevice(d) creates and binds d's primary context;
//     cudaGetDevice reports 0 on a thread without a context. The driver calls
//     (cuCtxGetCurrent / cuCtxSetCurrent / cuDevicePrimaryCtxRetain) never bind implicitly.
//     contexts_created() lists the devices that got a primary context;
//   - streams: explicit streams (blocking or not, of a device) and the legacy stream
//     (cudaStreamLegacy; nullptr is refused as an ambiguous handle: it would mean the
//     per-thread stream in code compiled with --default-stream per-thread);
//   - graph capture: begin_capture(stream, mode) on the calling thread; each thread has a
//     capture interaction mode (cudaThreadExchangeStreamCaptureMode, global at first). A
//     potentially unsafe call (event query or synchronize, stream synchronize, malloc, free,
//     synchronous memcpy, host register) is refused with cudaErrorStreamCaptureUnsupported and
//     invalidates the captures that forbid it: in global mode any other thread's global
//     capture and the thread's own non-relaxed one, in thread-local mode the thread's own,
//     in relaxed mode none. Work on a captured stream joins the capture (counted as nodes);
//     a stream waiting on an event recorded in a capture joins it; the legacy stream used
//     while a blocking stream is captured fails with cudaErrorStreamCaptureImplicit and
//     invalidates that capture;
//   - device memory: add_alloc() declares device allocations (cudaPointerGetAttributes,
//     cuMemGetAddressRange answer from them; any other pointer is mapped pinned host memory);
//   - `execute`: copies, the gather/scatter kernel and the slot copy kernel really move the
//     bytes (device allocations are then real host memory), so a test can check every byte;
//     the slot copy kernel is emulated by running detail::for_each_slot_run, the code the
//     real kernel runs, over its units;
//   - host synchronizations (cudaStreamSynchronize, cudaEventSynchronize and the blocking
//     cudaMemcpy: every call of the seam that blocks the calling thread on the device) are
//     counted per calling thread: host_syncs(thread). The seam has no cudaDeviceSynchronize:
//     the engine never calls it, and every CUDA call of the engine goes through the seam;
//   - cudaMemcpyAsync takes cudaMemcpyDefault, or cudaMemcpyDeviceToDevice between two device
//     allocations (cudaErrorInvalidValue when an end is not device memory); any other kind is
//     cudaErrorInvalidMemcpyDirection.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "copy_kernels.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"

namespace radixtier::cuda::testing {

struct Copy {
  std::uintptr_t dst, src;
  std::size_t bytes;
};

/// One stream operation, in the order the engine issued it.
struct Op {
  enum Kind { kCopy, kLaunch, kRecord, kWait } kind;
  cudaStream_t stream;
  cudaEvent_t event = nullptr;  ///< kRecord, kWait
  std::uintptr_t dst = 0, src = 0;
  std::size_t bytes = 0;
  int device = -1;
};

class FakeRuntime final : public detail::CudaRuntime {
 public:
  // --- knobs
  int device_count = 1;
  cudaError_t device_count_error = cudaSuccess;
  int runtime_version = 13000;
  int sms = 132;
  cudaError_t batch_result = cudaSuccess;            // memcpy_batch_async with a valid order
  cudaError_t query_result = cudaErrorNotReady;      // event_query of every event
  std::map<cudaEvent_t, cudaError_t> event_results;  // per event: overrides query/sync results
  cudaError_t sync_result = cudaSuccess;             // event_synchronize
  cudaError_t launch_result = cudaSuccess;
  cudaError_t probe_result = cudaSuccess;  // probe_kernel
  bool address_range_supported = true;
  bool host_mapped = true;                   // pinned host memory is mapped at its host address
  bool execute = false;                      // copies and kernels move real bytes
  std::function<void(cudaEvent_t)> on_sync;  // runs inside event_synchronize (unlocked)
  int least_priority = 7, greatest_priority = -5;
  int numa_id = -1;
  cudaError_t sticky = cudaSuccess;

  // --- records (read them with the engine idle, or under lock())
  int batch_calls = 0, async_calls = 0, launches = 0, queries = 0, records = 0, syncs = 0;
  int d2d_calls = 0;      // cudaMemcpyAsync(cudaMemcpyDeviceToDevice) accepted (device to device)
  int slot_launches = 0;  // slot copy kernel launches (accepted or not)
  std::vector<std::uint32_t> slot_launch_pieces;  // pieces of each accepted slot launch
  std::vector<int> slot_launch_blocks;
  int capture_violations = 0;  // unsafe calls refused because of a capture
  std::vector<Copy> copies;    // every DMA copy enqueued, batch or per piece
  std::vector<std::uint32_t> launch_items;
  std::vector<int> launch_blocks;
  std::vector<std::pair<std::uintptr_t, int>> launch_tables;  // segment table, segments
  std::vector<int> priorities;
  std::vector<std::pair<cudaEvent_t, cudaStream_t>> event_records;
  std::map<cudaEvent_t, unsigned> event_flags;
  std::vector<std::pair<std::uintptr_t, std::size_t>> registered;
  std::vector<int> register_devices;  // the device current at each host_register
  std::vector<Op> ops;

  FakeRuntime() { compute_ = make_stream(cudaStreamNonBlocking, 0); }
  ~FakeRuntime() override {
    for (auto& [p, n] : real_) std::free(p);
  }

  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mu_); }

  cudaStream_t compute() const { return compute_; }
  /// An explicit stream of `device` (flags: cudaStreamDefault = blocking, or NonBlocking).
  cudaStream_t make_stream(unsigned flags, int device) {
    std::lock_guard l(mu_);
    auto s = reinterpret_cast<cudaStream_t>(next_handle());
    streams_[s] = {flags, device};
    return s;
  }
  void add_alloc(std::uintptr_t base, std::size_t bytes, int device) {
    std::lock_guard l(mu_);
    allocs_[base] = {bytes, device};
  }
  static CUcontext primary(int device) {
    return reinterpret_cast<CUcontext>(std::uintptr_t{0xC7000000} + 0x1000 * (device + 1));
  }
  std::set<int> contexts_created() {
    std::lock_guard l(mu_);
    return created_;
  }
  /// The calling thread's current context (nullptr: none) and capture mode.
  CUcontext thread_context() {
    std::lock_guard l(mu_);
    return me().ctx;
  }
  cudaStreamCaptureMode thread_capture_mode() {
    std::lock_guard l(mu_);
    return me().mode;
  }
  void set_thread_capture_mode(cudaStreamCaptureMode m) {
    std::lock_guard l(mu_);
    me().mode = m;
  }
  /// The calling thread's pending error (as a caller's own failed call leaves it).
  void set_last_error(cudaError_t e) {
    std::lock_guard l(mu_);
    me().last = e;
  }
  int retained(int device) {
    std::lock_guard l(mu_);
    return retains_[device];
  }

  /// cudaStreamBeginCapture(stream, mode) on the calling thread.
  void begin_capture(cudaStream_t s, cudaStreamCaptureMode mode) {
    std::lock_guard l(mu_);
    captures_[s] = {mode, std::this_thread::get_id(), false, 0};
    capture_of_[s] = s;
  }
  /// cudaStreamEndCapture: cudaSuccess, or cudaErrorStreamCaptureInvalidated; `nodes` is the
  /// number of operations the capture recorded.
  cudaError_t end_capture(cudaStream_t s, int* nodes) {
    std::lock_guard l(mu_);
    auto it = captures_.find(s);
    if (it == captures_.end()) return cudaErrorIllegalState;
    const bool invalid = it->second.invalidated;
    if (nodes != nullptr) *nodes = it->second.nodes;
    captures_.erase(it);
    for (auto j = capture_of_.begin(); j != capture_of_.end();)
      j = j->second == s ? capture_of_.erase(j) : std::next(j);
    return invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
  }

  // --- the runtime
  cudaError_t get_device_count(int* count) override {
    std::lock_guard l(mu_);
    *count = device_count;
    return ret(device_count_error);
  }
  cudaError_t get_device(int* device) override {
    std::lock_guard l(mu_);
    *device = me().ctx != nullptr ? device_of(me().ctx) : 0;
    return ret(cudaSuccess);
  }
  cudaError_t set_device(int device) override {
    std::lock_guard l(mu_);
    if (device < 0 || device >= device_count) return ret(cudaErrorInvalidDevice);
    created_.insert(device);
    me().ctx = primary(device);
    return ret(cudaSuccess);
  }
  cudaError_t driver_get_version(int* v) override {
    *v = 12080;
    return cudaSuccess;
  }
  cudaError_t runtime_get_version(int* v) override {
    *v = runtime_version;
    return cudaSuccess;
  }
  cudaError_t device_get_attribute(int* value, cudaDeviceAttr attr, int) override {
    std::lock_guard l(mu_);
    *value = attr == cudaDevAttrHostNumaId ? numa_id : sms;
    return ret(cudaSuccess);
  }
  cudaError_t device_get_pci_bus_id(char*, int, int) override {
    std::lock_guard l(mu_);
    return ret(cudaErrorNotSupported);
  }
  cudaError_t device_get_stream_priority_range(int* least, int* greatest) override {
    std::lock_guard l(mu_);
    need_ctx();
    *least = least_priority;
    *greatest = greatest_priority;
    return ret(cudaSuccess);
  }
  cudaError_t pointer_get_attributes(cudaPointerAttributes* attr, const void* ptr) override {
    std::lock_guard l(mu_);
    need_ctx();
    *attr = {};
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    if (auto a = alloc_of(p); a != allocs_.end()) {
      attr->type = cudaMemoryTypeDevice;
      attr->device = a->second.second;
      attr->devicePointer = const_cast<void*>(ptr);
      return ret(cudaSuccess);
    }
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(ptr);
    attr->devicePointer = host_mapped ? const_cast<void*>(ptr) : nullptr;
    return ret(cudaSuccess);
  }
  cudaError_t stream_create_with_priority(cudaStream_t* s, unsigned flags, int priority) override {
    std::lock_guard l(mu_);
    const int dev = need_ctx();
    priorities.push_back(priority);
    *s = reinterpret_cast<cudaStream_t>(next_handle());
    streams_[*s] = {flags, dev};
    return ret(cudaSuccess);
  }
  cudaError_t stream_destroy(cudaStream_t) override { return locked_ret(cudaSuccess); }
  /// Host synchronizations made by `thread` so far (see the header comment).
  int host_syncs(std::thread::id thread) {
    std::lock_guard l(mu_);
    auto it = host_syncs_.find(thread);
    return it == host_syncs_.end() ? 0 : it->second;
  }
  int host_syncs_here() { return host_syncs(std::this_thread::get_id()); }

  cudaError_t stream_synchronize(cudaStream_t) override {
    std::lock_guard l(mu_);
    need_ctx();
    ++host_syncs_[std::this_thread::get_id()];
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    return ret(cudaSuccess);
  }
  cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* status) override {
    std::lock_guard l(mu_);
    need_ctx();
    *status = cudaStreamCaptureStatusNone;
    if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
    if (s == cudaStreamLegacy) {
      if (blocking_capture() != nullptr) return ret(cudaErrorStreamCaptureImplicit);
      return ret(cudaSuccess);
    }
    if (auto c = capture_of(s))
      *status = c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return ret(cudaSuccess);
  }
  cudaError_t stream_get_device(cudaStream_t s, int* device) override {
    std::lock_guard l(mu_);
    const int dev = need_ctx();
    if (s == cudaStreamLegacy) {
      *device = dev;
      return ret(cudaSuccess);
    }
    auto it = streams_.find(s);
    if (it == streams_.end()) return ret(cudaErrorInvalidResourceHandle);
    *device = it->second.second;
    return ret(cudaSuccess);
  }
  cudaError_t stream_get_flags(cudaStream_t s, unsigned* flags) override {
    std::lock_guard l(mu_);
    need_ctx();
    auto it = streams_.find(s);
    if (it == streams_.end()) return ret(cudaErrorInvalidResourceHandle);
    *flags = it->second.first;
    return ret(cudaSuccess);
  }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    if (auto it = recorded_in_.find(e); it != recorded_in_.end() && captures_.count(it->second)) {
      if (capture_of_.count(s) == 0) capture_of_[s] = it->second;  // s joins the capture
      ++captures_[it->second].nodes;
    }
    ops.push_back({Op::kWait, s, e, 0, 0, 0, device_here()});
    return ret(cudaSuccess);
  }
  cudaError_t event_create_with_flags(cudaEvent_t* e, unsigned flags) override {
    std::lock_guard l(mu_);
    need_ctx();
    *e = reinterpret_cast<cudaEvent_t>(next_handle());
    event_flags[*e] = flags;
    return ret(cudaSuccess);
  }
  cudaError_t event_destroy(cudaEvent_t) override { return locked_ret(cudaSuccess); }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    ++records;
    event_records.emplace_back(e, s);
    if (auto c = capture_of_.find(s); c != capture_of_.end()) {
      recorded_in_[e] = c->second;
    } else {
      recorded_in_.erase(e);
    }
    ops.push_back({Op::kRecord, s, e, 0, 0, 0, device_here()});
    return ret(cudaSuccess);
  }
  cudaError_t event_query(cudaEvent_t e) override {
    std::lock_guard l(mu_);
    need_ctx();
    ++queries;
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    if (recorded_in_.count(e)) return ret(cudaErrorCapturedEvent);
    if (auto it = event_results.find(e); it != event_results.end()) return ret(it->second);
    return ret(query_result);
  }
  cudaError_t event_synchronize(cudaEvent_t e) override {
    {
      std::lock_guard l(mu_);
      need_ctx();
      ++syncs;
      ++host_syncs_[std::this_thread::get_id()];
      if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
      if (recorded_in_.count(e)) return ret(cudaErrorCapturedEvent);
    }
    if (on_sync) on_sync(e);
    std::lock_guard l(mu_);
    if (auto it = event_results.find(e); it != event_results.end()) return ret(it->second);
    return ret(sync_result);
  }
  cudaError_t malloc_device(void** p, std::size_t bytes) override {
    std::lock_guard l(mu_);
    const int dev = need_ctx();
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    if (execute) {
      *p = std::malloc(bytes == 0 ? 1 : bytes);
      real_[*p] = bytes;
      allocs_[reinterpret_cast<std::uintptr_t>(*p)] = {bytes == 0 ? 1 : bytes, dev};
    } else {
      *p = reinterpret_cast<void*>(next_handle());
    }
    return ret(cudaSuccess);
  }
  cudaError_t free_device(void* p) override {
    std::lock_guard l(mu_);
    need_ctx();
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    if (auto it = real_.find(p); it != real_.end()) {
      allocs_.erase(reinterpret_cast<std::uintptr_t>(p));
      std::free(p);
      real_.erase(it);
    }
    return ret(cudaSuccess);
  }
  cudaError_t memcpy_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) override {
    std::lock_guard l(mu_);
    need_ctx();
    ++host_syncs_[std::this_thread::get_id()];
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    if (execute) std::memcpy(dst, src, bytes);
    return ret(cudaSuccess);
  }
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                           cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    ++async_calls;
    if (kind == cudaMemcpyDeviceToDevice) {
      // Both ends must be device memory (cudaErrorInvalidValue otherwise), and inside one
      // allocation each.
      const auto d = reinterpret_cast<std::uintptr_t>(dst),
                 r = reinterpret_cast<std::uintptr_t>(src);
      const auto da = alloc_of(d), ra = alloc_of(r);
      if (da == allocs_.end() || ra == allocs_.end() || d + bytes > da->first + da->second.first ||
          r + bytes > ra->first + ra->second.first)
        return ret(cudaErrorInvalidValue);
      ++d2d_calls;
    } else if (kind != cudaMemcpyDefault) {
      return ret(cudaErrorInvalidMemcpyDirection);
    }
    copy(dst, src, bytes, s);
    return ret(cudaSuccess);
  }
  cudaError_t memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                 const std::size_t* sizes, std::size_t count, bool invalid_order,
                                 cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    ++batch_calls;
    if (invalid_order) return ret(cudaErrorInvalidValue);
    if (batch_result != cudaSuccess) return ret(batch_result);
    for (std::size_t i = 0; i < count; ++i) copy(dsts[i], srcs[i], sizes[i], s);
    return ret(cudaSuccess);
  }
  cudaError_t launch_gather_scatter(const detail::DeviceSegment* segments, int num_segments,
                                    std::byte* host_base, std::size_t host_item_bytes,
                                    const detail::LaunchItems& items, bool to_host, int blocks,
                                    cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    ++launches;
    if (num_segments == 0 || blocks == 0) return ret(cudaErrorInvalidConfiguration);
    if (launch_result != cudaSuccess) return ret(launch_result);
    launch_items.push_back(items.count);
    launch_blocks.push_back(blocks);
    launch_tables.emplace_back(reinterpret_cast<std::uintptr_t>(segments), num_segments);
    ops.push_back({Op::kLaunch, s, nullptr, 0, 0, items.count, device_here()});
    if (execute) {
      for (std::uint32_t i = 0; i < items.count; ++i) {
        for (int k = 0; k < num_segments; ++k) {
          const detail::DeviceSegment& seg = segments[k];
          auto* dev = reinterpret_cast<std::byte*>(seg.base + items.device[i] * seg.stride);
          std::byte* host = host_base + items.host[i] * host_item_bytes + seg.host_offset;
          if (to_host) {
            std::memcpy(host, dev, seg.bytes);
          } else {
            std::memcpy(dev, host, seg.bytes);
          }
        }
      }
    }
    return ret(cudaSuccess);
  }
  cudaError_t launch_slot_copy(const detail::DeviceSegment* page_segments, int num_page_segments,
                               const detail::DeviceSegment* slot_segments, int num_slot_segments,
                               std::size_t page_bytes, std::size_t snapshot_bytes,
                               const detail::SlotLaunch& launch, int blocks,
                               cudaStream_t s) override {
    std::lock_guard l(mu_);
    if (cudaError_t err = stream_op(s); err != cudaSuccess) return ret(err);
    ++slot_launches;
    if (num_page_segments == 0 || num_slot_segments == 0 || blocks == 0)
      return ret(cudaErrorInvalidConfiguration);
    if (launch_result != cudaSuccess) return ret(launch_result);
    slot_launch_pieces.push_back(launch.count);
    slot_launch_blocks.push_back(blocks);
    ops.push_back({Op::kLaunch, s, nullptr, 0, 0, launch.count, device_here()});
    if (execute) {  // the kernel's units, one after the other
      for (std::uint32_t i = 0; i < launch.count; ++i) {
        const std::size_t offset = std::size_t{launch.first_page[i]} * page_bytes;
        const std::size_t n = std::min(page_bytes, snapshot_bytes - offset);
        for (int k = 0; k < num_page_segments; ++k)
          detail::for_each_slot_run(page_segments[k], slot_segments, num_slot_segments, n, offset,
                                    launch.slot[i], launch.page[i], launch.to_slot[i] != 0,
                                    [](unsigned char* dst, const unsigned char* src,
                                       unsigned long long bytes) { std::memcpy(dst, src, bytes); });
      }
    }
    return ret(cudaSuccess);
  }
  cudaError_t host_register(void* p, std::size_t bytes, unsigned) override {
    std::lock_guard l(mu_);
    const int dev = need_ctx();
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    registered.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
    register_devices.push_back(dev);
    return ret(cudaSuccess);
  }
  cudaError_t host_unregister(void*) override {
    std::lock_guard l(mu_);
    need_ctx();
    if (unsafe()) return ret(cudaErrorStreamCaptureUnsupported);
    return ret(cudaSuccess);
  }
  cudaError_t get_last_error() override {
    std::lock_guard l(mu_);
    const cudaError_t e = me().last;
    if (sticky == cudaSuccess) me().last = cudaSuccess;
    return e;
  }
  cudaError_t peek_at_last_error() override {
    std::lock_guard l(mu_);
    return me().last;
  }
  cudaError_t thread_exchange_stream_capture_mode(cudaStreamCaptureMode* mode) override {
    std::lock_guard l(mu_);
    std::swap(me().mode, *mode);
    return cudaSuccess;
  }
  cudaError_t probe_kernel() override {
    std::lock_guard l(mu_);
    need_ctx();
    return ret(probe_result);
  }
  cudaError_t ctx_get_current(CUcontext* ctx) override {
    std::lock_guard l(mu_);
    *ctx = me().ctx;
    return cudaSuccess;
  }
  cudaError_t ctx_set_current(CUcontext ctx) override {
    std::lock_guard l(mu_);
    if (ctx != nullptr && device_of(ctx) < 0) return ret(cudaErrorDeviceUninitialized);
    me().ctx = ctx;
    return cudaSuccess;
  }
  cudaError_t primary_ctx_retain(CUcontext* ctx, int device) override {
    std::lock_guard l(mu_);
    if (device < 0 || device >= device_count) return ret(cudaErrorInvalidDevice);
    created_.insert(device);
    ++retains_[device];
    *ctx = primary(device);
    return cudaSuccess;
  }
  cudaError_t primary_ctx_release(int device) override {
    std::lock_guard l(mu_);
    --retains_[device];
    return cudaSuccess;
  }
  cudaError_t mem_get_address_range(std::uintptr_t ptr, std::uintptr_t* base,
                                    std::size_t* bytes) override {
    std::lock_guard l(mu_);
    if (!address_range_supported) return ret(cudaErrorNotSupported);
    auto a = alloc_of(ptr);
    if (a == allocs_.end()) return ret(cudaErrorInvalidValue);
    *base = a->first;
    *bytes = a->second.first;
    return cudaSuccess;
  }

 private:
  struct ThreadState {
    CUcontext ctx = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    cudaError_t last = cudaSuccess;
  };
  struct Capture {
    cudaStreamCaptureMode mode;
    std::thread::id thread;
    bool invalidated;
    int nodes;
  };

  ThreadState& me() { return threads_[std::this_thread::get_id()]; }
  static int device_of(CUcontext ctx) {
    const auto v = reinterpret_cast<std::uintptr_t>(ctx);
    if (v <= 0xC7000000 || (v - 0xC7000000) % 0x1000 != 0) return -1;
    return static_cast<int>((v - 0xC7000000) / 0x1000) - 1;
  }
  // The runtime's lazy initialization: a thread without a context gets device 0's.
  int need_ctx() {
    ThreadState& t = me();
    if (t.ctx == nullptr) {
      created_.insert(0);
      t.ctx = primary(0);
    }
    return device_of(t.ctx);
  }
  int device_here() { return device_of(me().ctx); }
  cudaError_t ret(cudaError_t e) {
    if (sticky != cudaSuccess) e = sticky;
    if (e != cudaSuccess) me().last = e;
    return e;
  }
  cudaError_t locked_ret(cudaError_t e) {
    std::lock_guard l(mu_);
    need_ctx();
    return ret(e);
  }
  std::uintptr_t next_handle() { return handle_ += 0x100; }
  std::map<std::uintptr_t, std::pair<std::size_t, int>>::iterator alloc_of(std::uintptr_t p) {
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return allocs_.end();
    --it;
    return p - it->first < it->second.first ? it : allocs_.end();
  }
  Capture* capture_of(cudaStream_t s) {
    auto it = capture_of_.find(s);
    if (it == capture_of_.end()) return nullptr;
    auto c = captures_.find(it->second);
    return c == captures_.end() ? nullptr : &c->second;
  }
  // The stream of an active capture whose stream is blocking (the legacy stream joins it).
  cudaStream_t blocking_capture() {
    for (auto& [s, c] : captures_) {
      auto it = streams_.find(s);
      if (!c.invalidated && it != streams_.end() && (it->second.first & cudaStreamNonBlocking) == 0)
        return s;
    }
    return nullptr;
  }
  // A stream-ordered call on `s`: counted as a capture node if s is captured; the legacy
  // stream while a blocking stream is captured invalidates that capture.
  cudaError_t stream_op(cudaStream_t s) {
    need_ctx();
    if (s == nullptr) return cudaErrorInvalidResourceHandle;  // ambiguous: never passed
    if (s == cudaStreamLegacy) {
      if (cudaStream_t b = blocking_capture()) {
        captures_[b].invalidated = true;
        return cudaErrorStreamCaptureImplicit;
      }
      return cudaSuccess;
    }
    if (s != cudaStreamPerThread && streams_.count(s) == 0) return cudaErrorInvalidResourceHandle;
    if (Capture* c = capture_of(s)) ++c->nodes;
    return cudaSuccess;
  }
  // Is a potentially unsafe call forbidden on this thread now? Invalidates the captures that
  // forbid it.
  bool unsafe() {
    const ThreadState& t = me();
    if (t.mode == cudaStreamCaptureModeRelaxed) return false;
    bool refused = false;
    for (auto& [s, c] : captures_) {
      if (c.invalidated) continue;
      const bool own = c.thread == std::this_thread::get_id();
      const bool forbids =
          (own && c.mode != cudaStreamCaptureModeRelaxed) ||
          (!own && t.mode == cudaStreamCaptureModeGlobal && c.mode == cudaStreamCaptureModeGlobal);
      if (forbids) {
        c.invalidated = true;
        refused = true;
      }
    }
    if (refused) ++capture_violations;
    return refused;
  }
  void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    copies.push_back(
        {reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes});
    ops.push_back({Op::kCopy, s, nullptr, reinterpret_cast<std::uintptr_t>(dst),
                   reinterpret_cast<std::uintptr_t>(src), bytes, device_here()});
    if (execute) std::memcpy(dst, src, bytes);
  }

  std::mutex mu_;
  std::uintptr_t handle_ = 0x7000000;
  cudaStream_t compute_ = nullptr;
  std::map<std::thread::id, ThreadState> threads_;
  std::set<int> created_;
  std::map<int, int> retains_;
  std::map<cudaStream_t, std::pair<unsigned, int>> streams_;  // flags, device
  std::map<cudaStream_t, Capture> captures_;                  // by origin stream
  std::map<cudaStream_t, cudaStream_t> capture_of_;           // stream -> origin
  std::map<cudaEvent_t, cudaStream_t> recorded_in_;           // events recorded in a capture
  std::map<std::uintptr_t, std::pair<std::size_t, int>> allocs_;
  std::map<void*, std::size_t> real_;
  std::map<std::thread::id, int> host_syncs_;
};

constexpr std::uintptr_t kGpuBase = 0x10000000;
constexpr std::size_t kGpuAlloc = std::size_t{1} << 30;  // one fake allocation per device
constexpr std::size_t kPage = 4096;

/// A fake runtime with a 1 GiB device allocation on devices 0 and 1 (at gpu_base(device)), a
/// 64-page host pool, and the options of an engine on them: DMA for every slice, and every
/// slice enqueued inside submit() (slices_in_flight = 0), so that a test sees every call when
/// submit() returns. The tests of the feeder threads and of kAuto set their own.
struct Fixture {
  FakeRuntime rt;
  std::vector<std::byte> host = std::vector<std::byte>(64 * kPage);
  std::mutex logs_mu;
  std::vector<std::string> logs;

  Fixture() {
    rt.add_alloc(gpu_base(0), kGpuAlloc, 0);
    rt.add_alloc(gpu_base(1), kGpuAlloc, 1);
  }
  /// Device d's allocation; a gap separates the two.
  static std::uintptr_t gpu_base(int device) { return kGpuBase + device * 2 * kGpuAlloc; }
  CudaPools pools(std::uint32_t gpu_pages = 64, int device = 0) {
    CudaPools p;
    p.gpu_kv = contiguous_items(gpu_base(device), kPage, gpu_pages);
    p.host_kv = host.data();
    p.host_pages = 64;
    return p;
  }
  CudaEngineOptions options(std::size_t slice = 4) {
    CudaEngineOptions o;
    o.slice_pages = slice;
    o.compute_stream = rt.compute();
    o.d2h = o.h2d = CopyMethod::kDmaBatch;
    o.slices_in_flight = 0;
    o.log = [this](const std::string& line) {
      std::lock_guard l(logs_mu);
      logs.push_back(line);
    };
    return o;
  }
  std::size_t log_lines() {
    std::lock_guard l(logs_mu);
    return logs.size();
  }
  Result<std::unique_ptr<CudaTransferEngine>> create(CudaPools p, CudaEngineOptions o,
                                                     std::uint32_t first_id = 0) {
    detail::EngineSeams seams;
    seams.runtime = &rt;
    seams.first_ticket_id = first_id;
    return CudaTransferEngine::create(std::move(p), std::move(o), seams);
  }
  std::unique_ptr<CudaTransferEngine> engine(CudaEngineOptions o) {
    auto e = create(pools(), std::move(o));
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e.is_ok() ? std::move(e).value() : nullptr;
  }
};

/// Scattered pages: none merges with the next.
inline TransferBatch scattered(Direction dir, std::uint32_t n) {
  TransferBatch b;
  b.direction = dir;
  for (std::uint32_t i = 0; i < n; ++i)
    b.pages.push_back({GpuPageId(2 * i), HostPageId(2 * i % 64)});
  return b;
}

}  // namespace radixtier::cuda::testing
