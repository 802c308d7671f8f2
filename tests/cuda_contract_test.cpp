// The stream and context contract of the CUDA engine (issue 23), on the fake runtime
// (cuda_fake_runtime.hpp), which models CUDA's capture modes, per-thread contexts and the
// legacy stream:
//   1. a graph captured on a side stream by the server survives poll(), wait(), a ticket's
//      destruction and a submit() from a cache thread, and the feeder threads;
//   2. no call creates a context on a device the caller did not use; the caller's context,
//      "none" included, is restored; the pinned pool registers in its device's context;
//   3. nullptr is the legacy default stream (PyTorch's default stream), never refused;
//   4. promotions are enqueued layer group by layer group, with an event per group that
//      stream_wait_layer() waits on;
//   5. kAuto sends small pieces to the kernel; 16 CTAs; a missing kernel image falls back to
//      DMA for good; the feeder keeps 2 slices in flight per direction and a waiter enqueues
//      the rest; blocking-sync events; segments checked against their allocations; the
//      driver floor named;
//   6. the disk tier works over the CUDA engine's pinned pool (HostPages), byte-exact across a
//      restart, and the cache accepts the pair.
// With `execute`, the fake moves real bytes, so the layer order and kAuto are checked byte by
// byte too.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "cuda_fake_runtime.hpp"
#include "disk_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"
#include "radixtier/disk/disk_store_engine.hpp"

namespace radixtier::cuda {
namespace {

using testing::FakeRuntime;
using testing::Fixture;
using testing::kPage;
using testing::Op;
using testing::scattered;

// Ops of one stream, in order (read with the engine idle).
std::vector<Op> ops_on(FakeRuntime& rt, cudaStream_t s) {
  auto lock = rt.lock();
  std::vector<Op> out;
  for (const Op& op : rt.ops)
    if (op.stream == s) out.push_back(op);
  return out;
}

// Waits (up to 10 s) until `pred` holds.
template <class Pred>
bool eventually(Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// --- 1. capture on a side stream ----------------------------------------------------------

TEST(CudaContract, SideStreamCaptureSurvivesTheCacheThread) {
  for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
    SCOPED_TRACE(in_flight);
    Fixture f;
    CudaEngineOptions o = f.options(2);
    o.slices_in_flight = in_flight;
    auto engine = f.engine(o);
    ASSERT_NE(engine, nullptr);
    auto down = engine->submit(scattered(Direction::kDeviceToHost, 6));
    auto up = engine->submit(scattered(Direction::kHostToDevice, 3));
    ASSERT_TRUE(down.is_ok() && up.is_ok());
    // The server captures a graph on its own side stream, in global mode (torch.cuda.graph).
    const cudaStream_t side = f.rt.make_stream(cudaStreamNonBlocking, 0);
    std::promise<void> capturing, done;
    cudaError_t ended = cudaErrorUnknown;
    int nodes = -1;
    std::thread server([&] {
      f.rt.begin_capture(side, cudaStreamCaptureModeGlobal);
      capturing.set_value();
      done.get_future().wait();
      ended = f.rt.end_capture(side, &nodes);
    });
    capturing.get_future().wait();
    // Meanwhile the cache thread polls, waits, drops a ticket and submits.
    if (in_flight == 0) {
      EXPECT_EQ(down->poll(), TransferState::kPending);
    }
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(down->wait(), TransferState::kDone);
    up->reset();  // a pending ticket's destructor: poll, then wait
    auto more = engine->submit(scattered(Direction::kDeviceToHost, 4));
    ASSERT_TRUE(more.is_ok()) << more.status().to_string();  // the compute stream is not captured
    EXPECT_EQ(more->wait(), TransferState::kDone);
    EXPECT_TRUE(engine->stream_wait(more->id(), f.rt.compute()).is_ok());
    if (in_flight > 0) {  // the feeder alone, waiting on its slices in flight, mid-capture
      auto bulk = engine->submit(scattered(Direction::kDeviceToHost, 20));  // 10 slices
      ASSERT_TRUE(bulk.is_ok());
      EXPECT_TRUE(eventually([&] { return bulk->poll() == TransferState::kDone; }));
    }
    EXPECT_EQ(f.rt.thread_capture_mode(), cudaStreamCaptureModeGlobal);  // the caller's, back
    done.set_value();
    server.join();
    EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorName(ended);
    EXPECT_EQ(nodes, 0);
    EXPECT_EQ(f.rt.capture_violations, 0);
    EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
  }
}

TEST(CudaContract, KeepsTheCallersCaptureMode) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  for (cudaStreamCaptureMode m : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed,
                                  cudaStreamCaptureModeGlobal}) {
    f.rt.set_thread_capture_mode(m);
    auto t = engine->submit(scattered(Direction::kHostToDevice, 2));
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(f.rt.thread_capture_mode(), m);
    (void)t->poll();
    EXPECT_EQ(f.rt.thread_capture_mode(), m);
    EXPECT_TRUE(engine->stream_wait(t->id(), f.rt.compute()).is_ok());
    EXPECT_EQ(f.rt.thread_capture_mode(), m);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->wait(), TransferState::kDone);
    EXPECT_EQ(f.rt.thread_capture_mode(), m);
    f.rt.query_result = cudaErrorNotReady;
  }
}

