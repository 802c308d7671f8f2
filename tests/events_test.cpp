// KV events: the contents rebuilt from the events alone equal inspect() after every step of
// a long random workload (copies completing and failing in any order, host drops, flushes,
// sinks attached late); the bounded queue drops and counts, never blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "cache_harness.hpp"
#include "event_mirror.hpp"
#include "memory_store_engine.hpp"
#include "radixtier/cache/event_queue.hpp"

namespace radixtier {
namespace {

using testing::EventMirror;
using testing::Harness;

TEST(BlockHash, ChainsFromTheParentPage) {
  const std::vector<Token> t = testing::seq({{100, 12}});
  const auto h = block_hashes(t, 4);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], block_hash(0, std::span(t).subspan(0, 4)));
  EXPECT_EQ(h[1], block_hash(h[0], std::span(t).subspan(4, 4)));
  EXPECT_EQ(h[2], block_hash(h[1], std::span(t).subspan(8, 4)));
  // The same page after a different prefix is a different block.
  EXPECT_NE(block_hash(1, std::span(t).subspan(4, 4)), h[1]);
  EXPECT_EQ(block_hashes(std::span(t).first(11), 4).size(), 2u) << "a partial page has no hash";
}

/// Drops from `known` every prompt whose walk through the tree (inspect(): the tokens down to
/// its last matched token) is a prefix of another's walk, and those that reach nothing: the
/// rest pass every node the dropped ones passed. Sound while nodes appear only by inserts
/// (the next served prompt is added again) and otherwise only split or leave the tree.
void keep_prompts_that_cover_the_tree(const PrefixCache& cache,
                                      std::vector<std::vector<Token>>& known) {
  std::vector<std::vector<Token>> reach;
  for (const auto& p : known) {
    const std::vector<NodeInfo> walk = cache.inspect(p);
    if (!walk.empty()) reach.emplace_back(p.begin(), p.begin() + walk.back().matched);
  }
  std::sort(reach.begin(), reach.end());
  reach.erase(std::unique(reach.begin(), reach.end()), reach.end());
  known.clear();
  for (std::size_t i = 0; i < reach.size(); ++i) {
    const bool covered = i + 1 < reach.size() && reach[i].size() <= reach[i + 1].size() &&
                         std::equal(reach[i].begin(), reach[i].end(), reach[i + 1].begin());
    if (!covered && !reach[i].empty()) known.push_back(std::move(reach[i]));
  }
}

