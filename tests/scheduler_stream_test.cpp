// The reference scheduler over a cache whose engine orders streams on the device (issue 33): a
// resumed request's forward starts right after admit, its stream waiting for the promotion
// layer by layer and for the copy into its live slot; the scheduler thread performs no host
// wait for a promotion or a device copy, and results stay bit-identical to recompute.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "demo/scenarios.hpp"
#include "demo/shared_run.hpp"
#include "model/model_executor.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier {
namespace {

/// What the scheduler thread asked of the engine and the executor, in order.
struct Event {
  enum Kind { kStreamWait, kHostWait, kForward } kind;
  Direction direction = Direction::kHostToDevice;  ///< of the ticket waited for
  std::optional<std::uint32_t> layer;              ///< kStreamWait
  void* stream = nullptr;                          ///< kStreamWait
};

/// A device engine stand-in: the host engine's copies, waits_on_device() true, and every
/// stream_wait / blocking wait recorded. stream_wait() returns at once, as on a GPU; the
/// "stream" is the executor's work on this CPU, which runs the recorded waits first
/// (run_stream(), what the device does before the forward's kernels), never through wait().
class RecordingEngine final : public TransferEngine {
 public:
  RecordingEngine(HostTransferEngine& inner, std::vector<Event>& log) : inner_(inner), log_(log) {}

  Result<Ticket> submit(TransferBatch batch) override {
    const Direction dir = batch.direction;
    void* stream = batch.stream;
    const bool hold = dir == Direction::kHostToDevice && hold_next_promotion;
    if (hold) {
      // Still in flight when admit returns (a copy of 12 pages takes a while on a GPU).
      hold_next_promotion = false;
      inner_.delay_nth_submission(0);
      if (fail_it) inner_.fail_nth_submission(0);
    }
    Result<Ticket> t = inner_.submit(std::move(batch));
    if (!t) return t.status();
    const TicketId id = t->id();
    std::lock_guard lock(mu_);
    if (hold) held_.push_back(id);
    tickets_.emplace(id, Held{std::move(*t), dir, stream});
    submitted_.emplace_back(dir, stream);
    return Ticket(this, id);
  }
  TransferState poll(TicketId id) override { return inner_.poll(id); }
  TransferState wait(TicketId id) override {
    const bool blocking = inner_.poll(id) == TransferState::kPending;
    if (blocking) log_.push_back({Event::kHostWait, direction(id), std::nullopt, nullptr});
    return inner_.wait(id);
  }
  void release(TicketId id) override {
    std::lock_guard lock(mu_);
    tickets_.erase(id);  // the inner ticket: finished, so its reset does not block
  }
  std::size_t slice_pages() const override { return inner_.slice_pages(); }
  EngineCapacity capacity() const override { return inner_.capacity(); }
  HostPages* host_memory() override { return inner_.host_memory(); }
  Status stream_wait(TicketId id, StreamHandle stream,
                     std::optional<std::uint32_t> layer) override {
    log_.push_back({Event::kStreamWait, direction(id), layer, stream});
    if (inner_.poll(id) == TransferState::kFailed)
      return Status(ErrorCode::kTransferFailed, "stream_wait: the copy failed");
    std::lock_guard lock(mu_);
    on_stream_.push_back(id);
    return Status::ok();
  }
  /// The device executing the stream's waits, before the work queued after them.
  void run_stream() {
    std::vector<TicketId> ids;
    {
      std::lock_guard lock(mu_);
      ids.swap(on_stream_);
    }
    std::vector<TicketId> held;
    {
      std::lock_guard lock(mu_);
      held.swap(held_);
    }
    for (TicketId id : held) inner_.resume(id);
    for (TicketId id : ids) (void)inner_.wait(id);  // released already: landed
  }
  bool waits_on_device() const override { return true; }

  /// The direction and the stream of each submitted batch.
  std::vector<std::pair<Direction, void*>> submitted() const {
    std::lock_guard lock(mu_);
    return submitted_;
  }
  bool hold_next_promotion = false;
  bool fail_it = false;

