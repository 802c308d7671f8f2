// CPU tests of the CUDA transfer engine and the pinned pool on a fake CUDA runtime: the real
// engine code (kernels/) runs, every CUDA call goes to FakeRuntime below, so no GPU is
// needed. They check option and stream validation, the DMA fallback, error classification
// and the fatal status, capture refusal and deferred polls, last-error hygiene, device
// restore, stream priority, ticket ids, the recycled-event wait, slicing and failure after
// some slices, the per-range vector split of the kernel, and the pool's memory check,
// MADV_DONTFORK and registration chunks. What needs a device is in tests/gpu/.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "copy_kernels.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"

namespace radixtier::cuda {
namespace {

using detail::ErrorClass;

struct Copy {
  std::uintptr_t dst, src;
  std::size_t bytes;
};

// A CUDA runtime without a device. Handles are distinct fake addresses (never dereferenced).
// The thread's last error follows CUDA's rules: every failing call sets it, get_last_error()
// returns and resets it, a sticky error can never be reset and every call returns it.
class FakeRuntime final : public detail::CudaRuntime {
 public:
  // --- knobs
  int device_count = 1;
  cudaError_t device_count_error = cudaSuccess;
  int current_device = 0;
  int stream_device = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t batch_result = cudaSuccess;        // memcpy_batch_async with a valid order
  cudaError_t query_result = cudaErrorNotReady;  // event_query of every event
  cudaError_t sync_result = cudaSuccess;         // event_synchronize
  cudaError_t launch_result = cudaSuccess;
  std::function<void()> on_sync;  // runs inside event_synchronize (unlocked)
  int least_priority = 7, greatest_priority = -5;
  int numa_id = -1;
  cudaError_t sticky = cudaSuccess;
  cudaError_t last = cudaSuccess;

  // --- records
  int batch_calls = 0, async_calls = 0, launches = 0, queries = 0, records = 0;
  int set_device_calls = 0;
  int device_at_last_copy = -1;
  std::vector<Copy> copies;  // every DMA copy enqueued, batch or per piece
  std::vector<std::uint32_t> launch_items;
  std::vector<int> priorities;
  std::vector<std::pair<cudaEvent_t, cudaStream_t>> event_records;
  std::vector<std::pair<std::uintptr_t, std::size_t>> registered;

  cudaStream_t compute() { return compute_; }

