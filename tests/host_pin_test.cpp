// Host-only pins (issue 15 item 9): a pinned prefix stays on host under any pressure, within
// CacheConfig::host_pin_share of the host pool; unpin makes it evictable again.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "side_request.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;
using testing::take_pages;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

/// Pushes every unlocked prefix off the GPU, then fills the host pool with `n` others.
void pressure(Harness& h, int n) {
  const std::size_t snaps[] = {8};
  for (int i = 0; i < n; ++i) {
    const auto other = seq({{1000 + 100 * i, 8}, {90, 1}});
    ASSERT_EQ(h.serve(other, snaps).error, "");
    auto room = take_pages(h, h.cache->occupancy().gpu_pages_free + 2);
    ASSERT_TRUE(h.cache->free_pages(h.side_lock(), room));
  }
}

TEST(HostPin, APinnedPrefixSurvivesHostPressureAndUnpinMakesItEvictable) {
  for (WritePolicy w : {WritePolicy::kWriteBack, WritePolicy::kWriteThrough}) {
    SCOPED_TRACE(to_string(w));
    CacheConfig c = small_config(w);
    c.host_pages = 8;
    c.host_snapshot_slots = 2;  // host pool: 8 + 2 x 5 = 18 pages, budget 9
    Harness h(c);
    const auto system = seq({{1, 8}, {50, 1}});
    const std::size_t snaps[] = {8};
    ASSERT_EQ(h.serve(system, snaps).error, "");
    auto pin = h.cache->pin(std::span(system).first(8));
    ASSERT_TRUE(pin) << pin.status().to_string();
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->pinned_host_pages(), 2u + 5u);
    const auto info = h.cache->inspect(system).at(0);
    EXPECT_EQ(info.kv, Residency::kBoth);  // a clean host copy, made by pin()
    EXPECT_EQ(info.snapshot, Residency::kBoth);
    EXPECT_EQ(info.pins, 1u);
    pressure(h, 6);  // 6 x 7 host pages for 11 unpinned ones
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->match(system).usable_tokens, 8u);
    h.cache->drop_host();
    h.cache->flush();
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->inspect(system).at(0).kv, Residency::kHost);
    EXPECT_EQ(h.cache->inspect(system).at(0).snapshot, Residency::kHost);
    auto back = h.serve(system, snaps);  // promoted from host, byte-exact
    EXPECT_EQ(back.cached, 8u);
    EXPECT_TRUE(back.bytes_ok);

    ASSERT_TRUE(h.cache->unpin(*pin));
    EXPECT_EQ(h.cache->pinned_host_pages(), 0u);
    EXPECT_EQ(h.cache->unpin(*pin).code(), ErrorCode::kNotFound);
    h.cache->flush();
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->match(system).usable_tokens, 0u);
    EXPECT_TRUE(h.cache->inspect(system).empty());
  }
}

TEST(HostPin, PinsBeyondTheirShareOfHostAreAClearErrorAndChangeNothing) {
  CacheConfig c = small_config();
  c.host_pin_share = 0.25;  // host pool 64 + 8 x 5 = 104 pages: 26 may be pinned
  Harness h(c);
  const auto a = seq({{1, 8}, {50, 1}});     // 2 + 5 pages
  const auto b = seq({{100, 48}, {60, 1}});  // 12 + 5 pages
  const auto d = seq({{300, 8}, {70, 1}});   // 2 + 5 pages
  const std::size_t a_snaps[] = {8}, b_snaps[] = {48};
  ASSERT_EQ(h.serve(a, a_snaps).error, "");
  ASSERT_EQ(h.serve(b, b_snaps, 4).error, "");
  ASSERT_EQ(h.serve(d, a_snaps).error, "");
  ASSERT_TRUE(h.cache->pin(std::span(a).first(8)));
  ASSERT_TRUE(h.cache->pin(std::span(b).first(48)));  // 24 pinned
  const std::vector<Token> known[] = {a, b, d};
  h.cache->poll();
  const auto before = h.fingerprint(known);
  auto refused = h.cache->pin(std::span(d).first(8));
  EXPECT_EQ(refused.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(refused.status().message().find("host_pin_share"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(before.difference(h.fingerprint(known)), "");
  EXPECT_EQ(h.cache->pinned_host_pages(), 24u);
  // The same prefix twice costs nothing more: each node is charged once.
  auto twice = h.cache->pin(std::span(a).first(8));
  EXPECT_TRUE(twice);
  EXPECT_EQ(h.cache->pinned_host_pages(), 24u);
  ASSERT_INVARIANTS(h);
}

TEST(HostPin, BadPinsAreRefusedAndChangeNothing) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {50, 1}});
  const std::size_t snaps[] = {8};  // no snapshot at 16
  ASSERT_EQ(h.serve(p, snaps).error, "");
  const std::vector<Token> known[] = {p};
  h.cache->poll();
  const auto before = h.fingerprint(known);
  EXPECT_EQ(h.cache->pin(std::span(p).first(6)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->pin({}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->pin(std::span(p).first(16)).status().code(),
            ErrorCode::kInvalidArgument);  // no snapshot there
  EXPECT_EQ(h.cache->pin(std::span(p).first(4)).status().code(),
            ErrorCode::kInvalidArgument);  // inside a node: no boundary, no snapshot
  EXPECT_EQ(h.cache->pin(std::span(p).first(8), NamespaceId(4)).status().code(),
            ErrorCode::kInvalidArgument);  // not cached in that namespace
  EXPECT_EQ(h.cache->unpin(PinId(3)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(before.difference(h.fingerprint(known)), "");
  EXPECT_EQ(h.cache->namespace_count(), 1u);
}

// A pin is of one namespace: the same tokens in another namespace stay evictable.
TEST(HostPin, APinKeepsToItsNamespace) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  for (std::uint32_t ns : {0u, 2u}) {
    h.request_options = RequestOptions{NamespaceId(ns), kDefaultPriority};
    ASSERT_EQ(h.serve(p, snaps).error, "");
  }
  auto pin = h.cache->pin(std::span(p).first(8), NamespaceId(2));
  ASSERT_TRUE(pin);
  h.cache->flush();
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(p).usable_tokens, 0u);
  EXPECT_EQ(h.cache->match(p, NamespaceId(2)).usable_tokens, 8u);
  auto back = h.serve(p, snaps);  // namespace 2's bytes
  EXPECT_EQ(back.cached, 8u);
  EXPECT_TRUE(back.bytes_ok);
  ASSERT_TRUE(h.cache->unpin(*pin));
  h.cache->flush();
  EXPECT_EQ(h.cache->namespace_count(), 1u);
  ASSERT_INVARIANTS(h);
}

}  // namespace
}  // namespace radixtier