// --- 2. contexts ------------------------------------------------------------------------

TEST(CudaContract, NoContextOnADeviceTheCallerDidNotUse) {
  Fixture f;
  f.rt.device_count = 2;
  const cudaStream_t compute = f.rt.make_stream(cudaStreamNonBlocking, 1);
  // A thread that never chose a device (a cache thread) does everything on device 1.
  std::thread cache_thread([&] {
    CudaEngineOptions o = f.options();
    o.device = 1;
    o.compute_stream = compute;
    auto created = f.create(f.pools(64, 1), o);
    ASSERT_TRUE(created.is_ok()) << created.status().to_string();
    auto engine = std::move(created).value();
    EXPECT_EQ(f.rt.thread_context(), nullptr);
    auto down = engine->submit(scattered(Direction::kDeviceToHost, 3));
    auto up = engine->submit(scattered(Direction::kHostToDevice, 3));
    ASSERT_TRUE(down.is_ok() && up.is_ok());
    EXPECT_EQ(f.rt.thread_context(), nullptr);
    EXPECT_EQ(down->poll(), TransferState::kPending);
    EXPECT_EQ(f.rt.thread_context(), nullptr);
    EXPECT_TRUE(engine->stream_wait(up->id(), compute).is_ok());
    EXPECT_EQ(f.rt.thread_context(), nullptr);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(down->wait(), TransferState::kDone);
    EXPECT_EQ(f.rt.thread_context(), nullptr);
    up->reset();
    down->reset();
    engine.reset();
    EXPECT_EQ(f.rt.thread_context(), nullptr);
  });
  cache_thread.join();
  EXPECT_EQ(f.rt.contexts_created(), std::set<int>{1});  // none on GPU 0
  EXPECT_EQ(f.rt.retained(1), 0);
}

TEST(CudaContract, PollAndWaitFromAThreadWithoutAContext) {
  Fixture f;
  f.rt.device_count = 2;
  CudaEngineOptions o = f.options();
  o.device = 1;
  o.compute_stream = f.rt.make_stream(cudaStreamNonBlocking, 1);
  ASSERT_EQ(f.rt.ctx_set_current(FakeRuntime::primary(1)), cudaSuccess);  // the model's thread
  auto created = f.create(f.pools(64, 1), o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  auto engine = std::move(created).value();
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 5));
  ASSERT_TRUE(t.is_ok());
  std::thread poller([&] {  // e.g. the cache's own thread, or a ticket destroyed there
    EXPECT_EQ(engine->poll(t->id()), TransferState::kPending);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(engine->wait(t->id()), TransferState::kDone);
    EXPECT_EQ(f.rt.thread_context(), nullptr);
  });
  poller.join();
  EXPECT_EQ(f.rt.contexts_created(), std::set<int>{1});
  EXPECT_EQ(f.rt.thread_context(), FakeRuntime::primary(1));
}

TEST(CudaContract, PinnedPoolRegistersInItsDevicesContext) {
  FakeRuntime rt;
  rt.device_count = 2;
  std::thread t([&] {
    PinnedHostPool::Options po;
    po.device = 1;
    po.max_register_chunk = 2 * 4096;
    po.numa_node = PinnedHostPool::kNoNuma;
    auto pool = PinnedHostPool::create(6 * 4096, 4096, po, rt);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    EXPECT_EQ(rt.thread_context(), nullptr);
    pool->reset();
    EXPECT_EQ(rt.thread_context(), nullptr);
  });
  t.join();
  EXPECT_EQ(rt.register_devices, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(rt.contexts_created(), std::set<int>{1});
  EXPECT_EQ(rt.retained(1), 0);
}

// --- 3. the legacy default stream ---------------------------------------------------------

TEST(CudaContract, NullptrIsTheLegacyDefaultStream) {
  for (cudaStream_t handle : {static_cast<cudaStream_t>(nullptr), cudaStreamLegacy}) {
    Fixture f;
    CudaEngineOptions o = f.options();
    o.compute_stream = handle;  // torch.cuda.current_stream().cuda_stream == 0
    auto created = f.create(f.pools(), o);
    ASSERT_TRUE(created.is_ok()) << created.status().to_string();
    auto engine = std::move(created).value();
    auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    // The demotion waits for the legacy stream's queued work: an event recorded there, waited
    // on by the copy stream before its first copy.
    const auto legacy = ops_on(f.rt, cudaStreamLegacy);
    ASSERT_EQ(legacy.size(), 1u);
    EXPECT_EQ(legacy[0].kind, Op::kRecord);
    const auto copy = ops_on(f.rt, engine->stream(Direction::kDeviceToHost));
    ASSERT_GE(copy.size(), 2u);
    EXPECT_EQ(copy[0].kind, Op::kWait);
    EXPECT_EQ(copy[0].event, legacy[0].event);
    // And the legacy stream can wait for a promotion.
    auto up = engine->submit(scattered(Direction::kHostToDevice, 3));
    ASSERT_TRUE(up.is_ok());
    EXPECT_TRUE(engine->stream_wait(up->id(), nullptr).is_ok());
    const auto after = ops_on(f.rt, cudaStreamLegacy);
    ASSERT_FALSE(after.empty());
    EXPECT_EQ(after.back().kind, Op::kWait);
    EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
    f.rt.query_result = cudaSuccess;
  }
}

TEST(CudaContract, LegacyStreamWhileABlockingStreamIsCaptured) {
  Fixture f;
  CudaEngineOptions o = f.options();
  o.compute_stream = nullptr;
  auto engine = f.engine(o);
  ASSERT_NE(engine, nullptr);
  // A capture on a blocking stream: any use of the legacy stream would join it.
  const cudaStream_t blocking = f.rt.make_stream(cudaStreamDefault, 0);
  f.rt.begin_capture(blocking, cudaStreamCaptureModeGlobal);
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(engine->stats().refused_captures, 1u);
  int nodes = -1;
  EXPECT_EQ(f.rt.end_capture(blocking, &nodes), cudaSuccess);  // not invalidated
  EXPECT_EQ(nodes, 0);
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
  // A non-blocking side stream's capture does not involve the legacy stream.
  const cudaStream_t side = f.rt.make_stream(cudaStreamNonBlocking, 0);
  f.rt.begin_capture(side, cudaStreamCaptureModeGlobal);
  auto t2 = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t2.is_ok()) << t2.status().to_string();
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t2->wait(), TransferState::kDone);
  EXPECT_EQ(f.rt.end_capture(side, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0);
}

