// admit() of an int64 prompt (what tokenizers return; the Python binding passes it in place):
// the same admission as the int32 prompt with the same values, in every state of a random
// workload (host copies, snapshots, namespaces, a partial match, a miss), and a token outside
// int32 is refused with nothing changed, wherever it sits (in the matched part it cannot
// match; after it, it is checked).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cache_harness.hpp"

namespace radixtier {
namespace {

using testing::Harness;

std::vector<std::int64_t> widen(std::span<const Token> t) {
  return std::vector<std::int64_t>(t.begin(), t.end());
}

bool same(const Admission& a, const Admission& b) {
  return a.cached_tokens == b.cached_tokens && a.gpu_tokens == b.gpu_tokens &&
         a.host_tokens == b.host_tokens && a.snapshot_from_host == b.snapshot_from_host &&
         a.promoting == b.promoting && a.kv_tokens == b.kv_tokens;
}

TEST(WidePrompt, AdmitsAsTheInt32PromptThroughARandomWorkload) {
  // Two caches driven in lockstep (the manual engine: every copy completes when told):
  // one admits each probe as int32, the other as int64; the admissions and the caches stay
  // equal.
  CacheConfig c = testing::small_config();
  c.host_pages = 48;
  Harness narrow(c), wide(c);
  std::mt19937_64 rng(24);
  std::size_t hits = 0, from_host = 0;
  const int ops = 3000;
  for (int op = 0; op < ops; ++op) {
    std::vector<Token> p;
    const Token base = Token(1000 * (1 + rng() % 4));
    for (std::size_t i = 0, n = rng() % 70; i < n; ++i) p.push_back(base + Token(i));
    p.push_back(Token(1 + rng() % 3));
    const RequestOptions o{NamespaceId(std::uint32_t(rng() % 3)), kDefaultPriority};
    const bool serve = rng() % 2 == 0, drop = rng() % 7 == 0;
    const std::size_t chunk = 1 + rng() % 3;
    for (Harness* h : {&narrow, &wide}) {
      if (serve) {
        h->request_options = o;
        const std::size_t snaps[] = {8, 16, 24, 32, 48, 64};
        (void)h->serve(p, snaps, chunk);
      }
      if (drop) h->cache->drop_host();
      h->settle();
    }
    auto a = narrow.cache->admit(std::span<const Token>(p), o);
    const std::vector<std::int64_t> w = widen(p);
    auto b = wide.cache->admit(std::span<const std::int64_t>(w), o);
    ASSERT_TRUE(a && b) << "op " << op;
    ASSERT_TRUE(same(*a, *b)) << "op " << op << ": cached " << a->cached_tokens << " vs "
                              << b->cached_tokens;
    hits += a->cached_tokens > 0;
    from_host += a->host_tokens > 0;
    for (auto [h, lock] : {std::pair{&narrow, a->lock}, std::pair{&wide, b->lock}}) {
      ASSERT_TRUE(h->cache->release(lock));
      h->settle();
      ASSERT_EQ(h->cache->check_invariants(), "") << "op " << op;
    }
    ASSERT_EQ(narrow.cache->occupancy(), wide.cache->occupancy()) << "op " << op;
  }
  EXPECT_GT(hits, std::size_t(ops / 4)) << "the workload must reuse";
  EXPECT_GT(from_host, 10u) << "and promote from host";
  const CacheStats sa = narrow.cache->stats(), sb = wide.cache->stats();
  EXPECT_EQ(std::memcmp(&sa, &sb, sizeof sa), 0) << "the two caches did the same work";
}

TEST(WidePrompt, ATokenOutsideInt32IsRefusedWithNothingChanged) {
  Harness h(testing::small_config());
  const std::vector<Token> p = testing::seq({{100, 24}, {7, 1}});
  const std::size_t snaps[] = {8, 16, 24};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  const std::vector<std::vector<Token>> known = {p};
  for (const std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{16}, p.size() - 1}) {
    for (const std::int64_t bad :
         {std::int64_t{1} << 31, -(std::int64_t{1} << 31) - 1, std::int64_t{1} << 40,
          std::int64_t{Token(100)} | (std::int64_t{1} << 32)}) {
      std::vector<std::int64_t> w = widen(p);
      w[at] = bad;  // the last one has int32 bits of a cached token: it must not match it
      h.quiesce();
      const testing::Fingerprint before = h.fingerprint(known);
      auto r = h.cache->admit(std::span<const std::int64_t>(w), RequestOptions{});
      ASSERT_FALSE(r) << "token " << bad << " at " << at;
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("prompt[" + std::to_string(at) + "]"), std::string::npos)
          << r.status().message();
      EXPECT_EQ(before.difference(h.fingerprint(known)), "") << "token " << bad << " at " << at;
    }
  }
  // A prompt whose values all fit is admitted from the cache.
  const std::vector<std::int64_t> w = widen(p);
  auto ok = h.cache->admit(std::span<const std::int64_t>(w), RequestOptions{});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->cached_tokens, 24u);
  ASSERT_TRUE(h.cache->release(ok->lock));
  auto empty = h.cache->admit(std::span<const std::int64_t>(), RequestOptions{});
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixtier
