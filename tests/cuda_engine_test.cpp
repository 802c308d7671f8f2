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

}  // namespace
}  // namespace radixtier::cuda