// --- 4. layer by layer --------------------------------------------------------------------

constexpr KvGeometry kFourLayers{4, 2, 1, 64, 2};  // 256-byte chunks, 2 KiB pages

// The layer of a copy's device address in a layer-first pool of `pages` pages.
std::uint32_t layer_of(std::uintptr_t dev, std::uintptr_t base, std::uint32_t pages) {
  const std::size_t tensor = kFourLayers.chunk_bytes() * pages;
  return static_cast<std::uint32_t>((dev - base) / tensor % kFourLayers.layers);
}

TEST(CudaContract, PromotionsGoLayerByLayerWithAnEventPerLayer) {
  Fixture f;
  CudaPools p = f.pools();
  p.gpu_kv = kv_layer_first(Fixture::gpu_base(0), kFourLayers, 64);
  CudaEngineOptions o = f.options(4);
  auto created = f.create(p, o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  auto engine = std::move(created).value();
  EXPECT_EQ(engine->layers(), 4u);
  EXPECT_EQ(engine->stats().layer_groups, 4u);
  auto t = engine->submit(scattered(Direction::kHostToDevice, 6));  // 2 slices per layer
  ASSERT_TRUE(t.is_ok());
  const auto ops = ops_on(f.rt, engine->stream(Direction::kHostToDevice));
  // [wait for compute] copies of layer 0, event, copies of layer 1, event, ..., layer 3, event.
  std::vector<std::uint32_t> layer_seen;
  std::vector<cudaEvent_t> after_layer;
  for (const Op& op : ops) {
    if (op.kind == Op::kCopy) {
      const std::uint32_t l = layer_of(op.dst, Fixture::gpu_base(0), 64);
      if (layer_seen.empty() || layer_seen.back() != l) layer_seen.push_back(l);
    } else if (op.kind == Op::kRecord) {
      after_layer.push_back(op.event);
      EXPECT_EQ(after_layer.size(), layer_seen.size()) << "an event not right after a layer";
    }
  }
  EXPECT_EQ(layer_seen, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  ASSERT_EQ(after_layer.size(), 4u);
  EXPECT_EQ(engine->stats().layer_events, 3u);
  // The model's layer l waits only for the event after layer l.
  for (std::uint32_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(engine->stream_wait_layer(t->id(), l, f.rt.compute()).is_ok());
    const auto c = ops_on(f.rt, f.rt.compute());
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.back().kind, Op::kWait);
    EXPECT_EQ(c.back().event, after_layer[l]) << "layer " << l;
  }
  // A demotion stays in page order with one event.
  auto d = engine->submit(scattered(Direction::kDeviceToHost, 2));
  ASSERT_TRUE(d.is_ok());
  std::vector<std::uint32_t> demoted;
  int records = 0;
  for (const Op& op : ops_on(f.rt, engine->stream(Direction::kDeviceToHost))) {
    if (op.kind == Op::kCopy) demoted.push_back(layer_of(op.src, Fixture::gpu_base(0), 64));
    records += op.kind == Op::kRecord;
  }
  EXPECT_EQ(demoted, (std::vector<std::uint32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(records, 1);
  f.rt.query_result = cudaSuccess;
}

TEST(CudaContract, LayerGroupsAndTheKernelsSegmentTable) {
  Fixture f;
  CudaPools p = f.pools();
  p.gpu_kv = kv_layer_first(Fixture::gpu_base(0), kFourLayers, 64);
  CudaEngineOptions o = f.options(8);
  o.promote_layer_groups = 2;  // layers {0, 1} and {2, 3}
  o.h2d = CopyMethod::kZeroCopyKernel;
  auto created = f.create(p, o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  auto engine = std::move(created).value();
  auto t = engine->submit(scattered(Direction::kHostToDevice, 5));
  ASSERT_TRUE(t.is_ok());
  // One launch per group, each over its part of the (group-major) segment table: K and V of
  // two layers.
  ASSERT_EQ(f.rt.launch_tables.size(), 2u);
  EXPECT_EQ(f.rt.launch_tables[0].second, 4);
  EXPECT_EQ(f.rt.launch_tables[1].second, 4);
  EXPECT_EQ(f.rt.launch_tables[1].first - f.rt.launch_tables[0].first,
            4 * sizeof(detail::DeviceSegment));
  const auto ops = ops_on(f.rt, engine->stream(Direction::kHostToDevice));
  std::vector<cudaEvent_t> events;
  for (const Op& op : ops)
    if (op.kind == Op::kRecord) events.push_back(op.event);
  ASSERT_EQ(events.size(), 2u);
  for (std::uint32_t l = 0; l < 4; ++l) {
    ASSERT_TRUE(engine->stream_wait_layer(t->id(), l, f.rt.compute()).is_ok());
    EXPECT_EQ(ops_on(f.rt, f.rt.compute()).back().event, events[l / 2]) << "layer " << l;
  }
  // A layer the layout does not have is refused; a layout without layers waits on the whole
  // ticket.
  EXPECT_EQ(engine->stream_wait_layer(t->id(), 4, f.rt.compute()).code(),
            ErrorCode::kInvalidArgument);
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(t->wait(), TransferState::kDone);
  auto plain = f.engine(f.options());
  ASSERT_NE(plain, nullptr);
  auto u = plain->submit(scattered(Direction::kHostToDevice, 3));
  ASSERT_TRUE(u.is_ok());
  EXPECT_TRUE(plain->stream_wait_layer(u->id(), 9, f.rt.compute()).is_ok());
  EXPECT_EQ(plain->layers(), 0u);
}

// Every byte, on the executing fake: GPU -> host -> other GPU pages, with layer groups, for
// each method, in both feeder modes.
TEST(CudaContract, LayeredPromotionsAreByteExact) {
  const KvGeometry g{4, 8, 2, 32, 2};  // 1 KiB chunks, 8 KiB pages
  constexpr std::uint32_t kPages = 32;
  for (CopyMethod method :
       {CopyMethod::kDmaBatch, CopyMethod::kZeroCopyKernel, CopyMethod::kAuto}) {
    for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
      SCOPED_TRACE(std::string(to_string(method)) + " in flight " + std::to_string(in_flight));
      FakeRuntime rt;
      rt.execute = true;
      std::vector<std::byte> gpu(g.page_bytes() * kPages), host(g.page_bytes() * kPages);
      const auto base = reinterpret_cast<std::uintptr_t>(gpu.data());
      rt.add_alloc(base, gpu.size(), 0);
      for (std::size_t i = 0; i < gpu.size(); ++i) gpu[i] = static_cast<std::byte>(i * 131 + 7);
      const std::vector<std::byte> original = gpu;
      CudaPools p;
      p.gpu_kv = kv_layer_first(base, g, kPages);
      p.host_kv = host.data();
      p.host_pages = kPages;
      CudaEngineOptions o;
      o.slice_pages = 3;
      o.d2h = o.h2d = method;
      o.compute_stream = rt.compute();
      o.slices_in_flight = in_flight;
      o.promote_layer_groups = 3;  // 4 layers in 3 groups
      detail::EngineSeams seams;
      seams.runtime = &rt;
      auto created = CudaTransferEngine::create(p, o, seams);
      ASSERT_TRUE(created.is_ok()) << created.status().to_string();
      auto& e = **created;
      rt.query_result = cudaSuccess;
      TransferBatch down;
      for (std::uint32_t i = 0; i < 10; ++i)
        down.pages.push_back({GpuPageId(i), HostPageId(kPages - 1 - 2 * i)});
      auto t = e.submit(down);
      ASSERT_TRUE(t.is_ok());
      ASSERT_EQ(t->wait(), TransferState::kDone);
      TransferBatch up;
      up.direction = Direction::kHostToDevice;
      for (std::uint32_t i = 0; i < 10; ++i)
        up.pages.push_back({GpuPageId(kPages - 1 - i), HostPageId(kPages - 1 - 2 * i)});
      auto u = e.submit(up);
      ASSERT_TRUE(u.is_ok());
      ASSERT_TRUE(e.stream_wait_layer(u->id(), 0, rt.compute()).is_ok());
      ASSERT_EQ(u->wait(), TransferState::kDone);
      // GPU page kPages-1-i now holds page i's bytes in every chunk; the rest is untouched.
      const std::size_t chunk = g.chunk_bytes();
      std::size_t wrong = 0;
      for (std::uint32_t c = 0; c < 2 * g.layers; ++c) {
        for (std::uint32_t page = 0; page < kPages; ++page) {
          const std::uint32_t src = page >= kPages - 10 ? kPages - 1 - page : page;
          for (std::size_t b = 0; b < chunk; ++b)
            wrong +=
                gpu[(c * kPages + page) * chunk + b] != original[(c * kPages + src) * chunk + b];
        }
      }
      EXPECT_EQ(wrong, 0u);
      const CudaEngineStats s = e.stats();
      if (method != CopyMethod::kDmaBatch) {
        EXPECT_GT(s.kernel_launches, 0u);  // 1 KiB pieces
      }
      EXPECT_EQ(s.layer_events, 2u);
      EXPECT_EQ(s.failed, 0u);
    }
  }
}

// --- 5. method, grid, fallback, feeder, events, ranges, driver --------------------------

TEST(CudaContract, AutoSendsSmallPiecesToTheKernel) {
  struct Case {
    std::uint32_t page_size;  // tokens: 8 -> 8 KiB chunks, 64 -> 64 KiB chunks
    bool mapped;
    bool kernel;
  };
  for (const Case& c : {Case{8, true, true}, Case{64, true, false}, Case{8, false, false}}) {
    SCOPED_TRACE(c.page_size);
    Fixture f;
    f.rt.host_mapped = c.mapped;
    const KvGeometry g{2, c.page_size, 2, 256, 2};
    std::vector<std::byte> host(g.page_bytes() * 16);
    CudaPools p;
    p.gpu_kv = kv_layer_first(Fixture::gpu_base(0), g, 16);
    p.host_kv = host.data();
    p.host_pages = 16;
    CudaEngineOptions o = f.options(4);
    o.d2h = o.h2d = CopyMethod::kAuto;  // the default
    EXPECT_EQ(CudaEngineOptions{}.h2d, CopyMethod::kAuto);
    auto created = f.create(p, o);
    ASSERT_TRUE(created.is_ok()) << created.status().to_string();
    auto engine = std::move(created).value();
    TransferBatch b;
    b.direction = Direction::kHostToDevice;
    for (std::uint32_t i = 0; i < 4; ++i) b.pages.push_back({GpuPageId(3 * i), HostPageId(i)});
    auto t = engine->submit(b);
    ASSERT_TRUE(t.is_ok());
    const CudaEngineStats s = engine->stats();
    EXPECT_EQ(s.auto_kernel_slices, c.kernel ? 2u : 0u);  // one slice per layer
    EXPECT_EQ(s.auto_dma_slices, c.kernel ? 0u : 2u);
    EXPECT_EQ(f.rt.launches, c.kernel ? 2 : 0);
    EXPECT_EQ(f.rt.batch_calls, c.kernel ? 0 : 2);
    f.rt.query_result = cudaSuccess;
  }
}

TEST(CudaContract, KernelGridIsSixteenBlocksByDefault) {
  for (auto [sms, blocks, want] :
       {std::tuple{132, 0, 16}, std::tuple{8, 0, 8}, std::tuple{132, 40, 40}}) {
    Fixture f;
    f.rt.sms = sms;
    CudaEngineOptions o = f.options();
    o.d2h = CopyMethod::kZeroCopyKernel;
    o.kernel_blocks = blocks;
    auto engine = f.engine(o);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->submit(scattered(Direction::kDeviceToHost, 3)).is_ok());
    ASSERT_EQ(f.rt.launch_blocks.size(), 1u);
    EXPECT_EQ(f.rt.launch_blocks[0], want) << sms << " SMs, kernel_blocks " << blocks;
    f.rt.query_result = cudaSuccess;
  }
}

TEST(CudaContract, NoKernelImageFallsBackToDmaForGood) {
  {  // found by the probe in create()
    Fixture f;
    f.rt.probe_result = cudaErrorNoKernelImageForDevice;
    CudaEngineOptions o = f.options();
    o.d2h = o.h2d = CopyMethod::kZeroCopyKernel;
    auto engine = f.engine(o);
    ASSERT_NE(engine, nullptr);
    const CudaEngineStats s = engine->stats();
    EXPECT_TRUE(s.kernel_fallback);
    EXPECT_NE(s.kernel_fallback_reason.find("cudaErrorNoKernelImageForDevice"), std::string::npos)
        << s.kernel_fallback_reason;
    EXPECT_EQ(f.log_lines(), 1u);
    auto t = engine->submit(scattered(Direction::kHostToDevice, 6));
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(f.rt.launches, 0);
    EXPECT_EQ(f.rt.copies.size(), 6u);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->wait(), TransferState::kDone);
    EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
  }
  {  // refused at the first launch: that slice is redone by DMA, the ticket is fine
    Fixture f;
    f.rt.launch_result = cudaErrorNoKernelImageForDevice;
    CudaEngineOptions o = f.options(4);
    o.d2h = CopyMethod::kZeroCopyKernel;
    auto engine = f.engine(o);
    ASSERT_NE(engine, nullptr);
    auto t = engine->submit(scattered(Direction::kDeviceToHost, 8));  // 2 slices
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(f.rt.launches, 1);
    EXPECT_EQ(f.rt.copies.size(), 8u);
    f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->wait(), TransferState::kDone);
    EXPECT_TRUE(engine->stats().kernel_fallback);
    EXPECT_EQ(engine->stats().failed, 0u);
    EXPECT_EQ(f.log_lines(), 1u);
  }
}