/// A random workload of `ops` requests and maintenance calls; after each, the mirror fed by
/// events must equal inspect(). With `store`, a store tier below a small host pool takes the
/// host's victims (the STORAGE medium).
void run_workload(WritePolicy policy, HostTransferEngine::Mode mode, int ops, std::uint64_t seed,
                  bool store = false) {
  CacheConfig c = testing::small_config(policy);
  c.gpu_pages = 40;
  c.host_pages = store ? 24 : 80;
  testing::MemoryStoreEngine store_tier(c, 160);
  Harness h(c, mode, store ? &store_tier : nullptr);
  store_tier.attach(h.memory);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  EventMirror mirror, late;
  CallbackSink sink([&](const CacheEvent& e) { mirror.apply(e); });
  CallbackSink late_sink([&](const CacheEvent& e) { late.apply(e); });
  // Every prompt served since the last check, plus those that still reach the tree's deepest
  // nodes (keep_prompts_that_cover_the_tree() keeps it to about the tree's leaves).
  std::vector<std::vector<Token>> known;
  std::size_t stored = 0, stored_on_store = 0;
  for (int op = 0; op < ops; ++op) {
    if (op == ops / 10) h.cache->add_event_sink(&sink);  // attached to a full cache
    if (op == ops / 2) h.cache->add_event_sink(&late_sink);
    const std::size_t what = pick(100);
    if (what < 2) {
      h.cache->drop_host();
    } else if (what < 3) {
      h.cache->flush();
    } else if (what < 8 && mode == HostTransferEngine::Mode::kManual) {
      // Finish one pending copy, maybe failing it, in any order.
      const auto pending = h.engine.pending();
      if (!pending.empty()) {
        const TicketId id = pending[pick(pending.size())];
        if (pick(4) == 0) h.engine.fail_ticket(id);
        h.engine.complete(id);
        h.cache->poll();
      }
    } else {
      const int base = static_cast<int>(pick(5));
      std::vector<Token> prompt;
      const std::size_t cut = pick(72);
      for (std::size_t i = 0; i < cut; ++i) prompt.push_back(Token(10'000 * (base + 1) + Token(i)));
      for (std::size_t i = pick(6); i > 0; --i) prompt.push_back(Token(1 + pick(3)));
      prompt.push_back(7);
      known.push_back(prompt);
      std::vector<std::size_t> snaps;
      for (std::size_t b = 4; b <= prompt.size(); b += 4)
        if (pick(3) == 0) snaps.push_back(b);
      if (pick(30) == 0) h.engine.fail_nth_submission(pick(3));
      const auto served = h.serve(prompt, snaps, 1 + pick(4));
      ASSERT_TRUE(served.error.empty() || served.refused) << "op " << op << ": " << served.error;
    }
    if (mode == HostTransferEngine::Mode::kThreaded && pick(2) == 0) h.cache->poll();
    // Every 10th step, and after every maintenance call or finished copy.
    if (op < ops / 10 || (op % 10 != 0 && what >= 8)) continue;
    ASSERT_EQ(mirror.error, "") << "op " << op;
    keep_prompts_that_cover_the_tree(*h.cache, known);
    const EventMirror want = EventMirror::from_inspect(*h.cache, known);
    ASSERT_EQ(mirror.difference(want), "") << "op " << op;
    if (op >= ops / 2) {
      ASSERT_EQ(late.error, "") << "op " << op;
      ASSERT_EQ(late.difference(want), "") << "op " << op << " (sink attached late)";
    }
    stored = std::max(stored, mirror.blocks.size());
    for (const auto& [key, tokens] : mirror.blocks) stored_on_store += key.second == Medium::kStore;
  }
  h.cache->drain();
  h.cache->remove_event_sink(&late_sink);
  const std::size_t late_events = late.events;
  h.cache->flush();
  EXPECT_EQ(late.events, late_events) << "a removed sink receives nothing";
  EXPECT_TRUE(mirror.blocks.empty() && mirror.snapshots.empty());
  EXPECT_GT(mirror.cleared, 1u) << "flush reports AllBlocksCleared";
  EXPECT_GT(stored, 20u) << "the workload should hold many blocks at once";
  const CacheStats s = h.cache->stats();
  EXPECT_GT(s.kv_pages_demoted + s.kv_pages_promoted, 0u);
  EXPECT_GT(s.transfers_failed, 0u);
  if (store) {
    EXPECT_GT(s.kv_pages_stored, 0u) << "the store tier was used";
    EXPECT_GT(s.kv_pages_loaded, 0u) << "and read back";
    EXPECT_GT(stored_on_store, 0u) << "STORAGE blocks were reported";
  }
  EXPECT_EQ(h.cache->check_invariants(), "");
}

struct Case {
  WritePolicy policy;
  HostTransferEngine::Mode mode;
  bool store = false;
};

class EventRebuild : public ::testing::TestWithParam<Case> {};

TEST_P(EventRebuild, ContentsFromEventsEqualInspectAfterTenThousandOps) {
  run_workload(GetParam().policy, GetParam().mode, 10'000, 20261201, GetParam().store);
}

INSTANTIATE_TEST_SUITE_P(
    Engines, EventRebuild,
    ::testing::Values(Case{WritePolicy::kWriteBack, HostTransferEngine::Mode::kManual},
                      Case{WritePolicy::kWriteThrough, HostTransferEngine::Mode::kManual},
                      Case{WritePolicy::kWriteBack, HostTransferEngine::Mode::kThreaded},
                      Case{WritePolicy::kWriteBack, HostTransferEngine::Mode::kManual, true},
                      Case{WritePolicy::kWriteBack, HostTransferEngine::Mode::kThreaded, true}),
    [](const auto& info) {
      return std::string(info.param.policy == WritePolicy::kWriteBack ? "WriteBack"
                                                                      : "WriteThrough") +
             (info.param.mode == HostTransferEngine::Mode::kManual ? "Manual" : "Threaded") +
             (info.param.store ? "Store" : "");
    });

TEST(Events, FlushWithALockReportsClearedThenWhatIsPinned) {
  Harness h(testing::small_config());
  const std::vector<Token> p = testing::seq({{1, 17}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  std::vector<CacheEvent> events;
  CallbackSink sink([&](const CacheEvent& e) { events.push_back(e); });
  h.cache->add_event_sink(&sink);
  auto a = h.cache->admit(p);  // locks the path to 16; its snapshot until the slot has it
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 16u);
  ASSERT_TRUE(h.cache->wait(a->lock));
  events.clear();
  h.cache->flush();
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(events.front()));
  EventMirror m;
  for (const auto& e : events) m.apply(e);
  const std::vector<std::vector<Token>> known = {p};
  EXPECT_EQ(m.error, "");
  EXPECT_EQ(m.difference(EventMirror::from_inspect(*h.cache, known)), "");
  EXPECT_FALSE(m.blocks.empty()) << "the locked path survives the flush";
  // The request resumed into its live slot (issue 21): the cached snapshot is not pinned.
  EXPECT_EQ(m.snapshots.size(), 0u);
  ASSERT_TRUE(h.cache->release(a->lock));
}

TEST(Events, StoredCarriesTokensParentAndMedium) {
  Harness h(testing::small_config());
  std::vector<CacheEvent> events;
  CallbackSink sink([&](const CacheEvent& e) { events.push_back(e); });
  h.cache->add_event_sink(&sink);
  const std::vector<Token> p = testing::seq({{1, 13}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps, 2).error, "");
  const auto hashes = block_hashes(p, 4);
  // First the AllBlocksCleared of the attachment, then chunk 1 (pages 0-1), chunk 2 with the
  // snapshot at 8, chunk 3 (page 2).
  ASSERT_GE(events.size(), 4u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(events[0]));
  const auto* first = std::get_if<BlockStored>(&events[1]);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->block_hashes, (std::vector<std::uint64_t>{hashes[0], hashes[1]}));
  EXPECT_FALSE(first->parent_block_hash.has_value());
  EXPECT_EQ(first->token_ids, std::vector<Token>(p.begin(), p.begin() + 8));
  EXPECT_EQ(first->block_size, 4u);
  EXPECT_EQ(first->medium, Medium::kGpu);
  const auto* snap = std::get_if<SnapshotStored>(&events[2]);
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(*snap, (SnapshotStored{hashes[1], 8, Medium::kGpu}));
  const auto* second = std::get_if<BlockStored>(&events[3]);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->block_hashes, std::vector<std::uint64_t>{hashes[2]});
  EXPECT_EQ(second->parent_block_hash, hashes[1]);
}

/// Inserts `tokens` (whole pages, a snapshot at the end) into namespace `ns`.
void insert_in(Harness& h, std::span<const Token> tokens, NamespaceId ns) {
  std::vector<Token> prompt(tokens.begin(), tokens.end());
  prompt.push_back(0);
  RequestOptions o;
  o.ns = ns;
  auto a = h.cache->admit(prompt, o);
  ASSERT_TRUE(a) << a.status().to_string();
  ASSERT_TRUE(h.cache->wait(a->lock));
  auto table = h.cache->path_pages(a->lock).value();
  auto more = h.cache->alloc_pages(a->lock, tokens.size() / h.ps() - table.size()).value();
  table.insert(table.end(), more.begin(), more.end());
  auto slot = h.cache->alloc_snapshot_slot(a->lock).value();
  auto ins = h.cache->insert(a->lock, tokens, table, slot);
  ASSERT_TRUE(ins) << ins.status().to_string();
  ASSERT_TRUE(h.cache->release(a->lock));
}

TEST(Events, NamespacesAreDistinctBlocksNamedByLoraId) {
  Harness h(testing::small_config());
  EventMirror mirror;
  std::vector<CacheEvent> events;
  CallbackSink sink([&](const CacheEvent& e) {
    events.push_back(e);
    mirror.apply(e);
  });
  h.cache->add_event_sink(&sink);
  const std::vector<Token> p = testing::seq({{1, 12}});
  insert_in(h, p, kDefaultNamespace);
  insert_in(h, p, NamespaceId(7));
  // Same tokens, two trees: two sets of blocks, each reproducible from its namespace's seed.
  EXPECT_EQ(mirror.error, "");
  const std::vector<std::vector<Token>> known = {p};
  EventMirror want = EventMirror::from_inspect(*h.cache, known);
  want.merge(EventMirror::from_inspect(*h.cache, known, NamespaceId(7)));
  EXPECT_EQ(mirror.difference(want), "");
  EXPECT_EQ(mirror.blocks.size(), 6u) << "3 pages in each namespace";
  EXPECT_EQ(mirror.snapshots.size(), 2u);
  bool named = false;
  for (const auto& e : events)
    if (const auto* s = std::get_if<BlockStored>(&e); s && s->lora_id == 7u) named = true;
  EXPECT_TRUE(named) << "BlockStored of namespace 7 carries lora_id 7";
  // Flushing one namespace removes only its blocks; a sink attached now sees both namespaces.
  h.cache->flush(NamespaceId(7));
  EventMirror late;
  CallbackSink late_sink([&](const CacheEvent& e) { late.apply(e); });
  h.cache->add_event_sink(&late_sink);
  const EventMirror now = EventMirror::from_inspect(*h.cache, known);
  EXPECT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.difference(now), "");
  EXPECT_EQ(mirror.blocks.size(), 3u);
  EXPECT_EQ(late.difference(now), "");
  insert_in(h, p, NamespaceId(9));
  EventMirror both = EventMirror::from_inspect(*h.cache, known);
  both.merge(EventMirror::from_inspect(*h.cache, known, NamespaceId(9)));
  EXPECT_EQ(mirror.difference(both), "");
  h.cache->remove_event_sink(&late_sink);
  EventMirror fresh;
  CallbackSink fresh_sink([&](const CacheEvent& e) { fresh.apply(e); });
  h.cache->add_event_sink(&fresh_sink);  // the contents of every namespace
  EXPECT_EQ(fresh.difference(both), "");
  h.cache->remove_event_sink(&fresh_sink);
}

