// CPU tests of the CUDA transfer engine and the pinned pool on a fake CUDA runtime: the real
// engine code (kernels/) runs, every CUDA call goes to FakeRuntime (cuda_fake_runtime.hpp),
// so no GPU is needed. They check option and stream validation, the DMA fallback, error
// classification and the fatal status, capture refusal, last-error hygiene, the caller's
// context restored, stream priority, ticket ids, the recycled-event wait, slicing and failure
// after some slices, the per-range vector split of the kernel, and the pool's memory check,
// MADV_DONTFORK and registration chunks. The contract of issue 23 (capture modes, contexts,
// the legacy stream, layer order, kAuto, the feeder, the disk tier over the pinned pool) is
// in cuda_contract_test.cpp. What needs a device is in tests/gpu/.
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
#include "cuda_fake_runtime.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"

namespace radixtier::cuda {
namespace {

using detail::ErrorClass;

using testing::Copy;
using testing::FakeRuntime;

using testing::Fixture;
using testing::kGpuBase;
using testing::kPage;
using testing::scattered;

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

TEST(CudaEngineFake, ComputeStreamRules) {
  Fixture f;
  // The per-thread default stream means a different stream on every thread: refused.
  CudaEngineOptions o = f.options();
  o.compute_stream = cudaStreamPerThread;
  auto e = f.create(f.pools(), o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("CudaEngineOptions.compute_stream"), std::string::npos)
      << e.status().message();
  // A handle that is no stream, and a stream of another device, are refused too.
  o = f.options();
  o.compute_stream = reinterpret_cast<cudaStream_t>(0x1234500);
  e = f.create(f.pools(), o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("not a valid stream"), std::string::npos)
      << e.status().message();
  f.rt.device_count = 2;
  o = f.options();
  o.compute_stream = f.rt.make_stream(cudaStreamNonBlocking, 1);
  e = f.create(f.pools(), o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("device 1"), std::string::npos) << e.status().message();
  // stream_wait refuses the per-thread stream as well.
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  auto t = engine->submit(scattered(Direction::kHostToDevice, 2));
  ASSERT_TRUE(t.is_ok());
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

TEST(CudaEngineFake, RestoresTheCallersContext) {
  Fixture f;
  f.rt.device_count = 2;
  ASSERT_EQ(f.rt.set_device(0), cudaSuccess);  // the caller works on device 0
  CudaEngineOptions o = f.options();
  o.device = 1;
  o.compute_stream = f.rt.make_stream(cudaStreamNonBlocking, 1);
  auto created = f.create(f.pools(64, 1), o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  auto engine = std::move(created).value();
  EXPECT_EQ(f.rt.thread_context(), FakeRuntime::primary(0));
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t.is_ok());
  {
    auto lock = f.rt.lock();
    ASSERT_FALSE(f.rt.ops.empty());
    for (const testing::Op& op : f.rt.ops) EXPECT_EQ(op.device, 1);  // on the engine's device
  }
  EXPECT_EQ(f.rt.thread_context(), FakeRuntime::primary(0));  // and the caller's is back
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->wait(), TransferState::kDone);
  EXPECT_EQ(f.rt.thread_context(), FakeRuntime::primary(0));
  t->reset();
  engine.reset();
  EXPECT_EQ(f.rt.thread_context(), FakeRuntime::primary(0));
  EXPECT_EQ(f.rt.retained(1), 0);  // the engine released its device's primary context
}

TEST(CudaEngineFake, CopyStreamsHaveTheLowestPriority) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  ASSERT_EQ(f.rt.priorities.size(), 2u);
  EXPECT_EQ(f.rt.priorities[0], f.rt.least_priority);
  EXPECT_EQ(f.rt.priorities[1], f.rt.least_priority);
}

TEST(CudaEngineFake, PendingPollLeavesNoLastError) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
  f.rt.set_last_error(cudaErrorInvalidValue);  // the caller's own error, not read yet
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
    ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
  f.rt.batch_result = cudaErrorLaunchFailure;
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(engine->health().code(), ErrorCode::kDeviceLost);
}

TEST(CudaEngineFake, AsynchronousNonStickyErrorFailsOneTicket) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
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