TEST(CudaContract, FeederKeepsTwoSlicesInFlightAndAWaiterEnqueuesTheRest) {
  Fixture f;
  CudaEngineOptions o = f.options(4);
  o.slices_in_flight = 2;
  std::promise<void> blocked, go_on;
  std::shared_future<void> go = go_on.get_future().share();
  std::atomic<bool> first{true};
  f.rt.on_sync = [&](cudaEvent_t) {  // the first wait (the feeder's) stalls until go_on
    if (first.exchange(false)) {
      blocked.set_value();
      go.wait_for(std::chrono::seconds(10));  // bounded: a failing test must not hang
    }
  };
  auto engine = f.engine(o);
  ASSERT_NE(engine, nullptr);
  struct Release {  // whatever happens below, the feeder goes on before the engine goes
    std::promise<void>& p;
    bool done = false;
    void operator()() {
      if (!done) p.set_value();
      done = true;
    }
    ~Release() { (*this)(); }
  } release{go_on};
  auto down = engine->submit(scattered(Direction::kDeviceToHost, 24));  // 6 slices
  ASSERT_TRUE(down.is_ok());
  // The demotion feeder waits for its oldest slice.
  ASSERT_EQ(blocked.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the feeder never waited for a slice in flight";
  {
    auto lock = f.rt.lock();
    EXPECT_EQ(f.rt.batch_calls, 2);
  }
  EXPECT_EQ(down->poll(), TransferState::kPending);
  // Promotions have their own lane: they are enqueued while the demotions wait.
  auto up = engine->submit(scattered(Direction::kHostToDevice, 8));  // 2 slices
  ASSERT_TRUE(up.is_ok());
  EXPECT_TRUE(eventually([&] {
    auto lock = f.rt.lock();
    return f.rt.batch_calls == 4 && f.rt.records >= 4;  // + ready and done events of `up`
  }));
  // The model needs the demotion's pages now: stream_wait enqueues the rest on this thread
  // (the stalled feeder does not hold it back), then waits for the ticket's last event.
  ASSERT_TRUE(engine->stream_wait(down->id(), f.rt.compute()).is_ok());
  const auto copy = ops_on(f.rt, engine->stream(Direction::kDeviceToHost));
  int copies = 0;
  cudaEvent_t last_record = nullptr;
  for (const Op& op : copy) {
    copies += op.kind == Op::kCopy;
    if (op.kind == Op::kRecord) last_record = op.event;
  }
  EXPECT_EQ(copies, 24);
  const auto waits = ops_on(f.rt, f.rt.compute());
  ASSERT_FALSE(waits.empty());
  EXPECT_EQ(waits.back().kind, Op::kWait);
  EXPECT_EQ(waits.back().event, last_record);
  EXPECT_EQ(engine->stats().urgent_feeds, 1u);
  release();
  f.rt.query_result = cudaSuccess;
  EXPECT_EQ(down->wait(), TransferState::kDone);
  EXPECT_EQ(up->wait(), TransferState::kDone);
  EXPECT_EQ(engine->stats().slices, 8u);
}

TEST(CudaContract, FeederDrainsOnDestructionAndTicketsCompleteInTheBackground) {
  Fixture f;
  CudaEngineOptions o = f.options(2);
  o.slices_in_flight = 2;
  auto engine = f.engine(o);
  ASSERT_NE(engine, nullptr);
  f.rt.query_result = cudaSuccess;
  std::vector<Ticket> tickets;
  for (int i = 0; i < 6; ++i) {
    auto t =
        engine->submit(scattered(i % 2 ? Direction::kHostToDevice : Direction::kDeviceToHost, 7));
    ASSERT_TRUE(t.is_ok());
    tickets.push_back(std::move(t).value());
  }
  // The feeders enqueue everything with nobody waiting; polls see the tickets done.
  EXPECT_TRUE(eventually([&] {
    return std::all_of(tickets.begin(), tickets.end(),
                       [](const Ticket& t) { return t.poll() == TransferState::kDone; });
  }));
  EXPECT_EQ(engine->stats().slices, 6u * 4);
  EXPECT_EQ(engine->stats().urgent_feeds, 0u);
  tickets.clear();
  auto last = engine->submit(scattered(Direction::kDeviceToHost, 9));
  ASSERT_TRUE(last.is_ok());
  last->reset();
  engine.reset();  // joins the feeders
  auto lock = f.rt.lock();
  EXPECT_EQ(f.rt.copies.size(), 6u * 7 + 9);
}

TEST(CudaContract, TicketEventsSleepInsteadOfSpinning) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  auto t = engine->submit(scattered(Direction::kDeviceToHost, 3));
  ASSERT_TRUE(t.is_ok());
  const cudaEvent_t done = f.rt.event_records.back().first;
  EXPECT_EQ(f.rt.event_records.back().second, engine->stream(Direction::kDeviceToHost));
  EXPECT_NE(f.rt.event_flags[done] & cudaEventBlockingSync, 0u);
  EXPECT_NE(f.rt.event_flags[done] & cudaEventDisableTiming, 0u);
  f.rt.query_result = cudaSuccess;
}

