// The shared tier against a store that misbehaves (issue 32): a store that throws never ends
// the process or leaks out of a call, every GET is bounded by the exact size of the value the
// tier expects, and a config that leaves the model's identity empty is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <new>
#include <thread>

#include "../cache_harness.hpp"
#include "../memory_shared_store.hpp"
#include "../shared_tier_test_config.hpp"
#include "radixtier/shared/shared_keys.hpp"
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
  return radixtier::testing::memory_tier_config(c, "safety-test");
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
    {
      // Fetches run on several pool workers at once.
      std::lock_guard lock(bounds_mutex);
      bounds_seen.push_back(bounds.max_value_bytes);
    }
    SharedStore::get_into(keys, d, replies, bounds);
  }
  std::vector<KeyState> set(std::span<const SetItem> items, Deadline d) override {
    if (throw_) throw std::bad_alloc();
    return inner.set(items, d);
  }
  MemorySharedStore inner;
  std::atomic<bool> throw_{false}, block_gets{false};
  std::mutex bounds_mutex;
  std::vector<std::size_t> bounds_seen;  // guarded by bounds_mutex
};

struct Instance {
  Instance(SharedStore& store, WritePolicy w, std::chrono::milliseconds fetch_deadline = 2000ms,
           std::string key = {})
      : h(small_config(w), HostTransferEngine::Mode::kThreaded) {
    SharedTierConfig t0 = tier_config(h.config);
    t0.fetch_deadline = fetch_deadline;
    if (!key.empty()) t0.namespace_keys[kDefaultNamespace.value()] = key;
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
  // 4 running (once the workers took them) and 16 waiting at most: a lookup past that is a
  // miss, never one more thread.
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 40; ++i) {
    const std::uint64_t id = b.tier->lookup(prompt, kDefaultNamespace);
    if (id == 0) break;
    ids.push_back(id);
  }
  EXPECT_GE(ids.size(), 16u);
  EXPECT_LE(ids.size(), 20u);
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

const std::string kKey = "0123456789abcdef0123456789abcdef";  // 32 bytes

/// The int32 LE bytes of `tokens`, as a KV page value would hold them in clear.
std::string clear_tokens(std::span<const Token> tokens) {
  std::string out;
  for (Token t : tokens) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(std::uint32_t(t) >> (8 * i)));
  }
  return out;
}

TEST(SharedTierSafety, AKeyedNamespaceResumesByteExactAndStoresNoTokenOrSaltHashInClear) {
  const auto prompt = seq({{1, 40}, {90, 1}});
  for (const bool keyed : {false, true}) {
    WrappedStore store;
    Instance a(store, WritePolicy::kWriteThrough, 2000ms, keyed ? kKey : "");
    Instance b(store, WritePolicy::kWriteBack, 2000ms, keyed ? kKey : "");
    publish(a, prompt);
    const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
    EXPECT_EQ(f.tokens, 40u) << keyed;
    const std::size_t snaps[] = {16, 40};
    EXPECT_TRUE(b.h.serve(prompt, snaps).bytes_ok) << keyed;
    EXPECT_EQ(b.tier->stats().values_rejected, 0u);
    // The first page's tokens, and the unkeyed namespace hash, appear in the store only
    // without a key.
    const std::string page0 = clear_tokens(std::span(prompt).first(4));
    const std::string unkeyed_ns = hex64(namespace_hash("default"));
    std::size_t token_hits = 0, ns_hits = 0;
    for (const auto& [key, value] : store.inner.data()) {
      token_hits += value.find(page0) != std::string::npos;
      ns_hits += key.find(unkeyed_ns) != std::string::npos;
    }
    EXPECT_EQ(token_hits > 0, !keyed) << keyed;
    EXPECT_EQ(ns_hits > 0, !keyed) << keyed;
  }
}