  cudaError_t get_device_count(int* count) override {
    std::lock_guard l(mu_);
    *count = device_count;
    return ret(device_count_error);
  }
  cudaError_t get_device(int* device) override {
    std::lock_guard l(mu_);
    *device = current_device;
    return ret(cudaSuccess);
  }
  cudaError_t set_device(int device) override {
    std::lock_guard l(mu_);
    ++set_device_calls;
    if (device < 0 || device >= device_count) return ret(cudaErrorInvalidDevice);
    current_device = device;
    return ret(cudaSuccess);
  }
  cudaError_t driver_get_version(int* v) override {
    *v = 12080;
    return cudaSuccess;
  }
  cudaError_t runtime_get_version(int* v) override {
    *v = 13000;
    return cudaSuccess;
  }
  cudaError_t device_get_attribute(int* value, cudaDeviceAttr attr, int) override {
    std::lock_guard l(mu_);
    *value = attr == cudaDevAttrHostNumaId ? numa_id : 132;
    return ret(cudaSuccess);
  }
  cudaError_t device_get_pci_bus_id(char*, int, int) override {
    std::lock_guard l(mu_);
    return ret(cudaErrorNotSupported);
  }
  cudaError_t device_get_stream_priority_range(int* least, int* greatest) override {
    std::lock_guard l(mu_);
    *least = least_priority;
    *greatest = greatest_priority;
    return ret(cudaSuccess);
  }
  cudaError_t pointer_get_attributes(cudaPointerAttributes* attr, const void* ptr) override {
    std::lock_guard l(mu_);
    *attr = {};
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(ptr);
    attr->devicePointer = const_cast<void*>(ptr);
    return ret(cudaSuccess);
  }
  cudaError_t stream_create_with_priority(cudaStream_t* s, unsigned, int priority) override {
    std::lock_guard l(mu_);
    priorities.push_back(priority);
    *s = reinterpret_cast<cudaStream_t>(next_handle());
    return ret(cudaSuccess);
  }
  cudaError_t stream_destroy(cudaStream_t) override { return locked_ret(cudaSuccess); }
  cudaError_t stream_synchronize(cudaStream_t) override { return locked_ret(cudaSuccess); }
  cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* status) override {
    std::lock_guard l(mu_);
    *status = s == compute_ ? capture : cudaStreamCaptureStatusNone;
    return ret(cudaSuccess);
  }
  cudaError_t stream_get_device(cudaStream_t, int* device) override {
    std::lock_guard l(mu_);
    *device = stream_device;
    return ret(cudaSuccess);
  }
  cudaError_t stream_wait_event(cudaStream_t, cudaEvent_t, unsigned) override {
    return locked_ret(cudaSuccess);
  }
  cudaError_t event_create_with_flags(cudaEvent_t* e, unsigned) override {
    std::lock_guard l(mu_);
    *e = reinterpret_cast<cudaEvent_t>(next_handle());
    return ret(cudaSuccess);
  }
  cudaError_t event_destroy(cudaEvent_t) override { return locked_ret(cudaSuccess); }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) override {
    std::lock_guard l(mu_);
    ++records;
    event_records.emplace_back(e, s);
    return ret(cudaSuccess);
  }
  cudaError_t event_query(cudaEvent_t) override {
    std::lock_guard l(mu_);
    ++queries;
    return ret(query_result);
  }
  cudaError_t event_synchronize(cudaEvent_t) override {
    if (on_sync) on_sync();
    std::lock_guard l(mu_);
    return ret(sync_result);
  }
  cudaError_t malloc_device(void** p, std::size_t) override {
    std::lock_guard l(mu_);
    *p = reinterpret_cast<void*>(next_handle());
    return ret(cudaSuccess);
  }
  cudaError_t free_device(void*) override { return locked_ret(cudaSuccess); }
  cudaError_t memcpy_sync(void*, const void*, std::size_t, cudaMemcpyKind) override {
    return locked_ret(cudaSuccess);
  }
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                           cudaStream_t) override {
    std::lock_guard l(mu_);
    ++async_calls;
    if (kind != cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
    copies.push_back(
        {reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes});
    device_at_last_copy = current_device;
    return ret(cudaSuccess);
  }
  cudaError_t memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                 const std::size_t* sizes, std::size_t count, bool invalid_order,
                                 cudaStream_t) override {
    std::lock_guard l(mu_);
    ++batch_calls;
    if (invalid_order) return ret(cudaErrorInvalidValue);
    if (batch_result != cudaSuccess) return ret(batch_result);
    for (std::size_t i = 0; i < count; ++i)
      copies.push_back({reinterpret_cast<std::uintptr_t>(dsts[i]),
                        reinterpret_cast<std::uintptr_t>(srcs[i]), sizes[i]});
    device_at_last_copy = current_device;
    return ret(cudaSuccess);
  }
  cudaError_t launch_gather_scatter(const detail::DeviceSegment*, int num_segments, std::byte*,
                                    std::size_t, const detail::LaunchItems& items, bool, int blocks,
                                    cudaStream_t) override {
    std::lock_guard l(mu_);
    ++launches;
    if (num_segments == 0 || blocks == 0) return ret(cudaErrorInvalidConfiguration);
    launch_items.push_back(items.count);
    return ret(launch_result);
  }
  cudaError_t host_register(void* p, std::size_t bytes, unsigned) override {
    std::lock_guard l(mu_);
    registered.emplace_back(reinterpret_cast<std::uintptr_t>(p), bytes);
    return ret(cudaSuccess);
  }
  cudaError_t host_unregister(void*) override { return locked_ret(cudaSuccess); }
  cudaError_t get_last_error() override {
    std::lock_guard l(mu_);
    const cudaError_t e = last;
    if (sticky == cudaSuccess) last = cudaSuccess;
    return e;
  }
  cudaError_t peek_at_last_error() override {
    std::lock_guard l(mu_);
    return last;
  }

  // The compute stream handed to the engine (an explicit, fake stream).
  FakeRuntime() : compute_(reinterpret_cast<cudaStream_t>(next_handle())) {}

 private:
  cudaError_t ret(cudaError_t e) {
    if (sticky != cudaSuccess) e = sticky;
    if (e != cudaSuccess) last = e;
    return e;
  }
  cudaError_t locked_ret(cudaError_t e) {
    std::lock_guard l(mu_);
    return ret(e);
  }
  std::uintptr_t next_handle() { return handle_ += 0x100; }

  std::mutex mu_;
  std::uintptr_t handle_ = 0x7000000;
  cudaStream_t compute_;
};