TEST(EventQueue, RejectsZeroCapacity) {
  auto q = EventQueue::create(0);
  ASSERT_FALSE(q);
  EXPECT_NE(q.status().message().find("capacity"), std::string::npos);
}

TEST(EventQueue, AFullQueueDropsAndCountsWithoutBlockingTheCache) {
  Harness h(testing::small_config());
  auto q = EventQueue::create(8);
  ASSERT_TRUE(q);
  h.cache->add_event_sink(q->get());
  CacheEvent e;
  ASSERT_TRUE((*q)->pop(e));  // the attach's restart: AllBlocksCleared (the cache is empty)
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(e));
  EXPECT_FALSE((*q)->pop(e));
  // Nobody pops and no entry point of the cache runs: the queue keeps the oldest 8 events,
  // counts the rest as dropped, and says it lost events.
  EXPECT_FALSE((*q)->lost_events());
  for (int i = 0; i < 20; ++i) (*q)->on_event(BlockRemoved{{std::uint64_t(i)}, Medium::kGpu});
  EXPECT_TRUE((*q)->lost_events());
  EXPECT_EQ((*q)->size(), 8u);
  EXPECT_EQ((*q)->pushed(), 1u + 8);
  EXPECT_EQ((*q)->dropped(), 20u - 8);
  for (std::uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE((*q)->pop(e));
    EXPECT_EQ(std::get<BlockRemoved>(e).block_hashes.at(0), i);
  }
  EXPECT_FALSE((*q)->pop(e));
  // Lossy: even with room again, nothing more goes in (it would follow a hole).
  (*q)->on_event(AllBlocksCleared{});
  EXPECT_EQ((*q)->pushed(), 1u + 8);
  EXPECT_EQ((*q)->restarts(), 0u);
  // The next entry point restarts it: AllBlocksCleared and the (empty) contents.
  h.cache->poll();
  EXPECT_FALSE((*q)->lost_events());
  EXPECT_EQ((*q)->restarts(), 1u);
  ASSERT_TRUE((*q)->pop(e));
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(e));
  EXPECT_FALSE((*q)->pop(e));
  h.cache->remove_event_sink(q->get());
}