 private:
  struct Held {
    Ticket ticket;
    Direction direction;
    void* stream;
  };
  Direction direction(TicketId id) {
    std::lock_guard lock(mu_);
    auto it = tickets_.find(id);
    return it == tickets_.end() ? Direction::kDeviceToHost : it->second.direction;
  }
  HostTransferEngine& inner_;
  std::vector<Event>& log_;
  mutable std::mutex mu_;
  std::map<TicketId, Held> tickets_;
  std::vector<std::pair<Direction, void*>> submitted_;
  std::vector<TicketId> on_stream_;
  std::vector<TicketId> held_;
};

/// The model executor, with every forward recorded in the same log.
/// Its work runs on the engine's "stream": after the waits queued on it.
class RecordingExecutor final : public sched::Executor {
 public:
  RecordingExecutor(sched::Executor& inner, RecordingEngine& stream, std::vector<Event>& log)
      : inner_(inner), stream_(stream), log_(log) {}
  std::size_t state_bytes() const override { return inner_.state_bytes(); }
  Status begin(sched::RequestId r, std::optional<GpuSlotId> restore) override {
    stream_.run_stream();  // the restore reads the live slot on the stream
    return inner_.begin(r, restore);
  }
  Result<double> forward(sched::RequestId r, std::span<const Token> tokens, std::size_t pos,
                         std::span<const GpuPageId> table) override {
    log_.push_back({Event::kForward, Direction::kDeviceToDevice, std::nullopt, nullptr});
    stream_.run_stream();
    return inner_.forward(r, tokens, pos, table);
  }
  std::span<const float> last_logits(sched::RequestId r) const override {
    return inner_.last_logits(r);
  }
  Result<Token> next_token(sched::RequestId r) override { return inner_.next_token(r); }
  Status save_snapshot(sched::RequestId r, GpuSlotId s) override {
    return inner_.save_snapshot(r, s);
  }
  Status checkpoint(sched::RequestId r) override { return inner_.checkpoint(r); }
  Status save_checkpoint(sched::RequestId r, GpuSlotId s) override {
    return inner_.save_checkpoint(r, s);
  }
  void end(sched::RequestId r) override { inner_.end(r); }

 private:
  sched::Executor& inner_;
  RecordingEngine& stream_;
  std::vector<Event>& log_;
};

model::TinyModelConfig model_config() {
  model::TinyModelConfig m;
  m.vocab = 61;
  m.d_model = 16;
  m.layers = "GAGA";
  m.heads = 2;
  m.head_dim = 8;
  m.kv_heads = 1;
  m.mlp_dim = 32;
  m.page_size = 8;
  return m;
}

std::vector<Token> tokens(std::uint64_t seed, std::size_t n) {
  std::vector<Token> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = Token((seed * 7919 + i * 31) % 61);
  return out;
}

TEST(SchedulerStreamWait, ForwardStartsAfterAdmitWithoutAHostWaitForPromotionsOrDeviceCopies) {
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail);
    const model::TinyHybridModel m(model_config());
    demo::Workload w;
    w.name = "stream";
    w.model = model_config();
    w.cache.page_size = m.page_size();
    w.cache.page_bytes = m.page_bytes();
    w.cache.snapshot_bytes = m.state_bytes();
    w.cache.gpu_pages = 40;
    w.cache.host_pages = 256;
    w.cache.gpu_snapshot_slots = 4;
    w.cache.host_snapshot_slots = 16;
    w.cache.slice_pages = 4;
    w.cache.gpu_free_low_watermark = w.cache.gpu_free_high_watermark = 0;
    w.sched.chunk_tokens = 32;
    w.sched.max_running = 1;
    w.sched.policy = sched::SnapshotPolicy::end_only();
    w.sched.check_invariants = true;
    int stream_tag = 0;
    w.sched.stream = &stream_tag;
    w.sched.forward_layers = 4;
    // A conversation whose turn 1 is pushed to host by side requests, then resumed.
    const auto turn1 = tokens(1, 96);
    std::uint64_t id = 0;
    w.requests.push_back({++id, turn1, 2});
    for (int i = 0; i < 5; ++i) w.requests.push_back({++id, tokens(10 + i, 64), 2});
    auto turn2 = turn1;
    for (Token t : tokens(3, 12)) turn2.push_back(t);
    w.requests.push_back({++id, turn2, 2});