constexpr std::uintptr_t kGpuBase = 0x10000000;
constexpr std::size_t kPage = 4096;

struct Fixture {
  FakeRuntime rt;
  std::vector<std::byte> host = std::vector<std::byte>(64 * kPage);
  std::vector<std::string> logs;

  CudaPools pools(std::uint32_t gpu_pages = 64) {
    CudaPools p;
    p.gpu_kv = contiguous_items(kGpuBase, kPage, gpu_pages);
    p.host_kv = host.data();
    p.host_pages = 64;
    return p;
  }
  CudaEngineOptions options(std::size_t slice = 4) {
    CudaEngineOptions o;
    o.slice_pages = slice;
    o.compute_stream = rt.compute();
    o.log = [this](const std::string& line) { logs.push_back(line); };
    return o;
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

// Scattered pages: none merges with the next.
TransferBatch scattered(Direction dir, std::uint32_t n) {
  TransferBatch b;
  b.direction = dir;
  for (std::uint32_t i = 0; i < n; ++i)
    b.pages.push_back({GpuPageId(2 * i), HostPageId(2 * i % 64)});
  return b;
}

TEST(CudaEngineFake, ClassifiesErrors) {
  EXPECT_EQ(detail::classify(cudaSuccess), ErrorClass::kOk);
  EXPECT_EQ(detail::classify(cudaErrorNotReady), ErrorClass::kNotReady);
  EXPECT_EQ(detail::classify(cudaErrorNotSupported), ErrorClass::kUnsupported);
  EXPECT_EQ(detail::classify(cudaErrorCallRequiresNewerDriver), ErrorClass::kUnsupported);
  for (cudaError_t e : {cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated,
                        cudaErrorStreamCaptureImplicit, cudaErrorStreamCaptureWrongThread})
    EXPECT_EQ(detail::classify(e), ErrorClass::kCapture) << cudaGetErrorName(e);
  for (cudaError_t e :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorIllegalInstruction,
        cudaErrorMisalignedAddress, cudaErrorHardwareStackError, cudaErrorAssert,
        cudaErrorECCUncorrectable, cudaErrorNvlinkUncorrectable, cudaErrorLaunchTimeout,
        cudaErrorInvalidPc, cudaErrorInvalidAddressSpace, cudaErrorContained,
        cudaErrorExternalDevice, cudaErrorUnknown})
    EXPECT_EQ(detail::classify(e), ErrorClass::kFatal) << cudaGetErrorName(e);
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorMemoryAllocation,
                        cudaErrorInvalidResourceHandle, cudaErrorLaunchOutOfResources,
                        cudaErrorInvalidConfiguration, cudaErrorInvalidMemcpyDirection})
    EXPECT_EQ(detail::classify(e), ErrorClass::kFailed) << cudaGetErrorName(e);
  EXPECT_STREQ(detail::to_string(ErrorClass::kFatal), "fatal");
  EXPECT_STREQ(to_string(ErrorCode::kDeviceLost), "device lost");
}

TEST(CudaEngineFake, RequiresAnExplicitComputeStream) {
  Fixture f;
  for (cudaStream_t s :
       {static_cast<cudaStream_t>(nullptr), cudaStreamLegacy, cudaStreamPerThread}) {
    CudaEngineOptions o = f.options();
    o.compute_stream = s;
    auto e = f.create(f.pools(), o);
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("CudaEngineOptions.compute_stream"), std::string::npos)
        << e.status().message();
  }
  // A stream of another device is refused too.
  f.rt.device_count = 2;
  f.rt.stream_device = 1;
  auto e = f.create(f.pools(), f.options());
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("device 1"), std::string::npos) << e.status().message();
  // stream_wait refuses the pseudo-handles as well.
  f.rt.stream_device = 0;
  auto engine = f.engine(f.options());
  auto t = engine->submit(scattered(Direction::kHostToDevice, 2));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(engine->stream_wait(t->id(), nullptr).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine->stream_wait(t->id(), cudaStreamPerThread).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(engine->stream_wait(t->id(), f.rt.compute()).is_ok());
  f.rt.query_result = cudaSuccess;
}