// Issue 34 item 1: a drop is never invisible. The cache restarts a lossy queue's stream at its
// next poll() (every entry point): AllBlocksCleared and the contents, handed over whole even
// when they exceed the queue, so the consumer's copy is exact again.
TEST(EventQueue, ALossyQueueIsRestartedAtTheNextPollAndItsConsumerEndsExact) {
  Harness h(testing::small_config());
  auto q = EventQueue::create(4);
  ASSERT_TRUE(q);
  h.cache->add_event_sink(q->get());
  EventMirror mirror;
  std::vector<std::vector<Token>> known;
  std::mt19937_64 rng(34);
  for (int i = 0; i < 300; ++i) {
    known.push_back(testing::seq({{Token(100 * (rng() % 40)), std::size_t(9 + rng() % 30)}}));
    const std::size_t snaps[] = {8, 16, 24, 32};
    (void)h.serve(known.back(), snaps);
    if (i % 50 == 0) h.settle();
    // A consumer that falls behind: it reads now and then only.
    CacheEvent e;
    if (i % 7 == 0)
      while ((*q)->pop(e)) mirror.apply(e);
  }
  h.settle();
  EXPECT_GT((*q)->dropped(), 0u) << "the queue overflowed";
  EXPECT_GT((*q)->restarts(), 0u) << "and its stream was restarted";
  // The last operations may have lost events: the next entry point restarts the stream once
  // the consumer has taken the restart already waiting.
  CacheEvent e;
  for (int k = 0; k < 10; ++k) {
    while ((*q)->pop(e)) mirror.apply(e);
    h.cache->poll();
    if (!(*q)->lost_events()) break;
  }
  while ((*q)->pop(e)) mirror.apply(e);
  EXPECT_FALSE((*q)->lost_events());
  EXPECT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.difference(EventMirror::from_inspect(*h.cache, known)), "");
  EXPECT_EQ((*q)->size(), 0u);
  h.cache->remove_event_sink(q->get());
}