TEST(CudaEngineFake, RefusesSubmitWhileTheComputeStreamIsCaptured) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  auto pending = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(pending.is_ok());
  f.rt.begin_capture(f.rt.compute(), cudaStreamCaptureModeGlobal);
  const int records = f.rt.records, copies = static_cast<int>(f.rt.copies.size());
  auto t = engine->submit(scattered(Direction::kHostToDevice, 4));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("being captured"), std::string::npos) << t.status().message();
  EXPECT_EQ(f.rt.records, records);  // nothing touched the compute or copy streams
  EXPECT_EQ(static_cast<int>(f.rt.copies.size()), copies);
  // A poll during the capture (even on the capturing thread) gets a real answer in relaxed
  // mode, and the capture survives it.
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(pending->poll(), TransferState::kDone);
  int nodes = -1;
  EXPECT_EQ(f.rt.end_capture(f.rt.compute(), &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0);
  EXPECT_EQ(f.rt.capture_violations, 0);
  // An invalidated capture (the server's own unsafe call) is refused too.
  f.rt.begin_capture(f.rt.compute(), cudaStreamCaptureModeGlobal);
  EXPECT_EQ(f.rt.stream_synchronize(f.rt.compute()), cudaErrorStreamCaptureUnsupported);
  (void)f.rt.get_last_error();
  t = engine->submit(scattered(Direction::kHostToDevice, 4));
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("invalidated capture"), std::string::npos)
      << t.status().message();
  EXPECT_EQ(f.rt.end_capture(f.rt.compute(), nullptr), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(engine->stats().refused_captures, 2u);
  EXPECT_TRUE(engine->submit(scattered(Direction::kHostToDevice, 4)).is_ok());
}