TEST(CudaEngineFake, ValidatesOptionsAndDevice) {
  Fixture f;
  CudaEngineOptions o = f.options();
  o.slice_pages = 0;
  EXPECT_NE(f.create(f.pools(), o).status().message().find("slice_pages"), std::string::npos);
  o = f.options();
  o.kernel_blocks = -1;
  EXPECT_NE(f.create(f.pools(), o).status().message().find("kernel_blocks"), std::string::npos);
  o = f.options();
  o.device = 3;
  EXPECT_NE(f.create(f.pools(), o).status().message().find("CudaEngineOptions.device"),
            std::string::npos);
  f.rt.device_count_error = cudaErrorNoDevice;
  f.rt.device_count = 0;
  const Status s = f.create(f.pools(), f.options()).status();
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("driver 12080"), std::string::npos) << s.message();
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);  // create left no error behind
}

TEST(CudaEngineFake, RestoresTheCallersDevice) {
  Fixture f;
  f.rt.device_count = 2;
  f.rt.stream_device = 1;
  CudaEngineOptions o = f.options();
  o.device = 1;
  auto engine = f.engine(o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(f.rt.current_device, 0);
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(f.rt.device_at_last_copy, 1);  // the copy was enqueued on the engine's device
  EXPECT_EQ(f.rt.current_device, 0);       // and the caller's device is back
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->wait(), TransferState::kDone);
  t->reset();
  engine.reset();
  EXPECT_EQ(f.rt.current_device, 0);
}

TEST(CudaEngineFake, CopyStreamsHaveTheLowestPriority) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_EQ(f.rt.priorities.size(), 2u);
  EXPECT_EQ(f.rt.priorities[0], f.rt.least_priority);
  EXPECT_EQ(f.rt.priorities[1], f.rt.least_priority);
}

TEST(CudaEngineFake, PendingPollLeavesNoLastError) {
  Fixture f;
  auto engine = f.engine(f.options());
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 6));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->poll(), TransferState::kPending);
  EXPECT_GE(f.rt.queries, 1);                         // cudaErrorNotReady was produced...
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);  // ...and cleared
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->poll(), TransferState::kDone);
}

TEST(CudaEngineFake, KeepsTheCallersPendingError) {
  Fixture f;
  auto engine = f.engine(f.options());
  f.rt.last = cudaErrorInvalidValue;  // the caller's own error, not read yet
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 6));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaErrorInvalidValue);  // submit did not clear it
  EXPECT_EQ(t->poll(), TransferState::kPending);
  EXPECT_NE(f.rt.peek_at_last_error(), cudaSuccess);  // still an error for the caller to see
  (void)f.rt.get_last_error();
  f.rt.query_result = cudaSuccess;
}

TEST(CudaEngineFake, FallsBackForGoodWhenTheBatchCallIsUnsupported) {
  for (cudaError_t unsupported : {cudaErrorNotSupported, cudaErrorCallRequiresNewerDriver}) {
    Fixture f;
    auto engine = f.engine(f.options(4));
    // What the batch path enqueues when it works, as the reference.
    Fixture ref;
    auto ref_engine = ref.engine(ref.options(4));
    ASSERT_TRUE(ref_engine->submit(scattered(Direction::kDeviceToHost, 10)).is_ok());
    ref.rt.query_result = cudaSuccess;

    f.rt.batch_result = unsupported;
    auto t = engine->submit(scattered(Direction::kDeviceToHost, 10));  // 3 slices
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(f.rt.batch_calls, 1);  // tried once, never again
    EXPECT_EQ(f.rt.async_calls, 10);
    ASSERT_EQ(f.rt.copies.size(), ref.rt.copies.size());
    const auto fbase = reinterpret_cast<std::uintptr_t>(f.host.data());
    const auto rbase = reinterpret_cast<std::uintptr_t>(ref.host.data());
    for (std::size_t i = 0; i < f.rt.copies.size(); ++i) {  // the same pieces, one by one
      EXPECT_EQ(f.rt.copies[i].dst - fbase, ref.rt.copies[i].dst - rbase);
      EXPECT_EQ(f.rt.copies[i].src, ref.rt.copies[i].src);
      EXPECT_EQ(f.rt.copies[i].bytes, ref.rt.copies[i].bytes);
    }
    const CudaEngineStats s = engine->stats();
    EXPECT_TRUE(s.dma_batch_fallback);
    EXPECT_NE(s.fallback_reason.find(cudaGetErrorName(unsupported)), std::string::npos);
    EXPECT_NE(s.fallback_reason.find("driver 12080"), std::string::npos);
    ASSERT_EQ(f.logs.size(), 1u);
    EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
    auto t2 = engine->submit(scattered(Direction::kHostToDevice, 5));
    ASSERT_TRUE(t2.is_ok());
    EXPECT_EQ(f.rt.batch_calls, 1);
    EXPECT_EQ(f.rt.async_calls, 15);
    EXPECT_EQ(f.logs.size(), 1u);  // said once
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->wait(), TransferState::kDone);
    EXPECT_EQ(t2->wait(), TransferState::kDone);
    EXPECT_EQ(engine->stats().failed, 0u);
  }
}