// A queue attached to a cache that holds more than the queue: the contents arrive whole.
TEST(EventQueue, AttachedToACacheLargerThanItselfItReceivesTheWholeContents) {
  Harness h(testing::small_config());
  std::vector<std::vector<Token>> known;
  for (int i = 0; i < 12; ++i) {
    known.push_back(testing::seq({{Token(1000 * (i + 1)), 13}}));
    const std::size_t snaps[] = {8};
    ASSERT_EQ(h.serve(known.back(), snaps).error, "");
  }
  h.settle();
  const EventMirror want = EventMirror::from_inspect(*h.cache, known);
  ASSERT_GT(want.blocks.size() + want.snapshots.size(), 4u);
  auto q = EventQueue::create(4);
  ASSERT_TRUE(q);
  h.cache->add_event_sink(q->get());
  EXPECT_EQ((*q)->dropped(), 0u);
  EXPECT_FALSE((*q)->lost_events());
  EventMirror mirror;
  CacheEvent e;
  while ((*q)->pop(e)) mirror.apply(e);
  EXPECT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.cleared, 1u);
  EXPECT_EQ(mirror.difference(want), "");
  h.cache->remove_event_sink(q->get());
}

// A restart supersedes what the consumer has not taken yet: the queued events before it and
// the rest of an earlier restart; flush()'s arithmetic (pushed = popped + superseded) holds.
TEST(EventQueue, ARestartSupersedesWhatWasQueuedBeforeIt) {
  auto q = EventQueue::create(4);
  ASSERT_TRUE(q);
  for (std::uint64_t i = 0; i < 6; ++i) (*q)->on_event(SnapshotStored{i, i, Medium::kGpu});
  ASSERT_TRUE((*q)->lost_events());
  (*q)->on_restart({AllBlocksCleared{}, SnapshotStored{100, 1, Medium::kGpu}});
  EXPECT_FALSE((*q)->lost_events());
  (*q)->on_event(SnapshotStored{7, 7, Medium::kGpu});  // the ring is still full: lost again
  // ... but while a restart waits for the consumer the cache is not asked for another one
  // (it would only replace it): one tree walk per restart the consumer takes.
  EXPECT_FALSE((*q)->lost_events());
  (*q)->on_restart({AllBlocksCleared{}, SnapshotStored{200, 2, Medium::kGpu}});
  EXPECT_EQ((*q)->restarts(), 2u);
  std::vector<CacheEvent> got;
  CacheEvent e;
  ASSERT_TRUE((*q)->pop(e));  // takes the restart: the ring's 4 events are superseded
  got.push_back(e);
  (*q)->on_event(SnapshotStored{300, 3, Medium::kGpu});  // room again
  EXPECT_FALSE((*q)->lost_events());
  while ((*q)->pop(e)) got.push_back(e);
  const std::vector<CacheEvent> want = {AllBlocksCleared{}, SnapshotStored{200, 2, Medium::kGpu},
                                        SnapshotStored{300, 3, Medium::kGpu}};
  EXPECT_EQ(got, want);
  EXPECT_EQ((*q)->pushed(), got.size() + (*q)->superseded());
}

TEST(EventQueue, ConcurrentConsumerSeesEveryKeptEventInOrder) {
  auto q = EventQueue::create(64);
  ASSERT_TRUE(q);
  constexpr std::size_t kEvents = 200'000;
  std::atomic<bool> done{false};
  std::vector<std::size_t> got;
  std::thread consumer([&] {
    CacheEvent e;
    for (;;) {
      const bool finished = done.load(std::memory_order_acquire);
      while ((*q)->pop(e)) got.push_back(std::get<SnapshotStored>(e).boundary);
      if (finished) return;
    }
  });
  for (std::size_t i = 0; i < kEvents; ++i) (*q)->on_event(SnapshotStored{i, i, Medium::kHost});
  done.store(true, std::memory_order_release);
  consumer.join();
  EXPECT_EQ(got.size() + (*q)->dropped(), kEvents);
  EXPECT_EQ(got.size(), (*q)->pushed());
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end()) << "an event came twice";
}

}  // namespace
}  // namespace radixtier
