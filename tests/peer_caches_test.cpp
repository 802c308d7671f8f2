// The faithful peers (issue 19): vllm-like (VllmLikeCache) and sglang-like (SGLang's placement
// rules, its GPU split and chunking), the router's balance rule and the replay's overrun flag.
#include <gtest/gtest.h>

#include <vector>

#include "radixtier/scheduler/snapshot_policy.hpp"
#include "sim/cost_model.hpp"
#include "sim/model_config.hpp"
#include "sim/router.hpp"
#include "sim/scenarios.hpp"
#include "sim/sglang_like_cache.hpp"
#include "sim/simulator.hpp"
#include "sim/vllm_like_cache.hpp"

namespace radixtier::sim {
namespace {

std::vector<Token> tokens(std::size_t n, Token base = 1) {
  std::vector<Token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + static_cast<Token>(i);
  return t;
}

TEST(VllmGeometry, Qwen3NextGetsVllmsBlockSize) {
  // bf16 state (vLLM's default): 12 attention layers x 2 KV heads x 256 x 2 B x 2 = 24,576 B
  // per token; 36 GDN layers x 1,097,728 B. vLLM: block 544, 1 attention + 3 GDN groups.
  auto g = vllm_block_geometry(12, 24'576, 36, 36ull * 1'097'728);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->block_size, 544u);
  EXPECT_EQ(g->group_size, 12u);
  EXPECT_EQ(g->kv_ids, 1u);
  EXPECT_EQ(g->state_ids, 3u);
  EXPECT_EQ(g->id_bytes, 12ull * 544 * 2'048);
  EXPECT_FALSE(vllm_block_geometry(0, 1, 1, 1).is_ok());
}

TEST(VllmLikeCache, HitsTheDeepestBlockWithAStateAndEvictsLru) {
  auto made = VllmLikeCache::create(/*blocks=*/12, /*page=*/4, /*kv=*/1, /*state=*/2);
  ASSERT_TRUE(made.is_ok());
  VllmLikeCache& c = **made;
  const auto p = tokens(17);
  auto a = c.admit(p);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->cached_tokens, 0u);
  auto pages = c.alloc_pages(a->lock, 4);
  ASSERT_TRUE(pages.is_ok());
  auto slot = c.alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(slot.is_ok());
  // A state at 8 (two pages), then the KV to 16 without one.
  auto ins = c.insert(a->lock, std::span<const Token>(p).first(8),
                      std::span<const GpuPageId>(*pages).first(2), *slot);
  ASSERT_TRUE(ins.is_ok());
  EXPECT_TRUE(ins->snapshot_taken);
  ASSERT_TRUE(c.insert(a->lock, std::span<const Token>(p).first(16), *pages, std::nullopt));
  EXPECT_EQ(c.check_invariants(), "");
  ASSERT_TRUE(c.release(a->lock));
  EXPECT_EQ(c.check_invariants(), "");
  // The same prompt: KV to 16, the deepest state at 8.
  auto b = c.admit(p);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->kv_tokens, 16u);
  EXPECT_EQ(b->cached_tokens, 8u);
  EXPECT_EQ(c.path_pages(b->lock)->size(), 2u);
  ASSERT_TRUE(c.release(b->lock));
  // Another prompt takes every block: the cached ones are evicted, state and all.
  const auto q = tokens(40, 1000);
  auto d = c.admit(q);
  ASSERT_TRUE(d.is_ok());
  ASSERT_TRUE(c.alloc_pages(d->lock, 12).is_ok());
  EXPECT_EQ(c.alloc_pages(d->lock, 1).status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(c.cached_pages(), 0u);
  EXPECT_EQ(c.cached_states(), 0u);
  EXPECT_EQ(c.check_invariants(), "");
  ASSERT_TRUE(c.release(d->lock));
  EXPECT_EQ(c.free_ids(), 12u);
}

TEST(VllmLikeCache, CpuOffloadingServesWhatTheGpuEvicted) {
  // 8 GPU block ids, a CPU tier of 100, 1,000 bytes per id.
  auto made = VllmLikeCache::create(8, 4, 1, 2, 100, 1000);
  ASSERT_TRUE(made.is_ok());
  VllmLikeCache& c = **made;
  const auto p = tokens(9);
  auto a = c.admit(p);
  ASSERT_TRUE(a.is_ok());
  auto pages = c.alloc_pages(a->lock, 2);
  auto slot = c.alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(pages.is_ok() && slot.is_ok());
  ASSERT_TRUE(c.insert(a->lock, std::span<const Token>(p).first(8), *pages, *slot));
  ASSERT_TRUE(c.release(a->lock));
  EXPECT_EQ(c.cpu_entries(), 3u);  // two pages and the state, stored as they were cached
  EXPECT_EQ(c.stats().bytes_d2h, 4u * 1000);
  // Another request takes every GPU block: the GPU copies are gone, the CPU ones stay.
  auto d = c.admit(tokens(40, 1000));
  ASSERT_TRUE(c.alloc_pages(d->lock, 8).is_ok());
  ASSERT_TRUE(c.release(d->lock));
  EXPECT_EQ(c.cached_pages(), 0u);
  const CacheStats before = c.stats();
  auto b = c.admit(p);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->cached_tokens, 8u);
  EXPECT_EQ(b->host_tokens, 8u);
  EXPECT_EQ(c.stats().bytes_h2d - before.bytes_h2d, 4u * 1000);  // 2 pages + a 2-id state
  EXPECT_EQ(c.path_pages(b->lock)->size(), 2u);
  EXPECT_TRUE(c.path_snapshot(b->lock).is_ok());
  EXPECT_EQ(c.check_invariants(), "");
  ASSERT_TRUE(c.release(b->lock));
  EXPECT_EQ(c.check_invariants(), "");
}

TEST(VllmLikeCache, RefusesWhatTheRequestDoesNotOwn) {
  auto made = VllmLikeCache::create(8, 4, 1, 2);
  ASSERT_TRUE(made.is_ok());
  VllmLikeCache& c = **made;
  auto a = c.admit(tokens(9));
  auto b = c.admit(tokens(9, 500));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto pa = c.alloc_pages(a->lock, 1);
  ASSERT_TRUE(pa.is_ok());
  EXPECT_EQ(c.free_pages(b->lock, *pa).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c.insert(b->lock, std::span<const Token>(tokens(4)), *pa, std::nullopt).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(c.release(LockId(99)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(c.check_invariants(), "");
}

TEST(VllmLike, RunsEveryScenarioWithItsInvariants) {
  const ModelGeometry m = *find_model("qwen3-next-80b");
  for (const char* name : {"churn", "flush", "agent"}) {
    auto s = make_scenario(name, m);
    ASSERT_TRUE(s.is_ok());
    SimOptions o;
    o.cache = CacheKind::kVllmLike;
    o.check_invariants = true;
    auto r = simulate(*s, o);
    ASSERT_TRUE(r.is_ok()) << name << ": " << r.status().to_string();
    EXPECT_TRUE(r->status.empty()) << name << ": " << r->status;
    EXPECT_EQ(r->failed, 0u) << name;
    o.vllm_offload = true;  // and with its CPU tier in the scenario's host bytes
    auto off = simulate(*s, o);
    ASSERT_TRUE(off.is_ok()) << name << ": " << off.status().to_string();
    EXPECT_TRUE(off->status.empty()) << name << ": " << off->status;
    EXPECT_GE(off->cached_tokens, r->cached_tokens) << name;
    EXPECT_EQ(off->eviction, "lru+cpu-offload");
    EXPECT_EQ(r->config.page_size, 1056u);  // fp32 recurrent state: 16 x cdiv(2,146,304, 32,768)
  }
}

sched::SnapshotQuery query(std::size_t boundary, std::size_t prompt) {
  sched::SnapshotQuery q;
  q.boundary = boundary;
  q.prompt_tokens = prompt;
  q.page_size = 64;
  q.chunk_tokens = 8192;
  q.last_prompt_chunk = boundary == prompt / 64 * 64;
  return q;
}

TEST(SglangPolicy, NoBufferKeepsChunkEndsAndTheFinishButNotThePromptEnd) {
  const auto p = sched::SnapshotPolicy::sglang_no_buffer();
  EXPECT_TRUE(p.keep(query(8192, 20'000)));
  EXPECT_FALSE(p.keep(query(19'968, 20'000)));  // the prompt end
  auto fin = query(20'480, 20'000);
  fin.at_finish = true;
  EXPECT_TRUE(p.keep(fin));
  EXPECT_EQ(sched::SnapshotPolicy::parse("sglang-no-buffer")->name(), "sglang-no-buffer");
}

TEST(SglangPolicy, ExtraBufferTracksTheBranchPointInsteadOfItsChunkEnd) {
  const auto p = sched::SnapshotPolicy::sglang_extra_buffer();
  auto q = query(0, 30'000);
  q.cached_tokens = 1024;
  q.branch_tokens = 5'000;  // KV match beyond the state match: 4,992 after flooring to 64
  EXPECT_EQ(sched::SnapshotPolicy::sglang_branch_point(q), 4'992u);
  EXPECT_EQ(p.next_cut(q, 1024), std::optional<std::size_t>(4'992));
  q.boundary = 4'992;
  EXPECT_TRUE(p.keep(q));
  q.boundary = 1024 + 8192;  // the chunk that held the branch point tracked it instead
  EXPECT_FALSE(p.keep(q));
  q.boundary = 1024 + 2 * 8192;
  EXPECT_TRUE(p.keep(q));
  // The prompt end survives only when decode crosses no multiple of 256.
  auto end = query(29'952, 30'000);
  end.output_tokens = 10;  // 30,000..30,009: no multiple of 256 after 29,952's chunk
  EXPECT_TRUE(p.keep(end));
  end.output_tokens = 400;
  EXPECT_FALSE(p.keep(end));
}

TEST(SglangLike, StatePoolFromTheMemoryRatioAndItsChunkSize) {
  EXPECT_EQ(sglang_chunk_tokens(16e9), 2048u);
  EXPECT_EQ(sglang_chunk_tokens(141e9), 8192u);
  EXPECT_EQ(sglang_chunk_tokens(192e9), 16384u);
  const ModelGeometry m = *find_model("qwen3-next-80b");
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 4; ++i) {
    TraceRequest t;
    t.timestamp_ms = 1000 * i;
    t.input_length = 2000;
    t.output_length = 4;
    for (std::uint64_t b = 0; b < 4; ++b) t.hash_ids.push_back(10 * std::uint64_t(i) + b);
    trace.push_back(t);
  }
  ScenarioOptions so;
  so.trace_host_bytes = 0;
  const Scenario s = trace_scenario(trace, m, so);
  SimOptions o;
  o.cache = CacheKind::kSglangLike;
  o.hardware = "h200-gen5";
  o.instances = 1;
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // The memory ratio sizes SGLang's state pool (rest x r / (1 + r), r = 0.9) out of the same
  // GPU bytes. Without HiCache SglangLikeCache keeps the two pools apart, as SGLang does.
  const double state = double(r->config.gpu_snapshot_slots) * double(r->config.snapshot_bytes);
  const double kv = double(r->config.gpu_pages) * double(r->config.page_bytes);
  const double device = double(*gpu_cache_bytes(*find_hardware("h200-gen5"), m));
  EXPECT_NEAR(state / (state + kv), 0.9 / 1.9, 0.01);
  EXPECT_NEAR((state + kv) / device, 1.0, 0.01);
  EXPECT_EQ(r->config.host_pages, 0u);  // HiCache off without host bytes
  EXPECT_EQ(r->policy, "sglang-no-buffer");
  EXPECT_EQ(r->eviction, "lru");
  // With host bytes HiCache is on (write-through), unless told off (SGLang's default).
  ScenarioOptions with_host;
  with_host.trace_host_bytes = 16 * kGiB;
  const Scenario h = trace_scenario(trace, m, with_host);
  auto on = simulate(h, o);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  EXPECT_GT(on->config.host_pages, 0u);
  // HiCache runs on PrefixCache, whose cached states are pages of its GPU pool (issue 21): of
  // the ratio's slots only the live ones stay slots, the rest joins the pool.
  EXPECT_EQ(on->config.gpu_snapshot_slots, live_slots_for(h.max_running));
  EXPECT_EQ(on->config.write_policy, WritePolicy::kWriteThrough);
  EXPECT_EQ(on->eviction, "lru+hicache");
  o.sglang.hicache = false;
  auto off = simulate(h, o);
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  EXPECT_EQ(off->config.host_pages, 0u);
  EXPECT_EQ(off->eviction, "lru");
}

// ---------------------------------------------------------------------------------------
// SglangLikeCache: SGLang's MambaRadixCache rules (issue 35, item 2)

/// Split pools of page 4: `kv` KV pages, `cached` state slots beside one live slot.
std::unique_ptr<SglangLikeCache> sglang_cache(
    std::uint32_t kv, std::uint32_t cached,
    SglangLikeCache::Pools pools = SglangLikeCache::Pools::kSplit) {
  SglangLikeCache::Options o;
  o.page_size = 4;
  o.pools = pools;
  o.kv_pages = kv;
  o.state_slots = cached + 1;
  o.page_bytes = 100;
  o.state_bytes = 100;
  o.max_running = 1;
  o.live_per_request = 1;
  auto c = SglangLikeCache::create(o);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return std::move(*c);
}

/// One request: admits `prompt`, then inserts each boundary of `ends` (tokens of `prompt`)
/// with a state where `with_state` says, and releases.
void run_request(SglangLikeCache& c, const std::vector<Token>& prompt,
                 const std::vector<std::size_t>& ends, const std::vector<bool>& with_state) {
  auto a = c.admit(prompt);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto table = c.path_pages(a->lock);
  ASSERT_TRUE(table.is_ok());
  std::vector<GpuPageId> pages = *table;
  for (std::size_t i = 0; i < ends.size(); ++i) {
    const std::size_t need = ends[i] / 4;
    if (need > pages.size()) {
      auto more = c.alloc_pages(a->lock, need - pages.size());
      ASSERT_TRUE(more.is_ok()) << more.status().to_string();
      pages.insert(pages.end(), more->begin(), more->end());
    }
    std::optional<GpuSlotId> slot;
    if (with_state[i]) {
      auto s = c.alloc_snapshot_slot(a->lock);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      slot = *s;
    }
    auto ins = c.insert(a->lock, std::span<const Token>(prompt).first(ends[i]),
                        std::span<const GpuPageId>(pages).first(need), slot);
    ASSERT_TRUE(ins.is_ok()) << ins.status().to_string();
    if (slot && !ins->snapshot_taken) {
      ASSERT_TRUE(c.free_snapshot_slot(a->lock, *slot).is_ok());
    }
    ASSERT_TRUE(c.free_pages(a->lock, ins->not_taken).is_ok());
    ASSERT_EQ(c.check_invariants(), "");
  }
  ASSERT_TRUE(c.release(a->lock).is_ok());
  ASSERT_EQ(c.check_invariants(), "");
}

std::vector<Token> concat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SglangLikeCache, AMatchRefreshesEveryStateOnItsPathNotOnlyTheOneResumedFrom) {
  // reset_node_and_parents_mru: the state at P (above the one resumed from, P+a) becomes more
  // recent than Q's, so the next state evicted is Q's. Refreshing only the state resumed from
  // would leave P's the oldest.
  auto c = sglang_cache(/*kv=*/100, /*cached=*/3);
  const auto p = tokens(4, 100), a = tokens(4, 200), q = tokens(4, 300);
  run_request(*c, concat(concat(p, a), tokens(1, 9)), {4, 8}, {true, true});
  run_request(*c, concat(q, tokens(1, 9)), {4}, {true});
  ASSERT_EQ(c->cached_states(), 3u);
  auto r = c->admit(concat(concat(p, a), tokens(3, 7)));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->cached_tokens, 8u);
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());  // the pool is full: one state goes
  EXPECT_FALSE(c->has_state(q));
  EXPECT_TRUE(c->has_state(p));
  EXPECT_TRUE(c->has_state(concat(p, a)));
  EXPECT_FALSE(c->has_kv(q));  // Q is a leaf: its KV left with its state
  ASSERT_TRUE(c->release(r->lock).is_ok());
  EXPECT_EQ(c->check_invariants(), "");
}

TEST(SglangLikeCache, AnInsertRefreshesThePathItWalks) {
  // _insert_helper: every node the insertion walks is refreshed, not only its end. A prompt of
  // exactly P+a matches P alone (the match leaves the last token); its request then inserts
  // P+a+b (b: its output): the walk refreshes P+a, whose state then outlives Q's.
  auto c = sglang_cache(/*kv=*/100, /*cached=*/3);
  const auto p = tokens(4, 100), a = tokens(4, 200), b = tokens(4, 400), q = tokens(4, 300);
  run_request(*c, concat(concat(p, a), tokens(1, 9)), {4, 8}, {true, true});
  run_request(*c, concat(q, tokens(1, 9)), {4}, {true});
  {
    auto r = c->admit(concat(p, a));
    ASSERT_TRUE(r.is_ok());
    ASSERT_EQ(r->cached_tokens, 4u);
    auto pages = *c->path_pages(r->lock);
    auto more = c->alloc_pages(r->lock, 2);
    ASSERT_TRUE(more.is_ok());
    pages.insert(pages.end(), more->begin(), more->end());
    const auto seq = concat(concat(p, a), b);
    auto ins = c->insert(r->lock, seq, pages, std::nullopt);
    ASSERT_TRUE(ins.is_ok());
    ASSERT_TRUE(c->free_pages(r->lock, ins->not_taken).is_ok());
    ASSERT_TRUE(c->release(r->lock).is_ok());
    ASSERT_EQ(c->check_invariants(), "");
  }
  ASSERT_EQ(c->cached_states(), 3u);
  auto r = c->admit(tokens(9, 500));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->cached_tokens, 0u);
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());
  EXPECT_FALSE(c->has_state(q));
  EXPECT_TRUE(c->has_state(concat(p, a)));
  EXPECT_TRUE(c->has_state(p));
  ASSERT_TRUE(c->release(r->lock).is_ok());
}

TEST(SglangLikeCache, EvictingALeafFreesItsKvAndStateAndItsTombstonedAncestors) {
  // _evict_leaf_node + _iteratively_delete_tombstone_leaf: P (KV only, a tombstone) and P+a
  // (KV and state) leave together when the KV pool needs one page.
  auto c = sglang_cache(/*kv=*/2, /*cached=*/3);
  const auto p = tokens(4, 100), a = tokens(4, 200);
  run_request(*c, concat(concat(p, a), tokens(1, 9)), {4, 8}, {false, true});
  ASSERT_EQ(c->cached_pages(), 2u);
  ASSERT_EQ(c->cached_states(), 1u);
  auto r = c->admit(tokens(9, 500));
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(c->alloc_pages(r->lock, 1).is_ok());
  EXPECT_EQ(c->cached_states(), 0u);  // the state left with its leaf's KV
  EXPECT_EQ(c->free_state_slots(), 3u);
  EXPECT_FALSE(c->has_kv(p));  // the tombstoned parent followed
  EXPECT_EQ(c->cached_pages(), 0u);
  EXPECT_EQ(c->free_pages(), 1u);
  ASSERT_TRUE(c->release(r->lock).is_ok());
  EXPECT_EQ(c->check_invariants(), "");
}

TEST(SglangLikeCache, AStateEvictionTombstonesAnInnerNodeAndTakesALeafWhole) {
  // evict_mamba: an inner node keeps its KV (a tombstone); a leaf goes with its KV.
  auto c = sglang_cache(/*kv=*/10, /*cached=*/2);
  const auto p = tokens(4, 100), a = tokens(4, 200);
  run_request(*c, concat(concat(p, a), tokens(1, 9)), {4, 8}, {true, true});
  auto r = c->admit(tokens(9, 500));
  ASSERT_TRUE(r.is_ok());
  // P's state is the older one (P+a was refreshed after it): P becomes a tombstone.
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());
  EXPECT_FALSE(c->has_state(p));
  EXPECT_TRUE(c->has_kv(p));
  EXPECT_TRUE(c->has_state(concat(p, a)));
  // Next: P+a, a leaf: its KV goes too, and P, now a childless tombstone, after it.
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());
  EXPECT_EQ(c->cached_pages(), 0u);
  EXPECT_FALSE(c->alloc_snapshot_slot(r->lock).is_ok());  // nothing left to evict
  ASSERT_TRUE(c->release(r->lock).is_ok());
  EXPECT_EQ(c->check_invariants(), "");
}

TEST(SglangLikeCache, SplitPoolsEvictOnlyTheirOwnKind) {
  // A state pool whose only state is locked refuses rather than evicting KV; a KV pool evicts
  // an unlocked leaf, and its state with it.
  auto c = sglang_cache(/*kv=*/1, /*cached=*/1);
  const auto p = tokens(4, 100), q = tokens(4, 300);
  run_request(*c, concat(p, tokens(1, 9)), {4}, {true});
  auto r = c->admit(concat(p, tokens(1, 9)));  // resumes from P's state: locked
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->cached_tokens, 4u);
  EXPECT_FALSE(c->alloc_snapshot_slot(r->lock).is_ok());
  EXPECT_FALSE(c->alloc_pages(r->lock, 1).is_ok());  // P's KV is locked too
  EXPECT_TRUE(c->has_state(p));
  ASSERT_TRUE(c->release(r->lock).is_ok());
  run_request(*c, concat(q, tokens(1, 9)), {4}, {false});
  EXPECT_FALSE(c->has_kv(p));  // Q's page came from P's leaf, and P's state left with it
  EXPECT_EQ(c->cached_states(), 0u);
  EXPECT_EQ(c->free_state_slots(), 1u);
}

TEST(SglangLikeCache, TheUnifiedBufferEvictsItsOwnKindFirstThenTheOther) {
  // --enable-unified-memory: one budget (4 pages + 2 slots of 100 B here, one slot live). A
  // state allocation evicts a state before any KV; a KV allocation evicts KV leaves first and
  // states (inner ones) when no leaf is left.
  auto c = sglang_cache(/*kv=*/4, /*cached=*/1, SglangLikeCache::Pools::kUnified);
  const auto p = tokens(4, 100), a = tokens(4, 200), q = tokens(4, 300);
  run_request(*c, concat(concat(p, a), tokens(1, 9)), {4, 8}, {true, false});
  run_request(*c, concat(q, tokens(1, 9)), {4}, {false});
  // 3 pages + 1 state = 400 of 500 B.
  EXPECT_EQ(c->free_pages(), 1u);
  auto r = c->admit(tokens(9, 500));
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());  // 100 B free: no eviction
  ASSERT_TRUE(c->alloc_snapshot_slot(r->lock).is_ok());  // evicts P's state, not a page
  EXPECT_FALSE(c->has_state(p));
  EXPECT_EQ(c->cached_pages(), 3u);
  ASSERT_TRUE(c->alloc_pages(r->lock, 1).is_ok());  // the oldest KV leaf (P+a, then P)
  EXPECT_FALSE(c->has_kv(p));
  EXPECT_TRUE(c->has_kv(q));
  ASSERT_TRUE(c->release(r->lock).is_ok());
  EXPECT_EQ(c->check_invariants(), "");
}

TEST(SglangLikeCache, LiveSlotsPerRunningRequestAsSglangReservesThem) {
  // HybridReqToTokenPool: 1 active slot; extra_buffer adds its ping-pong track buffers (2,
  // the overlap schedule being on by default).
  EXPECT_EQ(sglang_live_slots_per_request(false), 1u);
  EXPECT_EQ(sglang_live_slots_per_request(true), 3u);
  SglangLikeCache::Options o;
  o.page_size = 4;
  o.kv_pages = 10;
  o.page_bytes = o.state_bytes = 100;
  o.max_running = 4;
  o.live_per_request = 3;
  o.state_slots = 12;  // all live: nothing left to cache a state in
  EXPECT_FALSE(SglangLikeCache::create(o).is_ok());
  o.state_slots = 14;
  auto c = SglangLikeCache::create(o);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ((*c)->free_state_slots(), 2u);
}

TEST(SglangLike, WithoutHicacheItRunsSglangsSplitPoolsAndTheUnifiedRowOneBuffer) {
  const ModelGeometry m = *find_model("qwen3-next-80b");
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 4; ++i) {
    TraceRequest t;
    t.timestamp_ms = 1000 * i;
    t.input_length = 9000;
    t.output_length = 4;
    // One prompt four times: no_buffer keeps the state of its non-final chunk end (8,192).
    for (std::uint64_t b = 1; b <= 18; ++b) t.hash_ids.push_back(b);
    trace.push_back(t);
  }
  ScenarioOptions so;
  so.trace_host_bytes = 0;
  const Scenario s = trace_scenario(trace, m, so);
  SimOptions o;
  o.cache = CacheKind::kSglangLike;
  o.hardware = "h200-gen5";
  o.instances = 1;
  o.check_invariants = true;
  auto split = simulate(s, o);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  // The state pool keeps its memory-ratio share (r / (1 + r), r = 0.9) of the device bytes.
  const double state =
      double(split->config.gpu_snapshot_slots) * double(split->config.snapshot_bytes);
  const double kv = double(split->config.gpu_pages) * double(split->config.page_bytes);
  EXPECT_NEAR(state / (state + kv), 0.9 / 1.9, 0.01);
  EXPECT_EQ(split->eviction, "lru");
  o.cache = CacheKind::kSglangUnified;
  auto unified = simulate(s, o);
  ASSERT_TRUE(unified.is_ok()) << unified.status().to_string();
  EXPECT_EQ(unified->eviction, "lru+unified");
  EXPECT_EQ(unified->cache, "sglang-unified");
  // The requests after the first resume from the first one's chunk end, on both.
  EXPECT_GT(split->hit_ratio, 0.0);
  EXPECT_GT(unified->hit_ratio, 0.0);
}

TEST(SimCli, EveryCacheKindIsNamedInTheHelpList) {
  const std::string names = kCacheKindNames;
  for (CacheKind k : {CacheKind::kNode, CacheKind::kIndex, CacheKind::kGpuOnly, CacheKind::kIdeal,
                      CacheKind::kAttentionOnly, CacheKind::kSglangLike, CacheKind::kSglangUnified,
                      CacheKind::kVllmLike}) {
    EXPECT_NE(names.find(to_string(k)), std::string::npos) << to_string(k);
    EXPECT_TRUE(parse_cache_kind(to_string(k)).is_ok()) << to_string(k);
  }
  EXPECT_FALSE(parse_cache_kind("sglang").is_ok());
}

TEST(VllmLike, DecodeCachesTheStateOfEveryBlockItFills) {
  // Align mode: a state at each i x block_size decode reaches, not only the finish's. One
  // request of 2,000 prompt tokens and 3,000 output tokens, blocks of 1,056 (fp32 state):
  // 1,056 in prefill, then 2,112, 3,168 and 4,224 in decode.
  const ModelGeometry m = *find_model("qwen3-next-80b");
  TraceRequest t;
  t.input_length = 2000;
  t.output_length = 3000;
  t.hash_ids = {1, 2, 3, 4};
  ScenarioOptions so;
  so.trace_host_bytes = 0;
  const Scenario s = trace_scenario({t}, m, so);
  SimOptions o;
  o.cache = CacheKind::kVllmLike;
  o.hardware = "h200-gen5";
  o.instances = 1;
  o.check_invariants = true;
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->config.page_size, 1056u);
  EXPECT_EQ(r->rows[0].snapshots_kept, 4u);
}

