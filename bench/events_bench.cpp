// Cost of KV events: a churning workload (every request inserts a new 2,048-token path with
// a snapshot, evicting and demoting older ones) with no sink, a counting callback, or an
// EventQueue drained by another thread. "No sink" is the cost every cache pays; compare it
// with the same loop on a build without events (docs/performance.md).
//
//   build/default/bin/radixtier_bench --benchmark_filter=Events
#include <benchmark/benchmark.h>

#include <atomic>
#include <memory>
#include <thread>

#include "instant_engine.hpp"
#include "radixtier/cache/event_queue.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

constexpr std::uint32_t kPage = 64;
constexpr std::size_t kTokens = 2048;

void BM_EventsChurn(benchmark::State& state) {
  bench::InstantEngine engine;
  CacheConfig c;
  c.page_size = kPage;
  c.gpu_pages = 1024;
  c.host_pages = 4096;
  c.gpu_snapshot_slots = 16;
  c.host_snapshot_slots = 64;
  c.page_bytes = 1;
  c.snapshot_bytes = 1;
  auto cache = std::move(PrefixCache::create(c, engine)).value();
  const int mode = static_cast<int>(state.range(0));  // 0: none, 1: callback, 2: queue
  std::uint64_t seen = 0;
  CallbackSink counting([&](const CacheEvent&) { ++seen; });
  auto queue = std::move(EventQueue::create(1 << 16)).value();
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> popped{0};
  std::thread consumer;
  if (mode == 1) cache->add_event_sink(&counting);
  if (mode == 2) {
    cache->add_event_sink(queue.get());
    consumer = std::thread([&] {
      CacheEvent e;
      while (!stop.load(std::memory_order_relaxed))
        while (queue->pop(e)) popped.fetch_add(1, std::memory_order_relaxed);
    });
  }
  Token next = 1;
  std::vector<Token> prompt(kTokens + 1);
  for (auto _ : state) {
    for (Token& t : prompt) t = next++;
    auto a = cache->admit(prompt).value();
    auto pages = cache->alloc_pages(a.lock, kTokens / kPage).value();
    auto slot = cache->alloc_snapshot_slot(a.lock).value();
    (void)cache->insert(a.lock, std::span(prompt).first(kTokens), pages, slot);
    (void)cache->release(a.lock);
  }
  stop = true;
  if (consumer.joinable()) consumer.join();
  state.counters["events"] = double(mode == 1 ? seen : popped.load() + queue->dropped());
  state.counters["dropped"] = double(queue->dropped());
  if (mode == 1) cache->remove_event_sink(&counting);
  if (mode == 2) cache->remove_event_sink(queue.get());
}

BENCHMARK(BM_EventsChurn)->ArgName("sink")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace radixtier
