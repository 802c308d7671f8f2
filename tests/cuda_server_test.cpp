// The CUDA engine in a GPU server (issue 33), on the fake runtime (cuda_fake_runtime.hpp):
//   1. TransferEngine::stream_wait() waits on the device (waits_on_device()), and is refused
//      into a stream being captured, with nothing enqueued and the capture still valid;
//   2. TransferBatch::stream: the compute -> copy event is recorded on the batch's stream,
//      validated as CudaEngineOptions::compute_stream is;
//   3. TransferBatch::after: the copy stream waits on the done events of the pending tickets
//      before the first slice; a failed one fails the batch, a released one is skipped, an id
//      never issued is kInvalidArgument;
//   4. device-to-device snapshot copies: one slot copy kernel launch per snapshot with the
//      Qwen3-Next layout (instead of ~1,200 copies), the kernel's runs (the code the fake
//      executes) equal to the DMA plan's, and no host synchronization on the caller's thread
//      in submit() and stream_wait().
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_engine_internal.hpp"
#include "cuda_fake_runtime.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"

namespace radixtier::cuda {
namespace {

using testing::FakeRuntime;
using testing::Fixture;
using testing::kPage;
using testing::Op;
using testing::scattered;

constexpr std::uintptr_t kSlotBase = testing::kGpuBase + (std::size_t{1} << 20);
constexpr std::size_t kSnapBytes = 3 * kPage;  // 3 slot pieces per snapshot

/// The fixture's pools with 4 snapshot slots of 3 pages (one contiguous segment each).
CudaPools pools_with_slots(Fixture& f) {
  CudaPools p = f.pools();
  p.gpu_snapshots = contiguous_items(kSlotBase, kSnapBytes, 4);
  return p;
}

std::unique_ptr<CudaTransferEngine> make(Fixture& f, CudaEngineOptions o) {
  auto e = f.create(pools_with_slots(f), std::move(o));
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

TransferBatch slot_to_pages(std::uint32_t slot, std::uint32_t first_page) {
  TransferBatch b;
  b.direction = Direction::kDeviceToDevice;
  for (std::uint32_t k = 0; k < 3; ++k)
    b.slot_pieces.push_back({GpuSlotId(slot), k * kPage, GpuPageId(first_page + k), false});
  return b;
}

std::vector<Op> ops_on(FakeRuntime& rt, cudaStream_t s) {
  auto lock = rt.lock();
  std::vector<Op> out;
  for (const Op& op : rt.ops)
    if (op.stream == s) out.push_back(op);
  return out;
}

/// The event of the last record on stream `s`.
cudaEvent_t last_record_on(FakeRuntime& rt, cudaStream_t s) {
  auto lock = rt.lock();
  for (auto it = rt.event_records.rbegin(); it != rt.event_records.rend(); ++it)
    if (it->second == s) return it->first;
  return nullptr;
}

// --- 1. stream_wait through the interface, refused into a captured stream ------------------

TEST(CudaServer, StreamWaitIntoACapturedStreamIsRefusedAndTheCaptureStaysValid) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  TransferEngine& te = *engine;
  EXPECT_TRUE(te.waits_on_device());
  auto t = engine->submit(scattered(Direction::kHostToDevice, 3));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const cudaEvent_t done = last_record_on(f.rt, engine->stream(Direction::kHostToDevice));
  ASSERT_NE(done, nullptr);

  // The server captures its decode graph on a side stream (global mode, as torch.cuda.graph).
  const cudaStream_t graph = f.rt.make_stream(cudaStreamNonBlocking, 0);
  f.rt.begin_capture(graph, cudaStreamCaptureModeGlobal);
  const std::size_t ops_before = f.rt.ops.size();
  for (std::optional<std::uint32_t> layer : {std::optional<std::uint32_t>(), std::optional(0u)}) {
    const Status s = te.stream_wait(t->id(), graph, layer);
    EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition) << s.to_string();
    EXPECT_NE(s.message().find("being captured"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("invalidate the graph"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("eager"), std::string::npos) << s.message();
  }
  EXPECT_EQ(engine->stream_wait(t->id(), graph).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(engine->stream_wait_layer(t->id(), 0, graph).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.rt.ops.size(), ops_before);  // nothing enqueued anywhere
  EXPECT_EQ(f.rt.capture_violations, 0);
  int nodes = -1;
  EXPECT_EQ(f.rt.end_capture(graph, &nodes), cudaSuccess);  // still valid
  EXPECT_EQ(nodes, 0);
  EXPECT_EQ(engine->stats().refused_stream_waits, 4u);
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);

  // Outside the capture the same call waits on the device: one cudaStreamWaitEvent on the
  // ticket's event, no host wait.
  const int syncs = f.rt.host_syncs_here();
  ASSERT_TRUE(te.stream_wait(t->id(), graph, std::nullopt).is_ok());
  auto on_graph = ops_on(f.rt, graph);
  ASSERT_EQ(on_graph.size(), 1u);
  EXPECT_EQ(on_graph[0].kind, Op::kWait);
  EXPECT_EQ(on_graph[0].event, done);
  // nullptr through the interface is the engine's default stream (the compute stream here).
  ASSERT_TRUE(te.stream_wait(t->id(), nullptr, std::nullopt).is_ok());
  auto on_compute = ops_on(f.rt, f.rt.compute());
  ASSERT_FALSE(on_compute.empty());
  EXPECT_EQ(on_compute.back().kind, Op::kWait);
  EXPECT_EQ(on_compute.back().event, done);
  EXPECT_EQ(f.rt.host_syncs_here(), syncs);
  // A layer the layout does not have and the per-thread stream are refused as before.
  EXPECT_EQ(te.stream_wait(t->id(), cudaStreamPerThread, std::nullopt).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(te.stream_wait(TicketId(999), graph, std::nullopt).code(), ErrorCode::kNotFound);
}

TEST(CudaServer, StreamWaitOnTheLegacyStreamWhileABlockingStreamIsCaptured) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  auto t = engine->submit(scattered(Direction::kHostToDevice, 2));
  ASSERT_TRUE(t.is_ok());
  const cudaStream_t blocking = f.rt.make_stream(cudaStreamDefault, 0);
  f.rt.begin_capture(blocking, cudaStreamCaptureModeGlobal);
  const std::size_t ops_before = f.rt.ops.size();
  const Status s = engine->stream_wait(t->id(), nullptr);  // the legacy stream
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition) << s.to_string();
  EXPECT_NE(s.message().find("legacy"), std::string::npos) << s.message();
  EXPECT_EQ(f.rt.ops.size(), ops_before);
  EXPECT_EQ(f.rt.end_capture(blocking, nullptr), cudaSuccess);  // not invalidated
  EXPECT_EQ(f.rt.peek_at_last_error(), cudaSuccess);
}

// --- 2. the caller's stream per submission ---------------------------------------------------

TEST(CudaServer, TheBatchStreamOrdersTheCopyInsteadOfTheComputeStream) {
  for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
    SCOPED_TRACE("slices in flight " + std::to_string(in_flight));
    Fixture f;
    CudaEngineOptions o = f.options();
    o.slices_in_flight = in_flight;
    auto engine = make(f, o);
    ASSERT_NE(engine, nullptr);
    const cudaStream_t mine = f.rt.make_stream(cudaStreamNonBlocking, 0);
    for (Direction dir :
         {Direction::kDeviceToHost, Direction::kHostToDevice, Direction::kDeviceToDevice}) {
      SCOPED_TRACE(to_string(dir));
      TransferBatch b =
          dir == Direction::kDeviceToDevice ? slot_to_pages(1, 10) : scattered(dir, 3);
      b.stream = mine;
      const std::size_t before = f.rt.event_records.size();
      auto t = engine->submit(std::move(b));
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      ASSERT_TRUE(engine->stream_wait(t->id(), mine).is_ok());  // everything enqueued now
      cudaEvent_t ready = nullptr;
      {
        auto lock = f.rt.lock();
        ASSERT_GT(f.rt.event_records.size(), before);
        ready = f.rt.event_records[before].first;
        EXPECT_EQ(f.rt.event_records[before].second, mine);  // on the batch's stream
        for (std::size_t i = before; i < f.rt.event_records.size(); ++i)
          EXPECT_NE(f.rt.event_records[i].second, f.rt.compute()) << "a record on the default";
      }
      // The copy stream waits on that event before its first copy.
      const auto copy_ops = ops_on(f.rt, engine->stream(dir));
      ASSERT_FALSE(copy_ops.empty());
      auto wait = std::find_if(copy_ops.begin(), copy_ops.end(),
                               [&](const Op& op) { return op.kind == Op::kWait; });
      ASSERT_NE(wait, copy_ops.end());
      EXPECT_EQ(wait->event, ready);
      auto first_copy = std::find_if(copy_ops.begin(), copy_ops.end(), [](const Op& op) {
        return op.kind == Op::kCopy || op.kind == Op::kLaunch;
      });
      EXPECT_LT(wait - copy_ops.begin(), first_copy - copy_ops.begin());
    }
    // Without a batch stream: the default compute stream, as before.
    const std::size_t before = f.rt.event_records.size();
    auto t = engine->submit(scattered(Direction::kDeviceToHost, 2));
    ASSERT_TRUE(t.is_ok());
    auto lock = f.rt.lock();
    ASSERT_GT(f.rt.event_records.size(), before);
    EXPECT_EQ(f.rt.event_records[before].second, f.rt.compute());
  }
}

TEST(CudaServer, TheBatchStreamIsValidatedAsTheComputeStreamIs) {
  Fixture f;
  auto engine = f.engine(f.options());
  ASSERT_NE(engine, nullptr);
  auto with = [&](void* stream) {
    TransferBatch b = scattered(Direction::kDeviceToHost, 2);
    b.stream = stream;
    return engine->submit(std::move(b));
  };
  auto per_thread = with(cudaStreamPerThread);
  ASSERT_FALSE(per_thread.is_ok());
  EXPECT_EQ(per_thread.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(per_thread.status().message().find("TransferBatch.stream"), std::string::npos);
  auto not_a_stream = with(reinterpret_cast<void*>(0xBAD000));
  ASSERT_FALSE(not_a_stream.is_ok());
  EXPECT_EQ(not_a_stream.status().code(), ErrorCode::kInvalidArgument);
  auto other_device = with(f.rt.make_stream(cudaStreamNonBlocking, 1));
  ASSERT_FALSE(other_device.is_ok());
  EXPECT_EQ(other_device.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(other_device.status().message().find("device 1"), std::string::npos);
  // A batch stream being captured: refused, nothing enqueued, the capture valid.
  const cudaStream_t captured = f.rt.make_stream(cudaStreamNonBlocking, 0);
  f.rt.begin_capture(captured, cudaStreamCaptureModeGlobal);
  auto in_capture = with(captured);
  ASSERT_FALSE(in_capture.is_ok());
  EXPECT_EQ(in_capture.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(in_capture.status().message().find("TransferBatch.stream is being captured"),
            std::string::npos)
      << in_capture.status().message();
  int nodes = -1;
  EXPECT_EQ(f.rt.end_capture(captured, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0);
  EXPECT_TRUE(f.rt.ops.empty());
  EXPECT_EQ(engine->stats().batches, 0u);
  EXPECT_EQ(engine->stats().refused_captures, 1u);
  // cudaStreamLegacy names the legacy stream explicitly.
  auto legacy = with(cudaStreamLegacy);
  ASSERT_TRUE(legacy.is_ok()) << legacy.status().to_string();
  ASSERT_FALSE(f.rt.event_records.empty());
  EXPECT_EQ(f.rt.event_records.front().second, cudaStreamLegacy);
  (void)f.rt.get_last_error();
}

// --- 3. after ------------------------------------------------------------------------------

TEST(CudaServer, AfterMakesTheCopyStreamWaitOnThePendingTickets) {
  for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
    SCOPED_TRACE("slices in flight " + std::to_string(in_flight));
    Fixture f;
    CudaEngineOptions o = f.options();
    o.slices_in_flight = in_flight;
    auto engine = make(f, o);
    ASSERT_NE(engine, nullptr);
    // A promotion (pending: its events never complete here) and a released, done ticket.
    auto promo = engine->submit(scattered(Direction::kHostToDevice, 12));
    ASSERT_TRUE(promo.is_ok());
    TicketId gone;
    {
      auto t = engine->submit(scattered(Direction::kDeviceToHost, 1));
      ASSERT_TRUE(t.is_ok());
      gone = t->id();
      f.rt.query_result = cudaSuccess;
      ASSERT_EQ(t->wait(), TransferState::kDone);
      f.rt.query_result = cudaErrorNotReady;
    }  // released
    TransferBatch b = slot_to_pages(2, 40);
    b.after = {promo->id(), gone};
    auto copy = engine->submit(std::move(b));
    ASSERT_TRUE(copy.is_ok()) << copy.status().to_string();
    ASSERT_TRUE(engine->stream_wait(copy->id(), f.rt.compute()).is_ok());
    // The promotion's done event (the one its wait() synchronizes on) was recorded (its rest
    // enqueued for it) before the D2D stream waited on it, and that wait comes before the D2D
    // stream's first launch.
    cudaEvent_t promo_done = nullptr;
    f.rt.on_sync = [&](cudaEvent_t e) { promo_done = e; };
    f.rt.query_result = f.rt.sync_result = cudaSuccess;
    EXPECT_EQ(promo->wait(), TransferState::kDone);
    f.rt.on_sync = nullptr;
    ASSERT_NE(promo_done, nullptr);
    std::size_t record_at = 0, wait_at = 0, launch_at = 0;
    {
      auto lock = f.rt.lock();
      for (std::size_t i = 0; i < f.rt.ops.size(); ++i) {
        const Op& op = f.rt.ops[i];
        if (op.kind == Op::kRecord && op.event == promo_done && record_at == 0) record_at = i + 1;
        if (op.kind == Op::kWait && op.event == promo_done &&
            op.stream == engine->stream(Direction::kDeviceToDevice))
          wait_at = i + 1;
        if (op.kind == Op::kLaunch && op.stream == engine->stream(Direction::kDeviceToDevice) &&
            launch_at == 0)
          launch_at = i + 1;
      }
    }
    EXPECT_GT(record_at, 0u);
    EXPECT_GT(wait_at, record_at);
    EXPECT_GT(launch_at, wait_at);
    EXPECT_EQ(engine->stats().after_waits, 1u);  // the released ticket was skipped
    EXPECT_EQ(copy->wait(), TransferState::kDone);
  }
}

TEST(CudaServer, AfterRefusesAnIdNeverIssuedWithNothingEnqueued) {
  Fixture f;
  auto engine = make(f, f.options());
  ASSERT_NE(engine, nullptr);
  auto first = engine->submit(scattered(Direction::kDeviceToHost, 1));
  ASSERT_TRUE(first.is_ok());
  const std::size_t ops_before = f.rt.ops.size();
  for (TicketId bad : {TicketId(), TicketId(first->id().value() + 5)}) {
    TransferBatch b = slot_to_pages(0, 3);
    b.after = {first->id(), bad};
    auto t = engine->submit(std::move(b));
    ASSERT_FALSE(t.is_ok());
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument) << t.status().to_string();
    EXPECT_NE(t.status().message().find("never issued"), std::string::npos);
  }
  EXPECT_EQ(f.rt.ops.size(), ops_before);
  EXPECT_EQ(engine->stats().batches, 1u);
  EXPECT_EQ(engine->stream(Direction::kDeviceToDevice), nullptr);  // not even opened
}

TEST(CudaServer, AFailedAfterTicketFailsTheBatch) {
  Fixture f;
  auto engine = make(f, f.options());
  ASSERT_NE(engine, nullptr);
  // Known failed at submit: the batch fails at once, nothing enqueued.
  engine->inject_error_on_next_submit(0);
  auto bad = engine->submit(scattered(Direction::kHostToDevice, 2));
  ASSERT_TRUE(bad.is_ok());
  f.rt.query_result = cudaSuccess;
  ASSERT_EQ(bad->wait(), TransferState::kFailed);
  f.rt.query_result = cudaErrorNotReady;
  const std::size_t ops_before = f.rt.ops.size();
  TransferBatch b = slot_to_pages(0, 3);
  b.after = {bad->id()};
  auto t = engine->submit(std::move(b));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->poll(), TransferState::kFailed);
  EXPECT_EQ(f.rt.ops.size(), ops_before);

  // Failing later on the device (an asynchronous error in the promotion's event): the batch
  // that ran after it ends failed too, whether the promotion was polled first or not.
  for (bool release_first : {false, true}) {
    SCOPED_TRACE(release_first ? "promotion released first" : "promotion never polled");
    auto promo = engine->submit(scattered(Direction::kHostToDevice, 2));
    ASSERT_TRUE(promo.is_ok());
    const cudaEvent_t promo_done = last_record_on(f.rt, engine->stream(Direction::kHostToDevice));
    TransferBatch after = slot_to_pages(1, 20);
    after.after = {promo->id()};
    auto copy = engine->submit(std::move(after));
    ASSERT_TRUE(copy.is_ok());
    f.rt.event_results[promo_done] = cudaErrorInvalidValue;  // reported by the event
    f.rt.query_result = cudaSuccess;
    if (release_first) {
      EXPECT_EQ(promo->wait(), TransferState::kFailed);
      promo->reset();
    }
    EXPECT_EQ(copy->poll(), TransferState::kFailed);
    EXPECT_NE(engine->stats().last_error.find("TransferBatch.after"), std::string::npos);
    if (!release_first) {
      EXPECT_EQ(promo->poll(), TransferState::kFailed);
    }
    f.rt.event_results.clear();
    f.rt.query_result = cudaErrorNotReady;
    (void)f.rt.get_last_error();
  }
}

// --- 4. device-to-device snapshot copies: one launch, no host wait --------------------------

/// The Qwen3-Next layouts on the fake (addresses only): 64 layer-first KV pages (24 chunks of
/// 64 KiB) and 2 layer-first snapshot slots (36 x conv 49,152 B + recurrent 2 MiB).
struct QwenRig {
  static constexpr std::uint32_t kPages = 64, kSlots = 2;
  Fixture f;
  KvGeometry kv = KvGeometry::qwen3_next();
  GdnGeometry gdn = GdnGeometry::qwen3_next();
  CudaPools pools;
  QwenRig() {
    const std::uintptr_t base = Fixture::gpu_base(0);
    pools.gpu_kv = kv_layer_first(base, kv, kPages);
    pools.gpu_snapshots = snapshot_layer_first(base + (std::size_t{128} << 20),
                                               base + (std::size_t{256} << 20), gdn, kSlots);
  }
  std::size_t pieces_per_snapshot() const {
    return (gdn.snapshot_bytes() + kv.page_bytes() - 1) / kv.page_bytes();
  }
  TransferBatch snapshot(std::uint32_t slot, bool to_slot) const {
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    for (std::size_t k = 0; k < pieces_per_snapshot(); ++k)
      b.slot_pieces.push_back({GpuSlotId(slot), k * kv.page_bytes(),
                               GpuPageId(static_cast<std::uint32_t>(k + 7)), to_slot});
    return b;
  }
};

TEST(CudaServer, QwenSnapshotCopyIsOneKernelLaunchAndNoHostWaitOnTheCaller) {
  for (std::size_t in_flight : {std::size_t{0}, std::size_t{2}}) {
    SCOPED_TRACE("slices in flight " + std::to_string(in_flight));
    QwenRig q;
    ASSERT_EQ(q.pieces_per_snapshot(), 50u);
    CudaEngineOptions o = q.f.options(128);
    o.slices_in_flight = in_flight;
    o.d2d = CopyMethod::kAuto;
    auto e = q.f.create(q.pools, o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    auto& engine = *e;
    TransferEngine& te = *engine;
    const cudaStream_t model = q.f.rt.make_stream(cudaStreamNonBlocking, 0);
    const int syncs = q.f.rt.host_syncs_here();  // create() uploaded its tables: not counted
    std::vector<Ticket> tickets;
    // Resume a snapshot into slot 1 (the admission) and materialize slot 0 (the insert), each
    // ordered after the model's stream, the model's stream waiting on each.
    for (bool to_slot : {true, false}) {
      TransferBatch b = q.snapshot(to_slot ? 1 : 0, to_slot);
      b.stream = model;
      auto t = engine->submit(std::move(b));
      ASSERT_TRUE(t.is_ok()) << t.status().to_string();
      ASSERT_TRUE(te.stream_wait(t->id(), model, std::nullopt).is_ok());
      EXPECT_EQ(t->poll(), TransferState::kPending);  // nobody waited for it
      tickets.push_back(std::move(*t));
    }
    EXPECT_EQ(q.f.rt.host_syncs_here(), syncs) << "a host wait on the scheduler's thread";
    {
      auto lock = q.f.rt.lock();
      EXPECT_EQ(q.f.rt.slot_launches, 2);  // one per snapshot
      EXPECT_EQ(q.f.rt.slot_launch_pieces, (std::vector<std::uint32_t>{50, 50}));
      EXPECT_EQ(q.f.rt.async_calls + q.f.rt.batch_calls, 0);
    }
    const CudaEngineStats s = engine->stats();
    EXPECT_EQ(s.d2d_launches, 2u);
    EXPECT_EQ(s.bytes_d2d, 2 * q.gdn.snapshot_bytes());
    q.f.rt.query_result = cudaSuccess;
    tickets.clear();  // a ticket's destructor waits on the host: after the count
  }
}

// Issue 33 item 2 through the cache: an insert that materializes a Qwen3-Next snapshot and the
// next admission that resumes from it (its live slot filled after the materialization, which
// has not landed) submit their device copies, one kernel launch each, and the model's stream
// waits for them; the scheduler's thread never synchronizes with the GPU.
TEST(CudaServer, ACacheInsertAndAResumeMakeNoHostWaitOnTheSchedulersThread) {
  QwenRig q;
  CudaEngineOptions o = q.f.options(128);
  o.d2d = CopyMethod::kAuto;
  auto e = q.f.create(q.pools, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  CacheConfig c;
  c.page_size = 16;
  c.page_bytes = q.kv.page_bytes();
  c.snapshot_bytes = q.gdn.snapshot_bytes();
  c.gpu_pages = QwenRig::kPages;
  c.gpu_snapshot_slots = QwenRig::kSlots;
  c.host_pages = 0;
  c.host_snapshot_slots = 0;
  auto cache = PrefixCache::create(c, **e);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  PrefixCache& pc = **cache;
  const cudaStream_t model = q.f.rt.make_stream(cudaStreamNonBlocking, 0);
  RequestOptions ro;
  ro.stream = model;
  std::vector<Token> prompt(2 * 16 + 1);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = Token(i + 1);
  const int syncs = q.f.rt.host_syncs_here();

  auto first = pc.admit(prompt, ro);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto pages = pc.alloc_pages(first->lock, 2);
  auto slot = pc.alloc_snapshot_slot(first->lock);
  ASSERT_TRUE(pages.is_ok() && slot.is_ok());
  auto ins = pc.insert(first->lock, std::span(prompt).first(32), *pages, *slot);
  ASSERT_TRUE(ins.is_ok()) << ins.status().to_string();
  EXPECT_TRUE(ins->snapshot_taken);
  ASSERT_TRUE(pc.release(first->lock).is_ok());

  auto second = pc.admit(prompt, ro);  // resumes at 32 from the snapshot still arriving
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_EQ(second->cached_tokens, 32u);
  EXPECT_TRUE(pc.stream_wait(second->lock, model).is_ok());
  EXPECT_TRUE(pc.path_snapshot(second->lock).is_ok());  // usable on `model` from here

  EXPECT_EQ(q.f.rt.host_syncs_here(), syncs) << "a host wait on the scheduler's thread";
  EXPECT_EQ(pc.stats().host_waits, 0u);
  {
    auto lock = q.f.rt.lock();
    EXPECT_EQ(q.f.rt.slot_launches, 2);  // the materialization and the fill, one launch each
  }
  EXPECT_EQ(pc.check_invariants(), "");
  q.f.rt.query_result = cudaSuccess;  // the copies land
  EXPECT_EQ(*pc.poll(second->lock), TransferState::kDone);
  ASSERT_TRUE(pc.release(second->lock).is_ok());
  pc.drain();
  EXPECT_EQ(pc.check_invariants(), "");
}

TEST(CudaServer, QwenSnapshotByDmaIsOverAThousandRuns) {
  // What the kernel replaces: the same snapshot as runs, one copy each.
  QwenRig q;
  CudaEngineOptions o = q.f.options(128);
  o.d2d = CopyMethod::kDmaBatch;
  auto e = q.f.create(q.pools, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  auto t = (*e)->submit(q.snapshot(0, false));
  ASSERT_TRUE(t.is_ok());
  const CudaEngineStats s = (*e)->stats();
  EXPECT_EQ(s.d2d_launches, 0u);
  EXPECT_EQ(s.d2d_dma_runs, 1233u);  // the boundaries of 72 slot segments and 50 x 24 chunks
  std::size_t bytes = 0;
  for (const testing::Copy& c : q.f.rt.copies) bytes += c.bytes;
  EXPECT_EQ(bytes, q.gdn.snapshot_bytes());
}

// The kernel's runs (for_each_slot_run over every (piece, page segment) unit, from the tables
// create() uploads) cover exactly the bytes of the DMA plan (plan_slot_runs): the same
// (destination, source) byte pairs, in both directions, for the Qwen3-Next layouts and for a
// layout whose slot and page segments cut each other everywhere.
TEST(CudaServer, KernelRunsCoverExactlyTheDmaPlansBytes) {
  struct Layouts {
    std::string name;
    DeviceLayout pages, slots;
  };
  std::vector<Layouts> cases;
  {
    QwenRig q;
    cases.push_back({"qwen3-next", q.pools.gpu_kv, q.pools.gpu_snapshots});
  }
  cases.push_back(
      {"small", kv_layer_first(0x100000, KvGeometry{2, 2, 1, 4, 2}, 16),
       snapshot_layer_first(0x200000, 0x300000, GdnGeometry{2, 1, 1, 4, 4, 3, 4, 2}, 3)});
  using Run = std::tuple<std::uintptr_t, std::uintptr_t, std::size_t>;  // dst, src, bytes
  // Sorted by destination, runs continuing on both sides merged: one canonical form.
  auto canonical = [](std::vector<Run> runs) {
    std::sort(runs.begin(), runs.end());
    std::vector<Run> out;
    for (const Run& r : runs) {
      if (!out.empty()) {
        auto& [d, s, n] = out.back();
        if (d + n == std::get<0>(r) && s + n == std::get<1>(r)) {
          n += std::get<2>(r);
          continue;
        }
      }
      out.push_back(r);
    }
    return out;
  };
  for (const Layouts& c : cases) {
    SCOPED_TRACE(c.name);
    const std::size_t page_bytes = c.pages.item_bytes(), snap_bytes = c.slots.item_bytes();
    const std::vector<detail::DeviceSegment> page_table = detail::segment_table(c.pages);
    const std::vector<detail::DeviceSegment> slot_table = detail::segment_table(c.slots);
    for (bool to_slot : {false, true}) {
      std::vector<SlotPieceCopy> pieces;
      for (std::size_t off = 0, k = 0; off < snap_bytes; off += page_bytes, ++k)
        pieces.push_back(
            {GpuSlotId(1), off, GpuPageId(static_cast<std::uint32_t>(3 * k + 2)), to_slot});
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<std::size_t> sizes;
      detail::plan_slot_runs(c.slots, c.pages, page_bytes, snap_bytes, pieces, dsts, srcs, sizes);
      std::vector<Run> dma, kernel;
      std::size_t dma_bytes = 0, kernel_bytes = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        dma.emplace_back(reinterpret_cast<std::uintptr_t>(dsts[i]),
                         reinterpret_cast<std::uintptr_t>(srcs[i]), sizes[i]);
        dma_bytes += sizes[i];
      }
      for (const SlotPieceCopy& p : pieces) {
        const std::size_t n = piece_bytes(p, page_bytes, snap_bytes);
        for (const detail::DeviceSegment& pseg : page_table)
          detail::for_each_slot_run(
              pseg, slot_table.data(), static_cast<int>(slot_table.size()), n, p.offset,
              p.slot.value(), p.page.value(), p.to_slot,
              [&](unsigned char* dst, const unsigned char* src, unsigned long long bytes) {
                kernel.emplace_back(reinterpret_cast<std::uintptr_t>(dst),
                                    reinterpret_cast<std::uintptr_t>(src), bytes);
                kernel_bytes += bytes;
              });
      }
      EXPECT_EQ(dma_bytes, snap_bytes);
      EXPECT_EQ(kernel_bytes, snap_bytes);  // no byte twice, none missed
      EXPECT_EQ(canonical(kernel), canonical(dma));
    }
  }
}

TEST(CudaServer, TheSlotKernelsGridIsAnOption) {
  QwenRig q;
  CudaEngineOptions o = q.f.options(128);
  o.d2d_kernel_blocks = -1;
  auto bad = q.f.create(q.pools, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("d2d_kernel_blocks"), std::string::npos);
  o.d2d_kernel_blocks = 7;
  auto e = q.f.create(q.pools, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  auto t = (*e)->submit(q.snapshot(1, true));
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(q.f.rt.slot_launch_blocks, std::vector<int>{7});
  q.f.rt.query_result = cudaSuccess;
}

TEST(CudaServer, NoKernelImageSendsDeviceCopiesByDmaForGood) {
  QwenRig q;
  q.f.rt.launch_result = cudaErrorNoKernelImageForDevice;
  CudaEngineOptions o = q.f.options(128);
  o.d2d = CopyMethod::kAuto;
  auto e = q.f.create(q.pools, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  for (int i = 0; i < 2; ++i) {
    auto t = (*e)->submit(q.snapshot(0, false));
    ASSERT_TRUE(t.is_ok());
    q.f.rt.query_result = cudaSuccess;
    EXPECT_EQ(t->wait(), TransferState::kDone);  // redone by DMA: the ticket did not fail
    q.f.rt.query_result = cudaErrorNotReady;
  }
  const CudaEngineStats s = (*e)->stats();
  EXPECT_TRUE(s.kernel_fallback);
  EXPECT_NE(s.kernel_fallback_reason.find("slot copy"), std::string::npos);
  EXPECT_EQ(q.f.rt.slot_launches, 1);  // tried once, then DMA for good
  EXPECT_EQ(q.f.rt.batch_calls, 2);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(q.f.log_lines(), 1u);
  (void)q.f.rt.get_last_error();
}

}  // namespace
}  // namespace radixtier::cuda
