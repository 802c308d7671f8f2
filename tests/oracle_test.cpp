// The oracle (src/sim/oracle_cache.hpp): hand-built traces whose optimum is counted by hand,
// the pages it reads from a trace, and end to end on the committed conversation trace: at the
// same bytes it is at or above the node cache and the attention-only twin, and its free-
// snapshot run (the bound) is at or above it.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sim/oracle_cache.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"
#include "sim/trace_replay.hpp"

namespace radixtier::sim {
namespace {

constexpr std::uint32_t kPs = 4;  // tokens per page of the hand-built traces

// A hand-built trace: each request's page ids (equal ids = equal prefixes) and cap.
OracleTrace hand(std::vector<std::vector<std::uint64_t>> pages, std::vector<std::uint32_t> caps) {
  OracleTrace t;
  t.page_size = kPs;
  t.pages = std::move(pages);
  t.cap_pages = std::move(caps);
  for (std::uint32_t c : t.cap_pages) t.input_tokens.push_back((c + 1) * kPs);
  return t;
}

TEST(Oracle, FreeSnapshotsIsBeladysMinOnPages) {
  // One-page requests a b c a b c, room for 2 pages: the optimum hits 2 (any two of the last
  // three; LRU would hit none). MIN keeps a and b after c (c's next use is the farthest).
  const OracleTrace t = hand({{1}, {2}, {3}, {1}, {2}, {3}}, {1, 1, 1, 1, 1, 1});
  const OracleStats st = run_oracle(t, 2, 1, 0);
  EXPECT_EQ(st.hit_tokens, (std::vector<std::uint64_t>{0, 0, 0, kPs, kPs, 0}));
  EXPECT_EQ(st.hits, 2 * kPs);
  EXPECT_EQ(st.snapshots_placed, 0u);
  // Without limit every repeat hits.
  EXPECT_EQ(run_oracle(t, 1000, 1, 0).hits, 3 * kPs);
}

TEST(Oracle, ResumesOnlyWhereASnapshotIsResident) {
  // r0 computes pages 1 2; r1 continues it (target: page 2, its depth 2); r2 shares page 1
  // only (target: page 1). Pages cost 1 byte, snapshots 2.
  const OracleTrace t = hand({{1, 2}, {1, 2, 3}, {1, 5}}, {0, 2, 1});
  // Unlimited: both targets get a snapshot from r0; r1 hits 2 pages, r2 one.
  const OracleStats all = run_oracle(t, 1000, 1, 2);
  EXPECT_EQ(all.hit_tokens, (std::vector<std::uint64_t>{0, 2 * kPs, kPs}));
  EXPECT_EQ(all.snapshots_placed, 2u);
  EXPECT_EQ(all.reusable_tokens, 3 * kPs);
  // 5 bytes: pages 1 2 and one snapshot. By hand the optimum is 2 pages: keep the snapshot
  // at 2 (r1 hits 2, r2 none: r1 resumed past page 1 and cannot take a state there), or the
  // one at 1 (r1 and r2 hit 1 each). The snapshot at 1 is the farther use per token resumed.
  const OracleStats five = run_oracle(t, 5, 1, 2);
  EXPECT_EQ(five.hits, 2 * kPs);
  EXPECT_EQ(five.hit_tokens[1], 2 * kPs);
  EXPECT_EQ(five.snapshots_placed, 2u);  // r1 does not place one below its hit
  EXPECT_LE(five.peak_bytes, 5u);
  // The same bytes with free snapshots: every resident boundary resumes, 3 pages.
  EXPECT_EQ(run_oracle(t, 5, 1, 0).hits, 3 * kPs);
}

TEST(Oracle, PricesASnapshotByTheTokensItResumes) {
  // Two conversations: A (r0, 8 pages) comes back at r3 resuming all 8; B (r1, 2 pages)
  // comes back sooner, at r2, resuming 2. Pages cost 1 byte, snapshots 6; after r1 they hold
  // 22 bytes in 16. By hand: dropping B's snapshot loses 2 pages and keeps 8 (the optimum,
  // 8 pages); dropping A's (the farthest use) keeps 2; no page eviction frees 6 bytes
  // without losing a snapshot's use. Priced per token resumed, B's snapshot is the dearest.
  const OracleTrace t =
      hand({{1, 2, 3, 4, 5, 6, 7, 8}, {11, 12}, {11, 12, 13}, {1, 2, 3, 4, 5, 6, 7, 8, 9}},
           {0, 0, 2, 8});
  const OracleStats st = run_oracle(t, 16, 1, 6);
  EXPECT_EQ(st.hit_tokens, (std::vector<std::uint64_t>{0, 0, 0, 8 * kPs}));
  EXPECT_EQ(st.hits, 8 * kPs);
  EXPECT_LE(st.peak_bytes, 16u);
}

TEST(Oracle, NothingFitsNothingHits) {
  const OracleTrace t = hand({{1, 2}, {1, 2, 3}}, {0, 2});
  EXPECT_EQ(run_oracle(t, 0, 1, 2).hits, 0u);
  EXPECT_EQ(run_oracle(t, 0, 1, 0).hits, 0u);
  // Room for the pages but not their snapshot: the hybrid hits nothing, the bound hits.
  EXPECT_EQ(run_oracle(t, 3, 1, 2).hits, 0u);
  EXPECT_EQ(run_oracle(t, 3, 1, 0).hits, 2 * kPs);
}

TEST(Oracle, PagesOfATraceArePromptAndOutput) {
  TraceRequest a, b;
  a.hash_ids = {1, 2};
  a.input_length = 1024;
  a.output_length = 65;  // 64 output tokens with KV: one more page
  b.hash_ids = {1, 2, 3};
  b.input_length = 1536;
  b.output_length = 1;
  std::vector<TraceRequest> trace{a, b};
  TracePrompts prompts(trace, nullptr);  // hash-only prompts
  const OracleTrace t = oracle_trace(trace, prompts, 64);
  ASSERT_EQ(t.pages.size(), 2u);
  EXPECT_EQ(t.pages[0].size(), 17u);  // 1024 + 64 tokens
  EXPECT_EQ(t.cap_pages[0], 15u);     // all but the last prompt token
  EXPECT_EQ(t.pages[1].size(), 24u);
  EXPECT_EQ(t.cap_pages[1], 23u);
  for (std::size_t k = 0; k < 16; ++k) EXPECT_EQ(t.pages[0][k], t.pages[1][k]) << k;
  EXPECT_NE(t.pages[0][16], t.pages[1][16]);  // a's output is not b's third block
  const OracleStats st = run_oracle(t, 1000, 1, 1);
  EXPECT_EQ(st.hit_tokens[1], 1024u);  // resumes at the shared 16 pages
  EXPECT_EQ(st.pages_past_cap, 0u);

  // The same request twice: its last prompt page and its output page come back past the
  // second one's cap (free reloads, counted).
  std::vector<TraceRequest> twice{a, a};
  TracePrompts again(twice, nullptr);
  const OracleStats rep = run_oracle(oracle_trace(twice, again, 64), 1000, 1, 1);
  EXPECT_EQ(rep.pages_past_cap, 2u);
  EXPECT_EQ(rep.hit_tokens[1], 15u * 64);
}

// Random tiny traces for the brute force: each request continues an earlier sequence (a
// prefix of it and 1-2 new pages) or starts a new one; ids name a page with its prefix.
OracleTrace random_tiny(std::mt19937& rng, std::size_t requests, std::size_t max_pages) {
  while (true) {
    std::map<std::vector<int>, std::uint64_t> id_of;
    std::vector<std::vector<int>> paths;
    OracleTrace t;
    t.page_size = kPs;
    for (std::size_t i = 0; i < requests; ++i) {
      std::vector<int> path;
      if (!paths.empty() && rng() % 3 != 0) {
        path = paths[rng() % paths.size()];
        path.resize(1 + rng() % path.size());
      }
      for (std::size_t k = 1 + rng() % 2; k > 0; --k) path.push_back(static_cast<int>(rng() % 2));
      std::vector<std::uint64_t> ids;
      for (std::size_t k = 1; k <= path.size(); ++k) {
        std::vector<int> prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(k));
        ids.push_back(id_of.try_emplace(prefix, id_of.size() + 1).first->second);
      }
      paths.push_back(path);
      t.pages.push_back(ids);
      t.cap_pages.push_back(static_cast<std::uint32_t>(rng() % (path.size() + 1)));
      t.input_tokens.push_back((t.cap_pages.back() + 1) * kPs);
    }
    if (id_of.size() <= max_pages) return t;
  }
}

// The optimum by exhaustive search over what stays resident after each request: pages
// (bit k: dense page k) and, unless free, snapshots (bit k + P: a snapshot at page k's end,
// which a request can take only at a boundary past its hit). `snap` bytes per snapshot (0:
// every resident boundary resumes), 1 per page.
std::uint64_t brute_force(const OracleTrace& t, std::uint64_t capacity, std::uint64_t snap) {
  std::map<std::uint64_t, std::uint32_t> dense;
  for (const auto& seq : t.pages) {
    for (std::uint64_t id : seq) dense.try_emplace(id, static_cast<std::uint32_t>(dense.size()));
  }
  const std::size_t p = dense.size();
  auto bytes = [&](std::uint32_t m) {
    std::uint64_t b = static_cast<std::uint64_t>(std::popcount(m & ((1u << p) - 1)));
    return b + snap * static_cast<std::uint64_t>(std::popcount(m >> p));
  };
  std::map<std::uint32_t, std::uint64_t> best{{0u, 0}};  // resident set -> most hits so far
  for (std::size_t i = 0; i < t.pages.size(); ++i) {
    std::map<std::uint32_t, std::uint64_t> next;
    for (const auto& [mask, hits] : best) {
      std::size_t b = 0;
      for (std::size_t k = 0; k < t.cap_pages[i]; ++k) {
        const std::uint32_t d = dense[t.pages[i][k]];
        if ((mask >> d & 1u) == 0) break;
        if (snap == 0 || (mask >> (d + p) & 1u) != 0) b = k + 1;
      }
      std::uint32_t avail = mask;
      for (std::size_t k = 0; k < t.pages[i].size(); ++k) {
        const std::uint32_t d = dense[t.pages[i][k]];
        avail |= 1u << d;
        if (snap > 0 && k + 1 > b) avail |= 1u << (d + p);
      }
      const std::uint64_t h = hits + b * kPs;
      for (std::uint32_t sub = avail;; sub = (sub - 1) & avail) {
        if (bytes(sub) <= capacity) {
          auto [it, fresh] = next.try_emplace(sub, h);
          if (!fresh) it->second = std::max(it->second, h);
        }
        if (sub == 0) break;
      }
    }
    best = std::move(next);
  }
  std::uint64_t out = 0;
  for (const auto& [mask, hits] : best) out = std::max(out, hits);
  return out;
}

TEST(Oracle, FreeSnapshotsEqualTheOptimumOnRandomTinyTraces) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const OracleTrace t = random_tiny(rng, 7, 10);
    const std::uint64_t cap = 1 + rng() % 5;
    EXPECT_EQ(run_oracle(t, cap, 1, 0).hits, brute_force(t, cap, 0)) << "trial " << trial;
  }
}