    HostArenas memory(w.cache);
    HostTransferEngine inner(memory, w.cache.slice_pages, HostTransferEngine::Mode::kThreaded);
    std::vector<Event> log;
    RecordingEngine engine(inner, log);
    auto cache = PrefixCache::create(w.cache, engine);
    ASSERT_TRUE(cache);
    sched::ModelExecutor model_exec(m, memory, {demo::kSecondsPerToken});
    RecordingExecutor executor(model_exec, engine, log);
    sched::SchedulerConfig sc = w.sched;
    sc.kv_bytes_per_token = w.cache.page_bytes / w.cache.page_size;
    demo::RunOutcome out;
    // Side requests first (their own copies must not fail), then turn 2 alone.
    ASSERT_TRUE(demo::play(w, 0, w.requests.size() - 1, **cache, executor, sc, "cache", {}, out));
    const std::size_t before = log.size();
    const std::size_t batches_before = engine.submitted().size();
    const CacheStats mid = (*cache)->stats();
    // The promotion of turn 2 fails: the forward it started is discarded and the request
    // recomputes (rule 7), still bit-identical.
    engine.hold_next_promotion = true;
    engine.fail_it = fail;
    ASSERT_TRUE(demo::play(w, w.requests.size() - 1, w.requests.size(), **cache, executor, sc,
                           "cache", {}, out));
    for (const auto& req : w.requests) {
      auto it = out.results.find(req.id);
      ASSERT_NE(it, out.results.end());
      EXPECT_TRUE(demo::same_answer(it->second, demo::reference_run(m, req))) << req.id;
    }
    const auto& t2 = out.results.at(w.requests.back().id);
    // Turn 2 resumed from host: a promotion the forward did not wait for on the host.
    EXPECT_GT((*cache)->stats().bytes_h2d, mid.bytes_h2d);
    if (!fail) {
      EXPECT_EQ(t2.cached_tokens, 96u);
      EXPECT_EQ(t2.transfer_failures, 0u);
    } else {
      EXPECT_GE(t2.transfer_failures, 1u);
    }
    // The order on the scheduler thread: stream waits for layers 0..3 in turn (the fill, a
    // device copy, waited for whole with the first), then the forward; no host wait for a
    // promotion or a device copy.
    std::vector<std::uint32_t> layers;
    bool fill_waited = false;
    std::size_t first_forward = log.size();
    for (std::size_t i = before; i < log.size(); ++i) {
      const Event& e = log[i];
      if (e.kind == Event::kHostWait) {
        EXPECT_EQ(e.direction, Direction::kDeviceToHost)
            << "a host wait for a promotion or a device copy at event " << i;
      }
      if (e.kind == Event::kForward && first_forward == log.size()) first_forward = i;
      if (e.kind != Event::kStreamWait || first_forward != log.size()) continue;
      EXPECT_EQ(e.stream, &stream_tag);
      if (e.direction == Direction::kDeviceToDevice) {
        EXPECT_FALSE(e.layer.has_value());  // the live state: whole
        fill_waited = true;
      } else if (e.layer) {
        layers.push_back(*e.layer);
      }
    }
    ASSERT_LT(first_forward, log.size());
    EXPECT_TRUE(fill_waited) << "the copy into the live slot was not waited for on the stream";
    ASSERT_FALSE(layers.empty());
    EXPECT_EQ(layers.front(), 0u);
    EXPECT_TRUE(std::is_sorted(layers.begin(), layers.end()));
    EXPECT_EQ(layers.back(), 3u);
    // The fill comes with the first layer's wait, before any GDN layer runs (layer 0 is one).
    std::size_t fill_at = log.size(), layer0_at = log.size();
    for (std::size_t i = before; i < first_forward; ++i) {
      if (log[i].kind != Event::kStreamWait) continue;
      if (log[i].direction == Direction::kDeviceToDevice && fill_at == log.size()) fill_at = i;
      if (log[i].layer == 0u && layer0_at == log.size()) layer0_at = i;
    }
    EXPECT_LT(fill_at, first_forward);
    EXPECT_LT(layer0_at, first_forward);
    // Every promotion and device copy turn 2 made carries its stream (RequestOptions).
    const auto batches = engine.submitted();
    std::size_t carried = 0;
    for (std::size_t i = batches_before; i < batches.size(); ++i) {
      if (batches[i].first == Direction::kDeviceToHost) continue;  // the watermark's: default
      EXPECT_EQ(batches[i].second, &stream_tag) << "batch " << i;
      ++carried;
    }
    EXPECT_GT(carried, 0u);
    EXPECT_EQ((*cache)->check_invariants(), "");
  }
}