TEST(CudaEngineFake, OtherBatchErrorsFailTheTicketWithoutFallback) {
  Fixture f;
  auto engine = f.engine(f.options());
  f.rt.batch_result = cudaErrorInvalidValue;
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t.is_ok());
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->wait(), TransferState::kFailed);
  EXPECT_FALSE(engine->stats().dma_batch_fallback);
  EXPECT_TRUE(engine->health().is_ok());
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
}

TEST(CudaEngineFake, StickyErrorIsFatalAndReported) {
  Fixture f;
  auto engine = f.engine(f.options());
  auto t1 = engine->submit(scattered(Direction::kDeviceToHost, 3));
  auto t2 = engine->submit(scattered(Direction::kHostToDevice, 3));
  ASSERT_TRUE(t1.is_ok() && t2.is_ok());
  // A fault in any kernel of the context (the model's too): every call now returns it.
  f.rt.sticky = cudaErrorIllegalAddress;
  EXPECT_EQ(t1->poll(), TransferState::kFailed);
  const Status h = engine->health();
  EXPECT_EQ(h.code(), ErrorCode::kDeviceLost);
  EXPECT_NE(h.message().find("cudaErrorIllegalAddress"), std::string::npos) << h.message();
  const int queries = f.rt.queries;
  EXPECT_EQ(t2->wait(), TransferState::kFailed);  // no copy can run: failed at once
  EXPECT_EQ(f.rt.queries, queries);
  auto t3 = engine->submit(scattered(Direction::kDeviceToHost, 1));
  ASSERT_FALSE(t3.is_ok());
  EXPECT_EQ(t3.status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(engine->stream_wait(t1->id(), f.rt.compute()).code(), ErrorCode::kDeviceLost);
  const CudaEngineStats s = engine->stats();
  EXPECT_TRUE(s.fatal);
  ASSERT_EQ(f.logs.size(), 1u);
  EXPECT_NE(f.logs[0].find("Restart"), std::string::npos);
}

TEST(CudaEngineFake, StickyErrorWhileEnqueueingIsFatal) {
  Fixture f;
  auto engine = f.engine(f.options());
  f.rt.batch_result = cudaErrorLaunchFailure;
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(engine->health().code(), ErrorCode::kDeviceLost);
}

TEST(CudaEngineFake, AsynchronousNonStickyErrorFailsOneTicket) {
  Fixture f;
  auto engine = f.engine(f.options());
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t.is_ok());
  f.rt.query_result = cudaErrorInvalidResourceHandle;
  EXPECT_EQ(t->poll(), TransferState::kFailed);
  EXPECT_TRUE(engine->health().is_ok());
  EXPECT_NE(engine->stats().last_error.find("cudaErrorInvalidResourceHandle"), std::string::npos);
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
  f.rt.query_result = cudaSuccess;
  auto t2 = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t2.is_ok());
  EXPECT_EQ(t2->poll(), TransferState::kDone);
}

