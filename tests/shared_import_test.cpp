// PrefixCache's side of the shared tier (issue 22): host_copies() lists what a publisher may
// read, import_host() enters fetched bytes as host-resident nodes. Byte-exactness with real
// bytes: one cache's host copies enter another cache, whose next admission resumes from them
// and finds exactly the bytes the first one computed.
#include <gtest/gtest.h>

#include <cstring>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

/// What one cache's host holds along a path, copied out as a publisher does.
struct Published {
  std::vector<std::vector<std::byte>> kv;
  std::vector<std::pair<std::size_t, std::vector<std::byte>>> snapshots;
};

Published publish(Harness& h, std::span<const Token> tokens) {
  Published p;
  const HostCopies copies = h.cache->host_copies(tokens);
  for (HostPageId id : copies.kv) {
    auto bytes = h.memory.host_page(id);
    p.kv.emplace_back(bytes.begin(), bytes.end());
  }
  for (const HostSnapshotCopy& s : copies.snapshots) {
    std::vector<std::byte> bytes;
    for (HostPageId id : s.pages) {
      auto page = h.memory.host_page(id);
      bytes.insert(bytes.end(), page.begin(), page.end());
    }
    p.snapshots.emplace_back(s.boundary, std::move(bytes));
  }
  return p;
}

/// A fill that writes `p`'s KV pages and its snapshot at `boundary`; counts its calls.
ImportFill fill_from(Harness& h, const Published& p, std::size_t boundary, int* calls = nullptr,
                     std::size_t* first = nullptr) {
  return [&h, &p, boundary, calls, first](std::size_t first_page, std::span<const HostPageId> kv,
                                          std::span<const HostPageId> snapshot) {
    if (calls) ++*calls;
    if (first) *first = first_page;
    if (first_page + kv.size() > p.kv.size()) return false;
    for (std::size_t i = 0; i < kv.size(); ++i) {
      std::memcpy(h.memory.host_page(kv[i]).data(), p.kv[first_page + i].data(),
                  h.memory.page_bytes());
    }
    if (snapshot.empty()) return true;
    for (const auto& [b, bytes] : p.snapshots) {
      if (b != boundary) continue;
      for (std::size_t i = 0; i < snapshot.size(); ++i) {
        const std::size_t off = i * h.memory.page_bytes();
        const std::size_t n = std::min(h.memory.page_bytes(), bytes.size() - off);
        std::memcpy(h.memory.host_page(snapshot[i]).data(), bytes.data() + off, n);
      }
      return true;
    }
    return false;
  };
}

TEST(SharedImport, HostCopiesOfOneCacheResumeAnotherByteExact) {
  Harness a(small_config(WritePolicy::kWriteThrough), HostTransferEngine::Mode::kThreaded);
  Harness b(small_config(), HostTransferEngine::Mode::kThreaded);
  const auto prompt = seq({{1, 48}, {90, 1}});
  const std::size_t snaps[] = {16, 48};
  ASSERT_EQ(a.serve(prompt, snaps).error, "");
  a.cache->drain();
  const Published p = publish(a, std::span(prompt).first(48));
  ASSERT_EQ(p.kv.size(), 48 / a.ps());
  ASSERT_EQ(p.snapshots.size(), 2u);
  EXPECT_EQ(p.snapshots.back().first, 48u);

  auto r =
      b.cache->import_host(std::span(prompt).first(48), kDefaultNamespace, fill_from(b, p, 48));
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->first_page, 0u);
  EXPECT_EQ(r->kv_pages, 48 / b.ps());
  EXPECT_TRUE(r->snapshot);
  ASSERT_INVARIANTS(b);
  const auto info = b.cache->inspect(std::span(prompt).first(48));
  ASSERT_FALSE(info.empty());
  EXPECT_EQ(info.back().kv, Residency::kHost);
  EXPECT_EQ(info.back().snapshot, Residency::kHost);
  EXPECT_EQ(b.cache->match(prompt).usable_tokens, 48u);

  auto served = b.serve(prompt, snaps);  // promoted from host; the harness checks every byte
  ASSERT_EQ(served.error, "");
  EXPECT_EQ(served.cached, 48u);
  EXPECT_TRUE(served.bytes_ok);
  ASSERT_INVARIANTS(b);
}

