// Cost of the cache itself: match, admit and insert on prefixes of 1k, 32k and 1M tokens
// over trees of 1k and 100k nodes (page 64). Copies are not timed: the engine completes
// every batch at once without touching bytes.
//
//   build/default/bin/radixtier_bench --benchmark_filter='Match|Admit|Insert'
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>

#include "instant_engine.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

constexpr std::uint32_t kPage = 64;
using bench::InstantEngine;

/// A cache holding a 1M-token conversation (inserted in 2,048-token chunks, a snapshot at
/// every chunk) plus side branches of one page each that fork off its first 64k tokens at
/// every 16th page, until the tree has `nodes` nodes. The conversation's path has the same
/// shape in every tree (split at 64 fork points, each with many children), so comparing
/// trees of 1k and 100k nodes isolates the cost of tree size.
struct World {
  InstantEngine engine;
  std::unique_ptr<PrefixCache> cache;
  std::vector<Token> conversation;
  Token next_token = 1 << 24;

  explicit World(std::size_t nodes) {
    CacheConfig c;
    c.page_size = kPage;
    c.gpu_pages = 4'000'000;
    c.gpu_snapshot_slots = 400'000;
    c.page_bytes = 1;
    c.snapshot_bytes = 1;
    cache = std::move(PrefixCache::create(c, engine)).value();
    std::mt19937_64 rng(42);
    for (std::size_t i = 0; i < (1u << 20); ++i) conversation.push_back(Token(rng() % 150'000));
    serve(conversation, 2048);
    std::uniform_int_distribution<std::size_t> fork_point(1, 64);
    while (cache->occupancy().nodes < nodes) {
      // A side request: a prefix of the conversation, then one page of its own.
      std::vector<Token> side(conversation.begin(),
                              conversation.begin() + fork_point(rng) * 16 * kPage);
      for (std::uint32_t i = 0; i < kPage; ++i) side.push_back(next_token++);
      insert_tail(side);
    }
  }

  /// Inserts `tokens` (whole pages) chunk by chunk, snapshot at every chunk end.
  void serve(std::span<const Token> tokens, std::size_t chunk) {
    std::vector<Token> prompt(tokens.begin(), tokens.end());
    prompt.push_back(0);
    auto a = cache->admit(prompt).value();
    std::vector<GpuPageId> table = cache->path_pages(a.lock).value();
    for (std::size_t done = table.size() * kPage; done < tokens.size();) {
      const std::size_t n = std::min(chunk, tokens.size() - done);
      for (GpuPageId p : cache->alloc_pages(a.lock, n / kPage).value()) table.push_back(p);
      done += n;
      (void)cache->insert(a.lock, tokens.first(done), std::span(table).first(done / kPage),
                          cache->alloc_snapshot_slot(a.lock).value());
    }
    (void)cache->release(a.lock);
  }

  /// Inserts a side branch: only its last page is new (the rest is matched, not recomputed).
  void insert_tail(std::span<const Token> tokens) {
    auto a = cache->admit(tokens.first(tokens.size() - kPage + 1)).value();
    auto lock = a.lock;
    std::vector<GpuPageId> mine = cache->alloc_pages(lock, tokens.size() / kPage).value();
    auto r = cache->insert(lock, tokens, mine, std::nullopt).value();
    (void)cache->free_pages(lock, r.not_taken);
    (void)cache->release(lock);
  }
};

World& world(std::size_t nodes) {
  static std::map<std::size_t, std::unique_ptr<World>> worlds;
  auto& w = worlds[nodes];
  if (!w) w = std::make_unique<World>(nodes);
  return *w;
}

void BM_Match(benchmark::State& state) {
  World& w = world(state.range(1));
  const auto query = std::span(w.conversation).first(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(w.cache->match(query));
  state.counters["nodes"] = static_cast<double>(w.cache->occupancy().nodes);
  state.counters["usable"] = static_cast<double>(w.cache->match(query).usable_tokens);
}

void BM_AdmitRelease(benchmark::State& state) {
  World& w = world(state.range(1));
  std::vector<Token> prompt(w.conversation.begin(), w.conversation.begin() + state.range(0));
  prompt.push_back(1);
  for (auto _ : state) {
    auto a = w.cache->admit(prompt);
    benchmark::DoNotOptimize(a->cached_tokens);
    (void)w.cache->release(a->lock);
  }
}

/// Re-inserting a prefix the tree has (what every chunk of a chunked prefill does for the
/// part before it): walk, compare, hand the duplicate pages back.
void BM_InsertDuplicate(benchmark::State& state) {
  World& w = world(state.range(1));
  const std::size_t len = static_cast<std::size_t>(state.range(0));
  const auto tokens = std::span(w.conversation).first(len);
  for (auto _ : state) {
    auto a = w.cache->admit(std::span(w.conversation).first(1)).value();
    state.PauseTiming();  // the request's own pages (rule 9: they belong to its lock)
    auto pages = w.cache->alloc_pages(a.lock, len / kPage).value();
    state.ResumeTiming();
    auto r = w.cache->insert(a.lock, tokens, pages, std::nullopt);
    benchmark::DoNotOptimize(r->not_taken.size());
    (void)w.cache->release(a.lock);  // frees the duplicates it still owns
  }
}

/// Inserting a new path of `len` tokens (fresh tokens, so every page is adopted).
void BM_InsertNew(benchmark::State& state) {
  World& w = world(state.range(1));
  const std::size_t len = static_cast<std::size_t>(state.range(0));
  std::vector<Token> tokens(len);
  for (auto _ : state) {
    state.PauseTiming();
    for (Token& t : tokens) t = w.next_token++;
    auto a = w.cache->admit(std::span(tokens).first(1)).value();
    std::vector<GpuPageId> table = w.cache->alloc_pages(a.lock, len / kPage).value();
    state.ResumeTiming();
    auto r = w.cache->insert(a.lock, tokens, table, std::nullopt);
    benchmark::DoNotOptimize(r->not_taken.size());
    state.PauseTiming();
    (void)w.cache->release(a.lock);
    state.ResumeTiming();
  }
}

void Args(benchmark::internal::Benchmark* b) {
  for (long nodes : {1'000, 100'000})
    for (long len : {1'024, 32'768, 1'048'576}) b->Args({len, nodes});
  b->ArgNames({"tokens", "tree_nodes"})->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Match)->Apply(Args);
BENCHMARK(BM_AdmitRelease)->Apply(Args);
BENCHMARK(BM_InsertDuplicate)->Apply(Args);
BENCHMARK(BM_InsertNew)->Apply(Args)->Iterations(20);

}  // namespace
}  // namespace radixtier