TEST(CudaEngineFake, RefusesSubmitDuringCaptureAndDefersPolls) {
  Fixture f;
  auto engine = f.engine(f.options());
  auto pending = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(pending.is_ok());
  for (cudaStreamCaptureStatus c :
       {cudaStreamCaptureStatusActive, cudaStreamCaptureStatusInvalidated}) {
    f.rt.capture = c;
    const int records = f.rt.records, copies = static_cast<int>(f.rt.copies.size());
    auto t = engine->submit(scattered(Direction::kHostToDevice, 4));
    ASSERT_FALSE(t.is_ok());
    EXPECT_EQ(t.status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(t.status().message().find("captur"), std::string::npos) << t.status().message();
    EXPECT_EQ(f.rt.records, records);  // nothing touched the compute or copy streams
    EXPECT_EQ(static_cast<int>(f.rt.copies.size()), copies);
  }
  EXPECT_EQ(engine->stats().refused_captures, 2u);
  f.rt.capture = cudaStreamCaptureStatusActive;
  f.rt.query_result = cudaSuccess;
  const int queries = f.rt.queries;
  EXPECT_EQ(pending->poll(), TransferState::kPending);  // no event query during the capture
  EXPECT_EQ(f.rt.queries, queries);
  EXPECT_EQ(engine->stats().deferred_polls, 1u);
  f.rt.capture = cudaStreamCaptureStatusNone;
  EXPECT_EQ(pending->poll(), TransferState::kDone);
  EXPECT_TRUE(engine->submit(scattered(Direction::kHostToDevice, 4)).is_ok());
}

TEST(CudaEngineFake, FailureAfterSomeSlicesAreQueued) {
  for (CopyMethod method : {CopyMethod::kDmaBatch, CopyMethod::kZeroCopyKernel}) {
    Fixture f;
    CudaEngineOptions o = f.options(4);
    o.d2h = method;
    auto engine = f.engine(o);
    engine->inject_error_on_next_submit(2);
    auto t = engine->submit(scattered(Direction::kDeviceToHost, 16));  // 4 slices
    ASSERT_TRUE(t.is_ok());
    if (method == CopyMethod::kDmaBatch) {
      EXPECT_EQ(f.rt.batch_calls, 3);  // two queued, the third refused, the fourth never tried
      EXPECT_EQ(f.rt.copies.size(), 8u);
    } else {
      EXPECT_EQ(f.rt.launches, 3);
      EXPECT_EQ(f.rt.launch_items.size(), 2u);
    }
    // The ticket's event was recorded after what was queued: pending until it completes.
    ASSERT_FALSE(f.rt.event_records.empty());
    EXPECT_EQ(f.rt.event_records.back().second, engine->stream(Direction::kDeviceToHost));
    EXPECT_EQ(t->poll(), TransferState::kPending);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->poll(), TransferState::kFailed);
    const CudaEngineStats s = engine->stats();
    EXPECT_EQ(s.slices, 2u);
    EXPECT_EQ(s.failed, 1u);
    EXPECT_FALSE(s.last_error.empty());
    EXPECT_TRUE(engine->health().is_ok());
    EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
    auto again = engine->submit(scattered(Direction::kDeviceToHost, 16));
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(again->poll(), TransferState::kDone);
  }
}

TEST(CudaEngineFake, ZeroCopyLaunchesAtMost1024PagesEach) {
  Fixture f;
  CudaEngineOptions o = f.options(2048);
  o.h2d = CopyMethod::kZeroCopyKernel;
  CudaPools p = f.pools(4096);
  auto created = f.create(p, o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  TransferBatch b;
  b.direction = Direction::kHostToDevice;
  for (std::uint32_t i = 0; i < 2500; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i % 64)});
  auto t = (*created)->submit(b);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(f.rt.launch_items, (std::vector<std::uint32_t>{1024, 1024, 452}));
  EXPECT_EQ((*created)->stats().slices, 2u);
  EXPECT_EQ((*created)->stats().kernel_launches, 3u);
  f.rt.query_result = cudaSuccess;
}

