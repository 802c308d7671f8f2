// The simulator's miss breakdown: every lost token lands in exactly one cause.
#include "sim/miss_breakdown.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace radixtier::sim {
namespace {

std::vector<Token> seq(Token base, std::size_t n) {
  std::vector<Token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + static_cast<Token>(i);
  return t;
}

std::vector<Token> join(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Token> head(const std::vector<Token>& a, std::size_t n) {
  return {a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n)};
}

TEST(MissBreakdown, SplitsTheLostReuseByCause) {
  // Pages of 4 tokens, alignment 4 (one page).
  const auto a = seq(1000, 17);  // query: 16 tokens, 4 pages
  const auto b = seq(5000, 10);  // query: 9 tokens, 2 pages
  const auto r2 = join(head(a, 12), seq(2000, 9));
  const auto r3 = join(head(a, 12), seq(3000, 9));
  const auto r4 = join(head(a, 16), seq(4000, 9));
  const auto r5 = join(head(a, 16), seq(4500, 9));
  const auto r7 = join(head(b, 8), seq(6000, 5));
  const std::vector<std::size_t> at_8_16 = {8, 16}, none = {};
  std::vector<MissInput> in(7);
  // Given out of order: the breakdown sorts by admission time.
  in[6] = {0.0, a, {}, 0, 0, at_8_16};  // first: nothing reachable
  in[0] = {1.0, r2, {}, 8, 12, none};   // diverges at 12 for the first time, snapshot at 8
  in[1] = {2.0, r3, {}, 8, 12, none};   // diverges at 12 again: a branch point
  in[2] = {3.0, r4, {}, 8, 8, none};    // continues a: snapshot at 16, KV only up to 8
  in[3] = {4.0, r5, {}, 8, 16, none};   // the same, KV up to 16, the snapshot gone
  in[4] = {5.0, b, {}, 0, 0, none};     // b: no snapshot kept
  in[5] = {6.0, r7, {}, 0, 8, none};    // continues b one token below its query end: tail
  const MissBreakdown m = miss_breakdown(in, 4, 4);
  EXPECT_EQ(m.requests, 7u);
  // reachable: 0, 12, 12, 16, 16, 0 (b shares nothing), 8.
  EXPECT_EQ(m.reachable_tokens, 12u + 12 + 16 + 16 + 8);
  EXPECT_EQ(m.cached_tokens, 8u * 4);
  EXPECT_EQ(m.no_snapshot_divergence, 4u);
  EXPECT_EQ(m.no_snapshot_branch, 4u);
  EXPECT_EQ(m.kv_missing, 8u);
  EXPECT_EQ(m.snapshot_missing, 8u);
  EXPECT_EQ(m.no_snapshot_tail, 8u);  // r7
  EXPECT_EQ(m.no_snapshot_placed,
            m.no_snapshot_tail + m.no_snapshot_branch + m.no_snapshot_divergence);
  EXPECT_EQ(m.reachable_tokens - m.cached_tokens,
            m.no_snapshot_placed + m.kv_missing + m.snapshot_missing);
}

}  // namespace
}  // namespace radixtier::sim