TEST(PrefixCacheStreams, EveryBatchOfARequestsCallCarriesItsStreamAndTheWatermarkTheDefault) {
  CacheConfig c;
  c.page_size = 4;
  c.gpu_pages = 16;
  c.host_pages = 64;
  c.gpu_snapshot_slots = 4;
  c.host_snapshot_slots = 8;
  c.page_bytes = 48;
  c.snapshot_bytes = 96;
  c.slice_pages = 4;
  c.gpu_free_low_watermark = c.gpu_free_high_watermark = 0;
  HostArenas memory(c);
  HostTransferEngine inner(memory, c.slice_pages, HostTransferEngine::Mode::kThreaded);
  std::vector<Event> log;
  RecordingEngine engine(inner, log);
  auto cache = PrefixCache::create(c, engine);
  ASSERT_TRUE(cache);
  int a_stream = 0, b_stream = 0;
  // A inserts 12 pages and a snapshot (its materialization carries A's stream).
  std::vector<Token> p(49);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = Token(i);
  auto a = (*cache)->admit(p, RequestOptions{kDefaultNamespace, kDefaultPriority, &a_stream});
  ASSERT_TRUE(a);
  auto pages = (*cache)->alloc_pages(a->lock, 12);
  ASSERT_TRUE(pages);
  auto slot = (*cache)->alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(slot);
  ASSERT_TRUE((*cache)->insert(a->lock, std::span(p).first(48), *pages, *slot));
  ASSERT_TRUE((*cache)->release(a->lock));
  (*cache)->drain();
  std::size_t seen = engine.submitted().size();
  ASSERT_GE(seen, 1u);
  EXPECT_EQ(engine.submitted()[0].second, &a_stream);  // the materialization
  // B's allocation needs room: the demotions made for it carry B's stream.
  std::vector<Token> q(9, Token(500));
  auto b = (*cache)->admit(q, RequestOptions{kDefaultNamespace, kDefaultPriority, &b_stream});
  ASSERT_TRUE(b);
  ASSERT_TRUE((*cache)->alloc_pages(b->lock, 8));
  auto after_b = engine.submitted();
  ASSERT_GT(after_b.size(), seen);
  for (std::size_t i = seen; i < after_b.size(); ++i) {
    EXPECT_EQ(after_b[i].first, Direction::kDeviceToHost);
    EXPECT_EQ(after_b[i].second, &b_stream) << "batch " << i;
  }
  ASSERT_TRUE((*cache)->release(b->lock));
  EXPECT_EQ((*cache)->check_invariants(), "");

  // The watermark step is no request's, even inside one's call: the engine's default stream.
  c.gpu_free_low_watermark = 0.5;
  c.gpu_free_high_watermark = 0.75;
  HostArenas memory2(c);
  HostTransferEngine inner2(memory2, c.slice_pages, HostTransferEngine::Mode::kThreaded);
  RecordingEngine engine2(inner2, log);
  auto cache2 = PrefixCache::create(c, engine2);
  ASSERT_TRUE(cache2);
  auto a2 = (*cache2)->admit(p, RequestOptions{kDefaultNamespace, kDefaultPriority, &a_stream});
  ASSERT_TRUE(a2);
  auto pages2 = (*cache2)->alloc_pages(a2->lock, 12);
  ASSERT_TRUE(pages2);
  auto slot2 = (*cache2)->alloc_snapshot_slot(a2->lock);
  ASSERT_TRUE(slot2);  // live KV (a snapshot below it): demoted ahead, not dropped
  ASSERT_TRUE((*cache2)->insert(a2->lock, std::span(p).first(48), *pages2, *slot2));
  ASSERT_TRUE((*cache2)->release(a2->lock));
  (*cache2)->poll();
  std::size_t ahead = 0;
  for (const auto& [dir, stream] : engine2.submitted()) {
    if (dir != Direction::kDeviceToHost) continue;
    EXPECT_EQ(stream, nullptr);
    ++ahead;
  }
  EXPECT_GT(ahead, 0u);
  EXPECT_GT((*cache2)->stats().background_evictions, 0u);
  (*cache2)->drain();
  EXPECT_EQ((*cache2)->check_invariants(), "");
}

}  // namespace
}  // namespace radixtier