TEST(CudaEngineFake, PromotionsCanOverlapQueuedCompute) {
  Fixture f;
  CudaEngineOptions o = f.options();
  o.promote_after_compute = false;
  auto engine = f.engine(o);
  auto records_on_compute = [&] {
    int n = 0;
    for (auto& [e, s] : f.rt.event_records) n += s == f.rt.compute();
    return n;
  };
  auto up = engine->submit(scattered(Direction::kHostToDevice, 3));
  ASSERT_TRUE(up.is_ok());
  EXPECT_EQ(records_on_compute(), 0);  // the promotion did not wait for the queued compute
  auto down = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(down.is_ok());
  EXPECT_EQ(records_on_compute(), 1);  // a demotion does (demote_after_compute)
  f.rt.query_result = cudaSuccess;
}

TEST(CudaEngineFake, TicketIdsSkipTheInvalidValueAndLiveIds) {
  Fixture f;
  auto created = f.create(f.pools(), f.options(), 0xFFFFFFFEu);
  ASSERT_TRUE(created.is_ok());
  auto t1 = (*created)->submit(scattered(Direction::kDeviceToHost, 1));
  auto t2 = (*created)->submit(scattered(Direction::kDeviceToHost, 1));
  ASSERT_TRUE(t1.is_ok() && t2.is_ok());
  EXPECT_EQ(t1->id().value(), 0xFFFFFFFEu);
  EXPECT_EQ(t2->id().value(), 0u);  // 0xFFFFFFFF is TicketId::kInvalid
  EXPECT_TRUE(t2->id().valid());
  f.rt.query_result = cudaSuccess;

  std::unordered_map<TicketId, int> live = {{TicketId(5), 0}, {TicketId(6), 0}};
  std::uint32_t next = 5;
  EXPECT_EQ(detail::take_ticket_id(next, live), 7u);
  next = TicketId::kInvalid;
  live.emplace(TicketId(0), 0);
  EXPECT_EQ(detail::take_ticket_id(next, live), 1u);
}

TEST(CudaEngineFake, WaitNeverWaitsOnARecycledEvent) {
  Fixture f;
  auto engine = f.engine(f.options());
  auto t1 = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(t1.is_ok());
  const cudaEvent_t e1 = f.rt.event_records.back().first;
  std::promise<void> in_sync, go_on;
  std::shared_future<void> go = go_on.get_future().share();
  f.rt.on_sync = [&] {
    in_sync.set_value();
    go.wait();
  };
  auto waiter = std::async(std::launch::async, [&] { return engine->wait(t1->id()); });
  in_sync.get_future().wait();
  f.rt.on_sync = nullptr;
  // Meanwhile another thread sees t1 done and submits more work.
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(engine->poll(t1->id()), TransferState::kDone);
  auto t2 = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(t2.is_ok());
  EXPECT_NE(f.rt.event_records.back().first, e1);  // t1's event is still the waiter's
  go_on.set_value();
  EXPECT_EQ(waiter.get(), TransferState::kDone);
  t1->reset();
  auto t3 = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(t3.is_ok());
  EXPECT_EQ(f.rt.event_records.back().first, e1);  // recycled once nobody waits on it
}

TEST(CudaEngineFake, EngineTakesTheRegistrationChunkFromThePool) {
  Fixture f;
  // 3,000-byte items with a 16 KiB registration limit: chunks of 12 KiB (lcm(3000, 4096) is
  // larger than the limit), so items straddle registrations.
  PinnedHostPool::Options po;
  po.max_register_chunk = 16384;
  po.numa_node = PinnedHostPool::kNoNuma;
  auto pool = PinnedHostPool::create(40 * 3000, 3000, po, f.rt);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->register_chunk_bytes(), 16384u);
  ASSERT_EQ(pool->registrations(), f.rt.registered.size());
  CudaPools p;
  p.gpu_kv = contiguous_items(kGpuBase, 3000, 40);
  p.host_pages = 40;
  p.host_kv_pool = &*pool;
  auto created = f.create(p, f.options(64));
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  TransferBatch b;
  for (std::uint32_t i = 0; i < 40; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
  auto t = (*created)->submit(b);
  ASSERT_TRUE(t.is_ok());
  std::size_t total = 0;
  for (const Copy& c : f.rt.copies) {
    total += c.bytes;
    int inside = 0;
    for (auto [base, len] : f.rt.registered)
      inside += c.dst >= base && c.dst + c.bytes <= base + len;
    EXPECT_EQ(inside, 1) << "a copy of " << c.bytes << " B at host offset "
                         << c.dst - reinterpret_cast<std::uintptr_t>(pool->data());
  }
  EXPECT_EQ(total, 40u * 3000);
  EXPECT_GT(f.rt.copies.size(), 1u);  // one run, split at the registrations
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->wait(), TransferState::kDone);
  // A pool too small for host_pages, or a pointer that is not the pool's, is refused.
  p.host_pages = 41;
  EXPECT_FALSE(f.create(p, f.options()).is_ok());
  p.host_pages = 40;
  p.host_kv = pool->data() + 4096;
  EXPECT_FALSE(f.create(p, f.options()).is_ok());
}

