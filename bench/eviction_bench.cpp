// Cost of choosing and evicting one victim among N evictable candidates (issue 11, part D).
//
// The tree holds N one-page leaves, each with a GPU snapshot, every GPU page held by a node
// and no host tier: each iteration admits a fresh one-page prompt, allocates its page (the
// cache picks the lowest-priority leaf of the GPU KV order and drops it, with its snapshot),
// takes a snapshot slot, inserts and releases, so N stays constant. A quarter of the leaves
// were resumed from once more than the others, so the order is not plain insertion order.
//
//   build/default/bin/radixtier_bench --benchmark_filter=Evict
#include <benchmark/benchmark.h>

#include <map>
#include <memory>

#include "instant_engine.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

constexpr std::uint32_t kPage = 16;

struct Leaves {
  bench::InstantEngine engine;
  std::unique_ptr<PrefixCache> cache;
  Token next = 1;

  explicit Leaves(std::size_t n) {
    CacheConfig c;
    c.page_size = kPage;
    c.gpu_pages = static_cast<std::uint32_t>(n);
    c.gpu_snapshot_slots = static_cast<std::uint32_t>(n + 2);
    c.page_bytes = 1;
    c.snapshot_bytes = 1;
    cache = std::move(PrefixCache::create(c, engine)).value();
    for (std::size_t i = 0; i < n; ++i) {
      const auto prompt = add();
      if (i % 4 == 0) (void)cache->release(cache->admit(prompt).value().lock);
    }
  }

  /// One request: a fresh page + 1 token; its page and snapshot become a new leaf.
  std::vector<Token> add() {
    std::vector<Token> prompt(kPage + 1);
    for (Token& t : prompt) t = next++;
    auto a = cache->admit(prompt).value();
    auto pages = cache->alloc_pages(a.lock, 1).value();
    auto slot = cache->alloc_snapshot_slot(a.lock).value();
    (void)cache->insert(a.lock, std::span(prompt).first(kPage), pages, slot);
    (void)cache->release(a.lock);
    return prompt;
  }
};

Leaves& leaves(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<Leaves>> worlds;
  auto& w = worlds[n];
  if (!w) w = std::make_unique<Leaves>(n);
  return *w;
}

void BM_EvictOneVictim(benchmark::State& state) {
  Leaves& w = leaves(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(w.add());
  state.counters["nodes"] = static_cast<double>(w.cache->occupancy().nodes);
  state.counters["dropped"] = static_cast<double>(w.cache->stats().kv_pages_dropped_gpu);
}

BENCHMARK(BM_EvictOneVictim)
    ->ArgName("candidates")
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace radixtier