TEST(SharedTierSafety, AValueForgedWithoutTheKeyIsNeverServed) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough, 2000ms, kKey);
  const auto prompt = seq({{1, 40}, {90, 1}});
  publish(a, prompt);
  // A writer without the key rewrites every value: a payload byte changed, then what it can
  // do for the check: its own MAC (a guessed key), or an unkeyed value with a right XXH3.
  for (const bool unkeyed : {false, true}) {
    for (auto& [key, value] : store.inner.data()) {
      std::string body = value.substr(0, value.size() - kMacBytes);
      body.back() ^= 0x5a;  // the last payload byte (page bytes, chunk bytes, manifest)
      const std::span<const std::byte> payload[] = {
          std::as_bytes(std::span(body.data() + kHeaderBytes, body.size() - kHeaderBytes))};
      // The header as it was, re-encoded around the changed payload.
      ValueHeader h;
      auto get = [&](std::size_t at, int n) {
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i)
          v |= std::uint64_t(static_cast<unsigned char>(body[at + i])) << (8 * i);
        return v;
      };
      h.kind = static_cast<ValueKind>(get(6, 2));
      h.model = get(8, 8);
      h.ns = get(16, 8);
      h.path = {get(24, 8), get(32, 8)};
      h.boundary = get(40, 8);
      h.tokens = static_cast<std::uint32_t>(get(48, 4));
      h.index = static_cast<std::uint32_t>(get(52, 4));
      value = encode_value(h, payload, unkeyed ? "" : "a guessed key, 32 bytes long....");
    }
    Instance b(store, WritePolicy::kWriteBack, 2000ms, kKey);
    const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
    EXPECT_EQ(f.tokens, 0u) << unkeyed;
    EXPECT_GT(b.tier->stats().values_rejected, 0u);
    const std::size_t snaps[] = {16, 40};
    EXPECT_TRUE(b.h.serve(prompt, snaps).bytes_ok);  // recomputed, not forged
    store.inner.data().clear();                      // genuine values again for the next forgery
    publish(a, prompt);
    ASSERT_EQ(store.inner.data().size(), 10u + 2 * 5);
  }
}

TEST(SharedTierSafety, AKeyedValueReplayedUnderAnotherKeyIsRejected) {
  WrappedStore store;
  Instance a(store, WritePolicy::kWriteThrough, 2000ms, kKey);
  const auto prompt = seq({{1, 40}, {90, 1}});
  publish(a, prompt);
  // Every KV page's value replaced by the first page's (a genuine value, its MAC intact).
  std::string first;
  std::vector<std::string*> pages;
  for (auto& [key, value] : store.inner.data()) {
    if (key.size() > 3 && key.substr(key.size() - 3) == ":kv") pages.push_back(&value);
  }
  ASSERT_EQ(pages.size(), 10u);
  for (std::string* v : pages) *v = *pages.front();
  Instance b(store, WritePolicy::kWriteBack, 2000ms, kKey);
  const auto f = b.tier->before_admit(1, prompt, kDefaultNamespace);
  EXPECT_LT(f.tokens, 40u);
  EXPECT_GT(b.tier->stats().values_rejected, 0u);
  const std::size_t snaps[] = {16, 40};
  EXPECT_TRUE(b.h.serve(prompt, snaps).bytes_ok);
}

TEST(SharedTierSafety, NamespaceKeysAreChecked) {
  const CacheConfig c = small_config();
  SharedTierConfig t = tier_config(c);
  t.namespace_keys[kDefaultNamespace.value()] = "short";
  EXPECT_EQ(t.validate().code(), ErrorCode::kInvalidArgument);
  t.namespace_keys[kDefaultNamespace.value()] = std::string(65, 'k');
  EXPECT_EQ(t.validate().code(), ErrorCode::kInvalidArgument);
  t.namespace_keys[kDefaultNamespace.value()] = kKey;
  EXPECT_TRUE(t.validate().is_ok());
  t.namespace_keys[7] = kKey;  // namespace 7 is not shared
  EXPECT_EQ(t.validate().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixtier::shared