TEST(CudaEngineFake, FailureAfterSomeSlicesAreQueued) {
  for (CopyMethod method : {CopyMethod::kDmaBatch, CopyMethod::kZeroCopyKernel}) {
    Fixture f;
    CudaEngineOptions o = f.options(4);
    o.d2h = method;
    auto engine = f.engine(o);
    ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
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
  ASSERT_NE(engine, nullptr);
  auto t1 = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(t1.is_ok());
  const cudaEvent_t e1 = f.rt.event_records.back().first;
  std::promise<void> in_sync, go_on;
  std::shared_future<void> go = go_on.get_future().share();
  f.rt.on_sync = [&](cudaEvent_t) {
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
  const std::size_t before = f.rt.event_records.size();
  auto t3 = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(t3.is_ok());
  bool reused = false;  // recycled once nobody waits on it
  for (std::size_t i = before; i < f.rt.event_records.size(); ++i)
    reused = reused || f.rt.event_records[i].first == e1;
  EXPECT_TRUE(reused);
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

// --- device to device: live snapshot slots <-> GPU pages -------------------------------------

/// Real "GPU" memory on the executing fake: a layer-first KV pool of 64-byte pages in four
/// 16-byte segments and three GDN snapshot slots of 224 bytes in four segments (48, 64, 48, 64),
/// so every piece is cut where either side's segment ends, and the last piece of a snapshot is
/// 32 bytes of a 64-byte page.
struct D2dRig {
  static constexpr std::uint32_t kPages = 16, kSlots = 3;
  static constexpr KvGeometry kKv{2, 2, 1, 4, 2};
  static constexpr GdnGeometry kGdn{2, 1, 1, 4, 4, 3, 4, 2};
  FakeRuntime rt;
  std::vector<std::byte> kv = std::vector<std::byte>(kKv.page_bytes() * kPages);
  std::vector<std::byte> conv = std::vector<std::byte>(kGdn.conv_bytes() * kGdn.layers * kSlots);
  std::vector<std::byte> state = std::vector<std::byte>(kGdn.state_bytes() * kGdn.layers * kSlots);
  std::vector<std::byte> host = std::vector<std::byte>(kKv.page_bytes() * 4);
  CudaPools pools;

  D2dRig() {
    rt.execute = true;
    for (auto* v : {&kv, &conv, &state})
      rt.add_alloc(reinterpret_cast<std::uintptr_t>(v->data()), v->size(), 0);
    pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(kv.data()), kKv, kPages);
    pools.gpu_snapshots =
        snapshot_layer_first(reinterpret_cast<std::uintptr_t>(conv.data()),
                             reinterpret_cast<std::uintptr_t>(state.data()), kGdn, kSlots);
    pools.host_kv = host.data();
    pools.host_pages = 4;
  }
  std::unique_ptr<CudaTransferEngine> engine(std::size_t slices_in_flight,
                                             CopyMethod d2d = CopyMethod::kAuto) {
    CudaEngineOptions o;
    o.slice_pages = 3;
    o.compute_stream = rt.compute();
    o.d2h = o.h2d = CopyMethod::kDmaBatch;
    o.d2d = d2d;
    o.slices_in_flight = slices_in_flight;
    o.demote_after_compute = o.promote_after_compute = false;  // D2D waits all the same
    o.log = [](const std::string&) {};
    detail::EngineSeams seams;
    seams.runtime = &rt;
    auto e = CudaTransferEngine::create(pools, o, seams);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e.is_ok() ? std::move(e).value() : nullptr;
  }
  /// An item's bytes in its logical order (its segments one after the other, as in a host page).
  static std::vector<std::byte> bytes_of(const DeviceLayout& layout, std::uint32_t item) {
    std::vector<std::byte> out;
    for (const StridedSegment& s : layout.segments) {
      const auto* p = reinterpret_cast<const std::byte*>(s.base + item * s.item_stride);
      out.insert(out.end(), p, p + s.bytes);
    }
    return out;
  }
  static TransferBatch pieces(std::uint32_t slot, std::span<const std::uint32_t> pages,
                              bool to_slot) {
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    for (std::size_t k = 0; k < pages.size(); ++k)
      b.slot_pieces.push_back(
          {GpuSlotId(slot), k * kKv.page_bytes(), GpuPageId(pages[k]), to_slot});
    return b;
  }
};

// The three ways a slice of slot pieces is copied: the slot copy kernel (default), one
// cudaMemcpyBatchAsync of its runs, one cudaMemcpyAsync per run (no batch call here).
enum class D2dPath { kKernel, kBatch, kPerRun };
const char* to_string(D2dPath p) {
  return p == D2dPath::kKernel ? "kernel" : p == D2dPath::kBatch ? "batch" : "per run";
}

TEST(CudaEngineFake, DeviceToDeviceMaterializesAndResumesSlotsByteExact) {
  for (D2dPath path : {D2dPath::kKernel, D2dPath::kBatch, D2dPath::kPerRun})
    for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
      SCOPED_TRACE(std::string(to_string(path)) + ", slices in flight " +
                   std::to_string(in_flight));
      D2dRig r;
      if (path == D2dPath::kPerRun) r.rt.batch_result = cudaErrorNotSupported;
      const std::size_t page = D2dRig::kKv.page_bytes(), snap = D2dRig::kGdn.snapshot_bytes();
      ASSERT_EQ(page, 64u);
      ASSERT_EQ(snap, 224u);
      std::fill(r.kv.begin(), r.kv.end(), std::byte{0x5A});
      for (std::size_t i = 0; i < r.conv.size(); ++i) r.conv[i] = static_cast<std::byte>(i * 7 + 1);
      for (std::size_t i = 0; i < r.state.size(); ++i)
        r.state[i] = static_cast<std::byte>(i * 13 + 5);
      auto engine =
          r.engine(in_flight, path == D2dPath::kKernel ? CopyMethod::kAuto : CopyMethod::kDmaBatch);
      ASSERT_NE(engine, nullptr);
      EXPECT_EQ(engine->stream(Direction::kDeviceToDevice), nullptr);  // opened on first use
      EXPECT_EQ(r.rt.priorities.size(), 2u);
      r.rt.query_result = cudaSuccess;
      const DeviceLayout& slots = r.pools.gpu_snapshots;
      const DeviceLayout& kv = r.pools.gpu_kv;
      const std::vector<std::byte> want = D2dRig::bytes_of(slots, 1);
      const std::vector<std::byte> slot0 = D2dRig::bytes_of(slots, 0);

      // Materialize slot 1 into four pages, not ascending (2 slices of 3 pieces).
      const std::uint32_t pages[4] = {9, 2, 14, 5};
      auto t = engine->submit(D2dRig::pieces(1, pages, false));
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      ASSERT_EQ(t->wait(), TransferState::kDone);
      const cudaStream_t d2d = engine->stream(Direction::kDeviceToDevice);
      ASSERT_NE(d2d, nullptr);
      EXPECT_NE(d2d, engine->stream(Direction::kDeviceToHost));
      EXPECT_NE(d2d, engine->stream(Direction::kHostToDevice));
      ASSERT_EQ(r.rt.priorities.size(), 3u);
      EXPECT_EQ(r.rt.priorities[2], r.rt.least_priority);
      for (std::uint32_t p = 0; p < D2dRig::kPages; ++p) {
        const std::vector<std::byte> got = D2dRig::bytes_of(kv, p);
        const auto at = std::find(std::begin(pages), std::end(pages), p);
        std::size_t n = 0;
        if (at != std::end(pages)) {
          const std::size_t k = static_cast<std::size_t>(at - std::begin(pages));
          n = std::min(page, snap - k * page);
          EXPECT_TRUE(std::equal(got.begin(), got.begin() + n, want.begin() + k * page))
              << "page " << p;
        }
        // Past the piece (all of a page no piece went to) the page is as it was.
        EXPECT_TRUE(std::all_of(got.begin() + n, got.end(),
                                [](std::byte b) { return b == std::byte{0x5A}; }))
            << "page " << p;
      }
      // Every copy went device to device on the D2D stream, after it waited for the compute
      // stream (though demote/promote_after_compute are off): one kernel launch per slice, or
      // the runs by DMA.
      {
        auto lock = r.rt.lock();
        if (path == D2dPath::kKernel) {
          EXPECT_EQ(r.rt.slot_launches, 2);  // 4 pieces in slices of 3
          EXPECT_EQ(r.rt.slot_launch_pieces, (std::vector<std::uint32_t>{3, 1}));
          EXPECT_EQ(r.rt.slot_launch_blocks, (std::vector<int>{4 * r.rt.sms, 4 * r.rt.sms}));
          EXPECT_EQ(r.rt.async_calls + r.rt.batch_calls, 0);
        } else if (path == D2dPath::kBatch) {
          EXPECT_EQ(r.rt.batch_calls, 2);
          EXPECT_GT(r.rt.copies.size(), 4u);  // cut where the segments end
          EXPECT_EQ(r.rt.async_calls + r.rt.slot_launches, 0);
        } else {
          EXPECT_EQ(r.rt.d2d_calls, r.rt.async_calls);
          EXPECT_GT(r.rt.d2d_calls, 4);  // cut where the segments end
          EXPECT_EQ(r.rt.slot_launches, 0);
        }
        bool waited = false;
        for (const testing::Op& op : r.rt.ops) {
          if (op.kind == testing::Op::kWait && op.stream == d2d) waited = true;
          if (op.kind == testing::Op::kCopy || op.kind == testing::Op::kLaunch) {
            EXPECT_EQ(op.stream, d2d);
            EXPECT_TRUE(waited) << "a copy before the wait for the compute stream";
          }
        }
        EXPECT_TRUE(waited);
      }

      // Resume the pages into slot 2, the pieces in another order.
      TransferBatch up = D2dRig::pieces(2, pages, true);
      std::swap(up.slot_pieces[0], up.slot_pieces[3]);
      auto u = engine->submit(std::move(up));
      ASSERT_TRUE(u.is_ok()) << u.status().to_string();
      ASSERT_EQ(u->wait(), TransferState::kDone);
      EXPECT_EQ(D2dRig::bytes_of(slots, 2), want);
      EXPECT_EQ(D2dRig::bytes_of(slots, 1), want);
      EXPECT_EQ(D2dRig::bytes_of(slots, 0), slot0);
      EXPECT_EQ(engine->stream(Direction::kDeviceToDevice), d2d);  // one stream, kept
      EXPECT_EQ(r.rt.priorities.size(), 3u);

      const CudaEngineStats s = engine->stats();
      EXPECT_EQ(s.bytes_d2d, 2 * snap);
      EXPECT_EQ(s.bytes_d2h, 0u);
      EXPECT_EQ(s.bytes_h2d, 0u);
      EXPECT_EQ(s.batches, 2u);
      EXPECT_EQ(s.slices, 4u);
      EXPECT_EQ(s.failed, 0u);
      EXPECT_EQ(s.d2d_launches, path == D2dPath::kKernel ? 4u : 0u);
      EXPECT_EQ(s.d2d_dma_runs > 0, path != D2dPath::kKernel);
      EXPECT_EQ(r.rt.peek_at_last_error(), cudaSuccess);
    }
}

TEST(CudaEngineFake, DeviceToDeviceRejectsBadBatchesWholeAndCopiesNothing) {
  D2dRig r;
  auto engine = r.engine(0);
  ASSERT_NE(engine, nullptr);
  const SlotPieceCopy good{GpuSlotId(0), 64, GpuPageId(3), false};
  auto d2d = [&](std::initializer_list<SlotPieceCopy> more) {
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    b.slot_pieces = {good};
    b.slot_pieces.insert(b.slot_pieces.end(), more);
    return b;
  };
  std::vector<std::pair<std::string, TransferBatch>> bad;
  bad.emplace_back("slot out of range", d2d({{GpuSlotId(3), 0, GpuPageId(1), false}}));
  bad.emplace_back("page out of range", d2d({{GpuSlotId(1), 0, GpuPageId(16), true}}));
  bad.emplace_back("offset not a page multiple", d2d({{GpuSlotId(1), 32, GpuPageId(1), true}}));
  bad.emplace_back("offset past the snapshot", d2d({{GpuSlotId(1), 256, GpuPageId(1), false}}));
  TransferBatch with_page = d2d({});
  with_page.pages.push_back({GpuPageId(0), HostPageId(0)});
  bad.emplace_back("D2D with a page", std::move(with_page));
  TransferBatch with_piece = d2d({});
  with_piece.pieces.push_back({GpuSlotId(0), 0, HostPageId(0)});
  bad.emplace_back("D2D with a snapshot piece", std::move(with_piece));
  for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice}) {
    TransferBatch b;
    b.direction = dir;
    b.pages.push_back({GpuPageId(0), HostPageId(0)});
    b.slot_pieces.push_back(good);
    bad.emplace_back(std::string(to_string(dir)) + " with a slot piece", std::move(b));
  }
  const std::vector<std::byte> kv = r.kv, conv = r.conv, state = r.state, host = r.host;
  for (auto& [why, batch] : bad) {
    SCOPED_TRACE(why);
    auto t = engine->submit(std::move(batch));
    ASSERT_FALSE(t.is_ok());
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(r.rt.async_calls + r.rt.batch_calls, 0);
  EXPECT_TRUE(r.rt.ops.empty());                                   // nothing enqueued
  EXPECT_EQ(engine->stream(Direction::kDeviceToDevice), nullptr);  // nor opened
  EXPECT_EQ(engine->stats().batches, 0u);
  EXPECT_EQ(r.kv, kv);
  EXPECT_EQ(r.conv, conv);
  EXPECT_EQ(r.state, state);
  EXPECT_EQ(r.host, host);
  // The fake refuses a device-to-device copy with a host end, as CUDA does.
  EXPECT_EQ(
      r.rt.memcpy_async(r.host.data(), r.kv.data(), 16, cudaMemcpyDeviceToDevice, r.rt.compute()),
      cudaErrorInvalidValue);
  (void)r.rt.get_last_error();
}