TEST(CudaEngineFake, SplitsRangesForVectorAccessPerRange) {
  using detail::split_for_vectors;
  auto s = split_for_vectors(0x1000, 0x2000, 4096);  // both aligned
  EXPECT_EQ(s.head, 0u);
  EXPECT_EQ(s.body, 4096u);
  EXPECT_EQ(s.tail, 0u);
  s = split_for_vectors(0x1003, 0x2003, 100);  // aligned alike: 13 + 80 + 7
  EXPECT_EQ(s.head, 13u);
  EXPECT_EQ(s.body, 80u);
  EXPECT_EQ(s.tail, 7u);
  s = split_for_vectors(0x1003, 0x2004, 100);  // not alike: bytes only
  EXPECT_EQ(s.head, 100u);
  EXPECT_EQ(s.body, 0u);
  s = split_for_vectors(0x100F, 0x200F, 5);  // shorter than the head
  EXPECT_EQ(s.head, 1u);
  EXPECT_EQ(s.body, 0u);
  EXPECT_EQ(s.tail, 4u);
  s = split_for_vectors(0x1000, 0x2000, 35);  // 35-byte chunks of an odd geometry
  EXPECT_EQ(s.body, 32u);
  EXPECT_EQ(s.tail, 3u);
}

// VmFlags of the mapping that starts at `p` in /proc/self/smaps.
std::string vm_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  char start[32];
  std::snprintf(start, sizeof(start), "%lx-", reinterpret_cast<unsigned long>(p));
  while (std::getline(smaps, line)) {
    if (line.rfind(start, 0) == 0) in = true;
    if (in && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return {};
}

TEST(CudaPinnedPoolFake, DoesNotForkAndRegistersInChunks) {
  FakeRuntime rt;
  PinnedHostPool::Options po;
  po.max_register_chunk = 3 * 4096;
  po.numa_node = PinnedHostPool::kNoNuma;
  auto pool = PinnedHostPool::create(10 * 4096, 4096, po, rt);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->registrations(), 4u);
  EXPECT_EQ(rt.registered[1].first - rt.registered[0].first, 3u * 4096);
  EXPECT_EQ(pool->numa_node(), PinnedHostPool::kNoNuma);
  const std::string flags = vm_flags(pool->data());
  ASSERT_FALSE(flags.empty());
  EXPECT_NE(flags.find(" dc"), std::string::npos) << flags;  // MADV_DONTFORK
}

TEST(CudaPinnedPoolFake, BindsToTheDevicesNumaNode) {
  FakeRuntime rt;
  rt.numa_id = 0;  // node 0 exists on every Linux machine
  auto pool = PinnedHostPool::create(8 * 4096, 4096, PinnedHostPool::Options{}, rt);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  // mbind may be refused in a restricted container (then the pool is simply unbound).
  EXPECT_TRUE(pool->numa_node() == 0 || pool->numa_node() == PinnedHostPool::kNoNuma);
  if (pool->numa_node() == 0) {
    EXPECT_NE(vm_flags(pool->data()).find(" dc"), std::string::npos);
  }
}

TEST(CudaPinnedPoolFake, RefusesAPoolLargerThanTheHostCanBack) {
  FakeRuntime rt;
  auto pool = PinnedHostPool::create(std::size_t{1} << 50, 4096, PinnedHostPool::Options{}, rt);
  ASSERT_FALSE(pool.is_ok());
  EXPECT_EQ(pool.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(pool.status().message().find("MemAvailable"), std::string::npos)
      << pool.status().message();
  EXPECT_TRUE(rt.registered.empty());  // refused before mapping or pinning anything
}

}  // namespace
}  // namespace radixtier::cuda
