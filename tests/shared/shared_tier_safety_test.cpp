// The shared tier against a store that misbehaves (issue 32): a store that throws never ends
// the process or leaks out of a call, every GET is bounded by the exact size of the value the
// tier expects, and a config that leaves the model's identity empty is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <thread>

#include "../cache_harness.hpp"
#include "../memory_shared_store.hpp"
#include "radixtier/shared/shared_tier.hpp"
#include "radixtier/shared/value_codec.hpp"

namespace radixtier::shared {
namespace {

using namespace std::chrono_literals;
using radixtier::testing::Harness;
using radixtier::testing::MemorySharedStore;
using radixtier::testing::seq;
using radixtier::testing::small_config;

SharedTierConfig tier_config(const CacheConfig& c) {
  SharedTierConfig t;
  t.model.model_id = "safety-test";
  t.model.weights_version = "v1";
  t.model.kv_dtype = "f32";
  t.model.page_size = c.page_size;
  t.model.page_bytes = c.page_bytes;
  t.model.snapshot_bytes = c.snapshot_bytes;
  t.min_tokens = 4;
  t.chunk_bytes = 64;  // a 200-byte snapshot in 4 chunks
  t.prefill_tokens_per_s = 1;
  return t;
}

/// A MemorySharedStore that can throw from every call and records the bounds of each GET.
class WrappedStore final : public SharedStore {
 public:
  std::vector<KeyState> exists(std::span<const std::string> keys, Deadline d) override {
    if (throw_) throw std::bad_alloc();
    return inner.exists(keys, d);
  }
  std::vector<GetReply> get(std::span<const std::string> keys, Deadline d) override {
    if (throw_) throw std::bad_alloc();
    while (block_gets && Clock::now() < d) std::this_thread::sleep_for(1ms);
    return inner.get(keys, d);
  }
  void get_into(std::span<const std::string> keys, Deadline d, std::vector<GetReply>& replies,
                const GetBounds& bounds) override {
    bounds_seen.push_back(bounds.max_value_bytes);
    SharedStore::get_into(keys, d, replies, bounds);
  }
  std::vector<KeyState> set(std::span<const SetItem> items, Deadline d) override {
    if (throw_) throw std::bad_alloc();
    return inner.set(items, d);
  }
  MemorySharedStore inner;
  std::atomic<bool> throw_{false}, block_gets{false};
  std::vector<std::size_t> bounds_seen;
};

struct Instance {
  Instance(SharedStore& store, WritePolicy w, std::chrono::milliseconds fetch_deadline = 2000ms)
      : h(small_config(w), HostTransferEngine::Mode::kThreaded) {
    SharedTierConfig t0 = tier_config(h.config);
    t0.fetch_deadline = fetch_deadline;
    auto t = SharedTier::create(t0, *h.cache, h.memory, store);
    if (!t) throw std::runtime_error(t.status().to_string());
    tier = std::move(t).value();
  }
  Harness h;
  std::unique_ptr<SharedTier> tier;
};

TEST(SharedTierSafety, AStreamedChecksumEqualsTheJoinedOne) {
  // The publisher checksums a snapshot from its host pages without joining them.
  std::vector<std::byte> whole(1000);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = std::byte(i * 7 + 3);
  const std::span<const std::byte> w(whole);
  const std::span<const std::byte> parts[] = {w.first(1), w.subspan(1, 500), w.subspan(501)};
  EXPECT_EQ(checksum(std::span<const std::span<const std::byte>>(parts)), checksum(w));
}

TEST(SharedTierSafety, AnEmptyModelIdentityIsRefused) {
  const CacheConfig c = small_config();
  EXPECT_TRUE(tier_config(c).validate().is_ok());
  for (int field = 0; field < 3; ++field) {
    SharedTierConfig t = tier_config(c);
    (field == 0 ? t.model.model_id : field == 1 ? t.model.weights_version : t.model.kv_dtype) = "";
    const Status s = t.validate();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find("model_id, weights_version and kv_dtype"), std::string::npos);
  }
}

TEST(SharedTierSafety, AStoreThatThrowsNeverEndsTheProcessOrLeavesACall) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough), b(store, WritePolicy::kWriteBack);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  ASSERT_EQ(a.h.serve(prompt, snaps).error, "");
  a.h.cache->drain();
  store.throw_ = true;
  // The publisher thread's store calls throw: counted as a failure (before: terminate).
  a.tier->publish(std::span(prompt).first(40), kDefaultNamespace);
  a.tier->flush_publishes();
  EXPECT_GE(a.tier->stats().publish_failures, 1u);
  // A probe that throws is a failed probe, not an exception out of lookup().
  std::uint64_t id = 1;
  EXPECT_NO_THROW(id = b.tier->lookup(prompt, kDefaultNamespace));
  EXPECT_EQ(id, 0u);
  EXPECT_EQ(b.tier->stats().probe_failures, 1u);

  // Published for real, then the fetch's GET throws on the worker: a miss, nothing entered.
  store.throw_ = false;
  a.tier->publish(std::span(prompt).first(40), kDefaultNamespace);
  a.tier->flush_publishes();
  EXPECT_GT(a.tier->stats().published_keys, 0u);
  id = b.tier->lookup(prompt, kDefaultNamespace);
  ASSERT_NE(id, 0u);
  store.throw_ = true;  // may race the worker's GET: either way no exception, no wrong byte
  const auto f = b.tier->finish(id);
  store.throw_ = false;
  auto served = b.h.serve(prompt, snaps);
  EXPECT_TRUE(served.bytes_ok);
  EXPECT_EQ(b.h.cache->check_invariants(), "");
  (void)f;
}