TEST(SharedImport, OnlyThePagesTheTreeLacksAreAskedFor) {
  Harness a(small_config(WritePolicy::kWriteThrough), HostTransferEngine::Mode::kThreaded);
  Harness b(small_config(), HostTransferEngine::Mode::kThreaded);
  const auto prompt = seq({{1, 48}, {90, 1}});
  const std::size_t a_snaps[] = {48}, b_snaps[] = {16};
  ASSERT_EQ(a.serve(prompt, a_snaps).error, "");
  a.cache->drain();
  const Published p = publish(a, std::span(prompt).first(48));
  const auto head = seq({{1, 16}, {7, 1}});  // b has the first 16 tokens and a snapshot there
  ASSERT_EQ(b.serve(head, b_snaps).error, "");

  std::size_t first = 99;
  int calls = 0;
  auto r = b.cache->import_host(std::span(prompt).first(48), kDefaultNamespace,
                                fill_from(b, p, 48, &calls, &first));
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first, 16 / b.ps());
  EXPECT_EQ(r->kv_pages, 32 / b.ps());
  ASSERT_INVARIANTS(b);
  auto served = b.serve(prompt, a_snaps);
  EXPECT_EQ(served.cached, 48u);
  EXPECT_TRUE(served.bytes_ok);

  // Everything is there now: nothing is asked for.
  calls = 0;
  r = b.cache->import_host(std::span(prompt).first(48), kDefaultNamespace,
                           fill_from(b, p, 48, &calls));
  ASSERT_TRUE(r);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r->kv_pages, 0u);
  EXPECT_FALSE(r->snapshot);
}

TEST(SharedImport, AnImportEndingInsideANodeSplitsIt) {
  Harness a(small_config(WritePolicy::kWriteThrough), HostTransferEngine::Mode::kThreaded);
  Harness b(small_config(), HostTransferEngine::Mode::kThreaded);
  const auto prompt = seq({{1, 48}, {90, 1}});
  const std::size_t a_snaps[] = {32, 48}, b_snaps[] = {48};
  ASSERT_EQ(a.serve(prompt, a_snaps).error, "");
  a.cache->drain();
  const Published p = publish(a, std::span(prompt).first(48));
  ASSERT_EQ(b.serve(prompt, b_snaps).error, "");  // one node of 48 tokens, GPU and host
  // Drop the KV everywhere but keep the tree shape: flush, then import 32 tokens.
  b.cache->flush();
  auto r =
      b.cache->import_host(std::span(prompt).first(32), kDefaultNamespace, fill_from(b, p, 32));
  ASSERT_TRUE(r) << r.status().to_string();
  ASSERT_INVARIANTS(b);
  EXPECT_EQ(b.cache->match(prompt).usable_tokens, 32u);
  auto served = b.serve(prompt, b_snaps);
  EXPECT_EQ(served.cached, 32u);
  EXPECT_TRUE(served.bytes_ok);
  ASSERT_INVARIANTS(b);
}