TEST(CudaContract, SegmentsMustLieInDeviceMemoryOfTheEnginesDevice) {
  Fixture f;
  auto status = [&](DeviceLayout layout) {
    CudaPools p = f.pools();
    p.gpu_kv = std::move(layout);
    return f.create(p, f.options()).status();
  };
  // Past the end of its allocation.
  const std::uintptr_t end = Fixture::gpu_base(0) + testing::kGpuAlloc;
  Status s = status(contiguous_items(end - 10 * kPage, kPage, 11));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gpu_kv segment 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("in no device allocation"), std::string::npos) << s.message();
  EXPECT_TRUE(status(contiguous_items(end - 10 * kPage, kPage, 10)).is_ok());
  // Two adjacent mappings (VMM, expandable segments): fine; a gap between them: refused.
  constexpr std::uintptr_t kVmm = 0x900000000;
  f.rt.add_alloc(kVmm, 1 << 20, 0);
  f.rt.add_alloc(kVmm + (1 << 20), 1 << 20, 0);
  EXPECT_TRUE(status(contiguous_items(kVmm, kPage, 512)).is_ok());
  f.rt.add_alloc(kVmm + (4 << 20), 1 << 20, 0);
  f.rt.add_alloc(kVmm + (5 << 20) + 4096, 1 << 20, 0);
  s = status(contiguous_items(kVmm + (4 << 20), kPage, 300));
  EXPECT_NE(s.message().find("in no device allocation"), std::string::npos) << s.message();
  // Another device's memory, host memory: refused.
  f.rt.device_count = 2;
  s = status(contiguous_items(Fixture::gpu_base(1), kPage, 8));
  EXPECT_NE(s.message().find("memory of device 1"), std::string::npos) << s.message();
  s = status(contiguous_items(reinterpret_cast<std::uintptr_t>(f.host.data()), kPage, 8));
  EXPECT_NE(s.message().find("is not device memory"), std::string::npos) << s.message();
  // The snapshot pool too.
  CudaPools p = f.pools();
  p.gpu_snapshots = contiguous_items(end - kPage, 2 * kPage, 1);
  s = f.create(p, f.options()).status();
  EXPECT_NE(s.message().find("gpu_snapshots segment 0"), std::string::npos) << s.message();
  // Without cuMemGetAddressRange the ranges cannot be checked: accepted.
  f.rt.address_range_supported = false;
  EXPECT_TRUE(status(contiguous_items(end - 10 * kPage, kPage, 11)).is_ok());
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
}