TEST(SharedTierSafety, EveryGetIsBoundedByTheValuesExactSize) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough), b(store, WritePolicy::kWriteBack);
  const auto prompt = seq({{1, 40}, {90, 1}});
  const std::size_t snaps[] = {16, 40};
  ASSERT_EQ(a.h.serve(prompt, snaps).error, "");
  a.h.cache->drain();
  a.tier->publish(std::span(prompt).first(40), kDefaultNamespace);
  a.tier->flush_publishes();
  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(f.tokens, 40u);
  const CacheConfig& c = b.h.config;
  const std::size_t kv_value = kHeaderBytes + 4 * c.page_size + c.page_bytes;
  const std::size_t chunk_value = kHeaderBytes + 64;
  ASSERT_FALSE(store.bounds_seen.empty());
  EXPECT_EQ(store.bounds_seen.front(), std::max(kv_value, chunk_value));

  // A value one byte longer than it can be is refused by the store, never decoded.
  for (auto& [key, value] : store.inner.data()) value.push_back('!');
  Instance c2(store, WritePolicy::kWriteBack);
  const auto g = c2.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_EQ(g.tokens, 0u);
}

/// a publishes `prompt` with snapshots at 16 and 40 into `store`.
void publish(Instance& a, std::span<const Token> prompt) {
  const std::size_t snaps[] = {16, 40};
  ASSERT_EQ(a.h.serve(prompt, snaps).error, "");
  a.h.cache->drain();
  a.tier->publish(prompt.first(40), kDefaultNamespace);
  a.tier->flush_publishes();
}

TEST(SharedTierSafety, FetchesRunOnABoundedPoolAndAFullQueueIsAMiss) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough), b(store, WritePolicy::kWriteBack, 500ms);
  const auto prompt = seq({{1, 40}, {90, 1}});
  publish(a, prompt);
  store.block_gets = true;  // every fetch holds its worker until its deadline
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 4 + 16; ++i) {
    ids.push_back(b.tier->lookup(prompt, kDefaultNamespace));
    ASSERT_NE(ids.back(), 0u) << i;
  }
  // 4 workers busy, 16 waiting: one more is refused, not a 21st thread.
  EXPECT_EQ(b.tier->lookup(prompt, kDefaultNamespace), 0u);
  EXPECT_EQ(b.tier->stats().fetches_refused, 1u);
  store.block_gets = false;
  for (std::uint64_t id : ids) (void)b.tier->finish(id);
  EXPECT_EQ(b.h.cache->check_invariants(), "");
}

TEST(SharedTierSafety, AFetchNeverFinishedIsFreed) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough), b(store, WritePolicy::kWriteBack, 50ms);
  const auto prompt = seq({{1, 40}, {90, 1}});
  publish(a, prompt);
  const std::uint64_t id = b.tier->lookup(prompt, kDefaultNamespace);
  ASSERT_NE(id, 0u);
  while (!b.tier->ready(id)) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(120ms);  // past its deadline + fetch_deadline
  const std::uint64_t next = b.tier->lookup(prompt, kDefaultNamespace);
  EXPECT_EQ(b.tier->stats().fetches_abandoned, 1u);
  EXPECT_EQ(b.tier->finish(id).tokens, 0u);  // freed: nothing to enter
  EXPECT_EQ(b.tier->finish(next).tokens, 40u);
  EXPECT_EQ(b.h.cache->check_invariants(), "");
}

}  // namespace
}  // namespace radixtier::shared