TEST(Oracle, PaidSnapshotsStayAtOrBelowTheOptimumAndNearIt) {
  // The paid oracle is a heuristic: never above the exhaustive optimum; summed over the
  // trials it keeps most of it (the number is reported, docs/simulator.md, "The oracle").
  std::mt19937 rng(11);
  std::uint64_t got = 0, opt = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const OracleTrace t = random_tiny(rng, 6, 6);
    const std::uint64_t snap = 1 + rng() % 3, cap = 2 + rng() % 8;
    const std::uint64_t o = run_oracle(t, cap, 1, snap).hits, best = brute_force(t, cap, snap);
    EXPECT_LE(o, best) << "trial " << trial;
    got += o;
    opt += best;
  }
  ASSERT_GT(opt, 0u);
  const double ratio = static_cast<double>(got) / static_cast<double>(opt);
  std::printf("paid oracle / exhaustive optimum over the trials: %.4f\n", ratio);
  EXPECT_GE(ratio, 0.85);  // a floor below the 0.927 measured at this seed
}

std::string source_path(const std::string& relative) {
  return (std::filesystem::path(__FILE__).parent_path() / relative).string();
}

TEST(Oracle, AtOrAboveNodeAndTheTwinOnConversations) {
  auto trace = load_trace(source_path("data/conversation_trace.jsonl"));
  ASSERT_TRUE(trace) << trace.status().message();
  trace->resize(400);
  ScenarioOptions so;
  so.trace_host_bytes = 0;
  so.trace_gpu_kv_tokens = 256 * 1024;  // under pressure: the 400 requests hold ~4M tokens
  const ModelGeometry m = *find_model("qwen3-next-80b");
  const Scenario s = trace_scenario(*trace, m, so);
  auto run = [&](CacheKind k) {
    SimOptions o;
    o.cache = k;
    o.hardware = "h200-gen5";
    o.instances = 1;
    auto r = simulate(s, o);
    EXPECT_TRUE(r) << r.status().message();
    return *r;
  };
  const SimResult node = run(CacheKind::kNode);
  const SimResult twin = run(CacheKind::kAttentionOnly);
  const SimResult oracle = run(CacheKind::kOracle);
  EXPECT_EQ(oracle.total_budget_bytes, node.total_budget_bytes);
  EXPECT_GT(node.hit_ratio, 0.1);
  EXPECT_GE(oracle.hit_ratio, node.hit_ratio);
  EXPECT_GE(oracle.hit_ratio, twin.hit_ratio);
  EXPECT_GE(oracle.oracle_bound_ratio, oracle.hit_ratio);
  EXPECT_LE(oracle.oracle_bound_ratio, oracle.oracle_page_ceiling_ratio);
  EXPECT_LT(oracle.oracle_bound_ratio, oracle.oracle_page_ceiling_ratio);  // pressure bites
  std::printf("node %.4f twin %.4f oracle %.4f bound %.4f ceiling %.4f\n", node.hit_ratio,
              twin.hit_ratio, oracle.hit_ratio, oracle.oracle_bound_ratio,
              oracle.oracle_page_ceiling_ratio);
}

TEST(Oracle, RefusesAScenarioThatIsNotATrace) {
  auto s = make_scenario("churn", *find_model("qwen3-next-80b"));
  ASSERT_TRUE(s);
  SimOptions o;
  o.cache = CacheKind::kOracle;
  auto r = simulate(*s, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("oracle"), std::string::npos);
  EXPECT_EQ(parse_cache_kind("oracle").value(), CacheKind::kOracle);
}

}  // namespace
}  // namespace radixtier::sim
