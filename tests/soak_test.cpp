// Soak: a long random workload on the threaded engine (copies really run concurrently with
// the cache), with injected copy failures and host drops, checking every reused byte.
#include <gtest/gtest.h>

#include <random>

#include "cache_harness.hpp"

namespace radixtier {
namespace {

using testing::Harness;

class SoakTest : public ::testing::TestWithParam<WritePolicy> {};

TEST_P(SoakTest, ThreadedRandomWorkloadKeepsEveryByte) {
  CacheConfig c = testing::small_config(GetParam());
  c.gpu_pages = 48;
  c.host_pages = 96;
  Harness h(c, HostTransferEngine::Mode::kThreaded);
  std::mt19937_64 rng(20261129);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::size_t reused = 0, failures_injected = 0;
  for (int op = 0; op < 4000; ++op) {
    // Prompts share prefixes: a cut of one of four conversations plus a short private tail.
    const int base = static_cast<int>(pick(4));
    std::vector<Token> prompt;
    const std::size_t cut = pick(80);
    for (std::size_t i = 0; i < cut; ++i) prompt.push_back(Token(10'000 * (base + 1) + Token(i)));
    for (std::size_t i = pick(6); i > 0; --i) prompt.push_back(Token(1 + pick(3)));
    prompt.push_back(7);
    std::vector<std::size_t> snaps;
    for (std::size_t b = 4; b <= prompt.size(); b += 4)
      if (pick(3) == 0) snaps.push_back(b);
    if (pick(40) == 0) {
      h.engine.fail_nth_submission(pick(3));
      ++failures_injected;
    }
    if (pick(200) == 0) h.cache->drop_host();
    const auto served = h.serve(prompt, snaps, 1 + pick(4));
    ASSERT_EQ(served.error, "") << "op " << op;
    ASSERT_TRUE(served.bytes_ok) << "op " << op << ": reused bytes differ from what was written";
    reused += served.cached;
    if (op % 100 == 0) {
      ASSERT_EQ(h.cache->check_invariants(), "") << "op " << op;
    }
  }
  h.cache->drain();
  EXPECT_EQ(h.cache->check_invariants(), "");
  const CacheStats s = h.cache->stats();
  EXPECT_GT(reused, 0u);
  EXPECT_GT(s.kv_pages_promoted, 0u) << "the workload should exercise promotion";
  EXPECT_GT(failures_injected, 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, SoakTest,
                         ::testing::Values(WritePolicy::kWriteBack, WritePolicy::kWriteThrough),
                         [](const auto& info) {
                           return info.param == WritePolicy::kWriteBack ? "WriteBack"
                                                                        : "WriteThrough";
                         });

}  // namespace
}  // namespace radixtier