TEST(VllmDtype, ThePresetWithVllmsDefaultStateDtypeGivesEveryColumnBf16States) {
  // vLLM: mamba_ssm_cache_dtype "auto" = the model dtype (mamba_utils.py,
  // MambaStateDtypeCalculator._mamba_state_dtype), bfloat16 for Qwen3-Next.
  const ModelGeometry fp32 = *find_model("qwen3-next-80b");
  const ModelGeometry bf16 = *find_model("qwen3-next-80b-bf16-state");
  EXPECT_EQ(fp32.recurrent_dtype, "float32");
  EXPECT_EQ(bf16.recurrent_dtype, "bfloat16");
  // The same bytes as --recurrent-dtype bfloat16: 36 x 32 x 128 x 128 x 2 fewer.
  EXPECT_EQ(bf16.snapshot_bytes(), fp32.snapshot_bytes() - 36u * 32 * 128 * 128 * 2);
  EXPECT_EQ(bf16.kv_bytes_per_token(), fp32.kv_bytes_per_token());
}

TEST(Router, CacheAwareRoutingBalancesAnOverloadedInstance) {
  Router r(RouterKind::kPrefix, 2, 1'000'000, 64);
  TraceRequest t;
  t.input_length = 1024;
  t.hash_ids = {7, 8};
  std::vector<std::size_t> load = {0, 0};
  const std::size_t first = r.route(t, load);
  // The same prefix goes where it went while the loads are balanced ...
  load[first] = 10;
  EXPECT_EQ(r.route(t, load), first);
  // ... and to the other instance once they are not (64 apart and 1.5x).
  load[first] = 100;
  load[1 - first] = 10;
  EXPECT_EQ(r.route(t, load), 1 - first);
}

TEST(Simulator, AnOverloadedReplaySaysSo) {
  const ModelGeometry m = *find_model("qwen3-next-80b");
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 40; ++i) {
    TraceRequest t;
    t.timestamp_ms = 100 * i;  // 4 s of arrivals, each ~20 s of prefill on one GPU
    t.input_length = 60'000;
    t.output_length = 2;
    for (std::uint64_t b = 0; b < 117; ++b) t.hash_ids.push_back(1000 * i + b);
    trace.push_back(t);
  }
  const Scenario s = trace_scenario(trace, m, ScenarioOptions{});
  SimOptions o;
  o.hardware = "h200-gen5";
  o.instances = 1;
  auto r = simulate(s, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GT(r->clock_span_ratio, 1.1);
  EXPECT_TRUE(r->overrun);
  o.instances = 0;  // the default count for this trace
  auto d = simulate(s, o);
  ASSERT_TRUE(d.is_ok());
  EXPECT_GT(d->instances, 1u);
}

}  // namespace
}  // namespace radixtier::sim