TEST(CudaEngineFake, DeviceToDeviceFailureAfterTheFirstSliceFailsTheTicket) {
  for (D2dPath path : {D2dPath::kKernel, D2dPath::kBatch, D2dPath::kPerRun})
    for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
      SCOPED_TRACE(std::string(to_string(path)) + ", slices in flight " +
                   std::to_string(in_flight));
      D2dRig r;
      if (path == D2dPath::kPerRun) r.rt.batch_result = cudaErrorNotSupported;
      auto engine =
          r.engine(in_flight, path == D2dPath::kKernel ? CopyMethod::kAuto : CopyMethod::kDmaBatch);
      ASSERT_NE(engine, nullptr);
      const std::uint32_t pages[4] = {1, 0, 7, 4};
      engine->inject_error_on_next_submit(1);  // the second of two slices
      auto t = engine->submit(D2dRig::pieces(2, pages, false));
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      EXPECT_EQ(t->poll(), TransferState::kPending);  // its event is not done yet
      r.rt.query_result = cudaSuccess;
      EXPECT_EQ(t->wait(), TransferState::kFailed);
      const CudaEngineStats s = engine->stats();
      EXPECT_EQ(s.slices, 1u);  // the first slice was enqueued, the second refused
      EXPECT_EQ(s.failed, 1u);
      const char* want = path == D2dPath::kKernel  ? "cudaErrorInvalidConfiguration"
                         : path == D2dPath::kBatch ? "cudaErrorInvalidValue"
                                                   : "cudaErrorInvalidMemcpyDirection";
      EXPECT_NE(s.last_error.find(want), std::string::npos) << s.last_error;
      EXPECT_TRUE(engine->health().is_ok());
      {
        // The ticket's event follows what was enqueued, on the D2D stream.
        auto lock = r.rt.lock();
        ASSERT_FALSE(r.rt.event_records.empty());
        EXPECT_EQ(r.rt.event_records.back().second, engine->stream(Direction::kDeviceToDevice));
      }
      EXPECT_EQ(r.rt.peek_at_last_error(), cudaSuccess);
      auto again = engine->submit(D2dRig::pieces(2, pages, false));
      ASSERT_TRUE(again.is_ok());
      EXPECT_EQ(again->wait(), TransferState::kDone);
      EXPECT_EQ(engine->stats().failed, 1u);
    }
}

}  // namespace
}  // namespace radixtier::cuda