TEST(SharedImport, BadInputAFailedFillOrNoRoomChangeNothing) {
  Harness b(small_config(), HostTransferEngine::Mode::kManual);
  const auto prompt = seq({{1, 32}, {90, 1}});
  const std::size_t snaps[] = {16};
  ASSERT_EQ(b.serve(seq({{500, 16}, {3, 1}}), snaps).error, "");
  b.quiesce();
  const std::vector<std::vector<Token>> prompts = {prompt};
  const auto before = b.fingerprint(prompts);
  const CacheStats stats = b.cache->stats();
  auto never = [](std::size_t, std::span<const HostPageId>, std::span<const HostPageId>) {
    return false;
  };
  EXPECT_EQ(
      b.cache->import_host(std::span(prompt).first(31), kDefaultNamespace, never).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(b.cache->import_host({}, kDefaultNamespace, never).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      b.cache->import_host(std::span(prompt).first(32), kDefaultNamespace, {}).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      b.cache->import_host(std::span(prompt).first(32), kDefaultNamespace, never).status().code(),
      ErrorCode::kFailedPrecondition);
  // A namespace the import would have made leaves again.
  EXPECT_EQ(
      b.cache->import_host(std::span(prompt).first(32), NamespaceId(7), never).status().code(),
      ErrorCode::kFailedPrecondition);
  EXPECT_EQ(b.cache->namespace_count(), 1u);
  // More than the host pool holds.
  const auto huge = seq({{1, 16 * 400}});
  EXPECT_EQ(b.cache->import_host(huge, kDefaultNamespace, never).status().code(),
            ErrorCode::kOutOfMemory);
  ASSERT_INVARIANTS(b);
  EXPECT_EQ(b.fingerprint(prompts).difference(before), "");
  const CacheStats after = b.cache->stats();
  EXPECT_EQ(std::memcmp(&stats, &after, sizeof stats), 0);
}

// Room for the KV pages and the snapshot is made for both together: with fewer free host
// pages than the two need but more than either alone, the import evicts for the rest (it
// once made room for each alone and then found the sum short: kOutOfMemory).
TEST(SharedImport, RoomForTheKvAndTheSnapshotIsMadeTogether) {
  Harness b(small_config(WritePolicy::kWriteThrough), HostTransferEngine::Mode::kThreaded);
  const std::size_t snaps[] = {16};
  for (Token t = 0; t < 12; ++t) {
    ASSERT_EQ(b.serve(seq({{1000 + 100 * t, 16}, {3, 1}}), snaps).error, "");
  }
  b.cache->drain();
  const std::size_t free = b.cache->occupancy().host_pages_free;
  const std::size_t snap_pages = b.config.snapshot_pages();
  const std::size_t pages = std::max(free, snap_pages) + 1;  // free < pages + snap_pages
  ASSERT_LE(pages + snap_pages, std::size_t{b.config.host_pool_pages()});
  const auto prompt = seq({{7, pages * b.ps()}, {90, 1}});
  auto ok = [](std::size_t, std::span<const HostPageId>, std::span<const HostPageId>) {
    return true;
  };
  auto r = b.cache->import_host(std::span(prompt).first(pages * b.ps()), kDefaultNamespace, ok);
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->kv_pages, pages);
  EXPECT_TRUE(r->snapshot);
  EXPECT_EQ(b.cache->match(prompt).usable_tokens, pages * b.ps());
  ASSERT_INVARIANTS(b);
}

TEST(SharedImport, ImportsIntoANamespaceStayThere) {
  Harness a(small_config(WritePolicy::kWriteThrough), HostTransferEngine::Mode::kThreaded);
  Harness b(small_config(), HostTransferEngine::Mode::kThreaded);
  const NamespaceId ns(3);
  a.request_options.ns = ns;
  b.request_options.ns = ns;
  const auto prompt = seq({{1, 32}, {90, 1}});
  const std::size_t snaps[] = {32};
  ASSERT_EQ(a.serve(prompt, snaps).error, "");
  a.cache->drain();
  const Published p = [&] {
    Published out;
    const HostCopies c = a.cache->host_copies(std::span(prompt).first(32), ns);
    for (HostPageId id : c.kv) {
      auto bytes = a.memory.host_page(id);
      out.kv.emplace_back(bytes.begin(), bytes.end());
    }
    for (const auto& s : c.snapshots) {
      std::vector<std::byte> bytes;
      for (HostPageId id : s.pages) {
        auto page = a.memory.host_page(id);
        bytes.insert(bytes.end(), page.begin(), page.end());
      }
      out.snapshots.emplace_back(s.boundary, std::move(bytes));
    }
    return out;
  }();
  ASSERT_EQ(p.kv.size(), 32 / a.ps());
  EXPECT_TRUE(a.cache->host_copies(std::span(prompt).first(32)).kv.empty());  // default ns
  ASSERT_TRUE(b.cache->import_host(std::span(prompt).first(32), ns, fill_from(b, p, 32)));
  EXPECT_EQ(b.cache->match(prompt).usable_tokens, 0u);
  EXPECT_EQ(b.cache->match(prompt, ns).usable_tokens, 32u);
  auto served = b.serve(prompt, snaps);
  EXPECT_EQ(served.cached, 32u);
  EXPECT_TRUE(served.bytes_ok);
  ASSERT_INVARIANTS(b);
}

}  // namespace
}  // namespace radixtier