TEST(CudaContract, AnOldDriverIsNamedWithItsFloor) {
  for (auto [runtime, floor] : {std::pair{13000, ">= 580"}, std::pair{12080, ">= 525"}}) {
    Fixture f;
    f.rt.device_count_error = cudaErrorInsufficientDriver;
    f.rt.runtime_version = runtime;
    const Status s = f.create(f.pools(), f.options()).status();
    EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(floor), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("CUDA major version of the PyTorch"), std::string::npos);
  }
}

// --- 6. the disk tier over the pinned pool --------------------------------------------------

std::vector<HostPageId> ids(std::initializer_list<std::uint32_t> v) {
  std::vector<HostPageId> out;
  for (std::uint32_t x : v) out.push_back(HostPageId(x));
  return out;
}

TEST(CudaContract, DiskTierOverThePinnedPoolAcrossARestart) {
  using disk::testing::expected_bytes;
  using disk::testing::page_tokens_for;
  disk::testing::TempDir dir;
  const disk::DiskStoreConfig dc = disk::testing::small_config(dir.store());
  const std::size_t page = dc.fingerprint.page_bytes, snap = dc.fingerprint.snapshot_bytes;
  ASSERT_EQ(page, kPage);
  constexpr std::uint32_t kGpuPages = 16, kHostPages = 32;
  FakeRuntime rt;
  rt.execute = true;  // the "GPU" is real memory: every byte is checked
  std::vector<std::byte> gpu(kGpuPages * page), gpu_snap(2 * snap);
  rt.add_alloc(reinterpret_cast<std::uintptr_t>(gpu.data()), gpu.size(), 0);
  rt.add_alloc(reinterpret_cast<std::uintptr_t>(gpu_snap.data()), gpu_snap.size(), 0);
  PinnedHostPool::Options po;
  po.numa_node = PinnedHostPool::kNoNuma;
  auto make_engine = [&](PinnedHostPool& pool) {
    CudaPools p;
    p.gpu_kv = contiguous_items(reinterpret_cast<std::uintptr_t>(gpu.data()), page, kGpuPages);
    p.gpu_snapshots = contiguous_items(reinterpret_cast<std::uintptr_t>(gpu_snap.data()), snap, 2);
    p.host_kv_pool = &pool;
    p.host_pages = kHostPages;
    CudaEngineOptions o;
    o.compute_stream = rt.compute();
    detail::EngineSeams seams;
    seams.runtime = &rt;
    auto e = CudaTransferEngine::create(p, o, seams);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return std::move(e).value();
  };
  const disk::RecordDesc p1 = disk::RecordDesc::kv_page(PathHash::root(), 4, page_tokens_for(1, 4));
  const disk::RecordDesc p2 = disk::RecordDesc::kv_page(p1.node_path(), 8, page_tokens_for(2, 4));
  const disk::RecordDesc s2 = disk::RecordDesc::snapshot(p2.node_path(), 8);
  rt.query_result = cudaSuccess;

  // The model wrote GPU pages 3 and 5 and snapshot slot 1.
  const auto b1 = expected_bytes(p1, page), b2 = expected_bytes(p2, page);
  const auto bs = expected_bytes(s2, snap);
  std::copy(b1.begin(), b1.end(), gpu.begin() + 3 * page);
  std::copy(b2.begin(), b2.end(), gpu.begin() + 5 * page);
  std::copy(bs.begin(), bs.end(), gpu_snap.begin() + snap);
  std::vector<RecordId> written;
  {
    auto pool = PinnedHostPool::create(kHostPages * page, page, po, rt);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    auto engine = make_engine(*pool);
    TransferBatch down;  // GPU -> pinned host pages
    down.pages = {{GpuPageId(3), HostPageId(7)}, {GpuPageId(5), HostPageId(9)}};
    const auto snap_pages = ids({20, 5, 17, 11});
    for (std::size_t k = 0; k < snap_pages.size(); ++k)
      down.pieces.push_back({GpuSlotId(1), k * page, snap_pages[k]});
    auto t = engine->submit(down);
    ASSERT_TRUE(t.is_ok());
    ASSERT_EQ(t->wait(), TransferState::kDone);
    // Pinned host pages -> disk, through the engine's host memory.
    HostPages* host = engine->host_memory();
    ASSERT_NE(host, nullptr);
    EXPECT_EQ(host->page_bytes(), page);
    EXPECT_EQ(host->host_pages(), kHostPages);
    EXPECT_THROW(host->host_page(HostPageId(kHostPages)), std::out_of_range);
    auto store = disk::DiskStore::open(dc);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    disk::DiskStoreEngine disk_engine(**store, *host);
    auto w = disk_engine.submit_writes({{p1, ids({7})}, {p2, ids({9})}, {s2, snap_pages}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    while (!disk_engine.ready(*w)) {
    }
    auto rec = disk_engine.finish_writes(*w);
    ASSERT_TRUE(rec.is_ok()) << rec.status().to_string();
    written = *rec;
    ASSERT_TRUE(disk_engine.sync().is_ok());
    // The cache takes the CUDA engine and this store tier together.
    CacheConfig c;
    c.page_size = 4;
    c.gpu_pages = kGpuPages;
    c.host_pages = kHostPages - 4;  // + one host snapshot of 4 pages
    c.gpu_snapshot_slots = 2;
    c.host_snapshot_slots = 1;
    c.page_bytes = page;
    c.snapshot_bytes = snap;
    auto cache = PrefixCache::create(c, *engine, &disk_engine);
    EXPECT_TRUE(cache.is_ok()) << cache.status().to_string();
  }
  // A restart: GPU memory lost, a new pinned pool (fresh pages), a new engine, the store
  // reopened.
  std::fill(gpu.begin(), gpu.end(), std::byte{0xDB});
  std::fill(gpu_snap.begin(), gpu_snap.end(), std::byte{0xDB});
  auto pool = PinnedHostPool::create(kHostPages * page, page, po, rt);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto engine = make_engine(*pool);
  auto store = disk::DiskStore::open(dc);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  disk::DiskStoreEngine disk_engine(**store, *engine->host_memory());
  ASSERT_EQ(disk_engine.records().size(), 3u);
  auto r = disk_engine.submit_reads(
      {{written[0], ids({0})}, {written[1], ids({1})}, {written[2], ids({2, 30, 4, 31})}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  while (!disk_engine.ready(*r)) {
  }
  for (const Status& s : disk_engine.finish_reads(*r)) EXPECT_TRUE(s.is_ok()) << s.to_string();
  TransferBatch up;  // pinned host pages -> GPU
  up.direction = Direction::kHostToDevice;
  up.pages = {{GpuPageId(10), HostPageId(0)}, {GpuPageId(11), HostPageId(1)}};
  const auto back = ids({2, 30, 4, 31});
  for (std::size_t k = 0; k < back.size(); ++k)
    up.pieces.push_back({GpuSlotId(0), k * page, back[k]});
  auto t = engine->submit(up);
  ASSERT_TRUE(t.is_ok());
  ASSERT_EQ(t->wait(), TransferState::kDone);
  EXPECT_TRUE(std::equal(b1.begin(), b1.end(), gpu.begin() + 10 * page));
  EXPECT_TRUE(std::equal(b2.begin(), b2.end(), gpu.begin() + 11 * page));
  EXPECT_TRUE(std::equal(bs.begin(), bs.end(), gpu_snap.begin()));
  EXPECT_EQ((*store)->check_invariants(), "");
}

}  // namespace
}  // namespace radixtier::cuda
