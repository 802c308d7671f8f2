// Stateful property test of PrefixCache against a simple model.
//
// The model remembers which prefixes were inserted with a snapshot. After every command:
//  - check_invariants() passes (rules 2, 3, 4 and the tree's shape);
//  - every byte a request reuses equals what was written for that prefix (rule 5);
//  - the usable match agrees with the model (rule 1): exactly while nothing was lost, and
//    once something was dropped or a copy failed, it is still a boundary the model knows
//    (never a wrong or shorter-than-claimed one, never bytes that are not there).
// Transfers complete only when a command says so, in any order; some fail. The device copies
// (a cached snapshot into a request's live slot, a request's slot into GPU pool pages at
// insert) are transfers like the others: pending until a command lands or fails them, the
// fill ordered after the copy that brings its snapshot. A held request may order its "stream"
// after its prefix (stream_wait(); the host engine waits) and read the ids before wait():
// when poll(lock) then says kDone, every byte must be there. Requests come in
// two key namespaces whose "model" bytes differ (Harness::salt()) and at random retention
// priorities: the model keeps one set of prefixes per namespace, so a match or a byte shared
// across namespaces fails the checks, and priorities reorder eviction without breaking any.
// With a store tier (issue 13: a small MemoryStoreEngine below a small host pool), host
// victims go to the store and come back at admission; Restart ends the process, gracefully
// (persist()) or by a crash (kill -9: only what the store had made durable survives), and
// makes a new cache on the same store, whose every served prefix must again have exactly the
// model's bytes; store faults (a failed write, a lost record, an I/O error on a read, a
// refused batch) may cost a recompute, never a wrong byte.
// Reproduce a failure with RC_PARAMS="seed=N" (rapidcheck prints the seed).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <map>
#include <set>

#include "../tests/cache_harness.hpp"
#include "../tests/memory_store_engine.hpp"

namespace radixtier {
namespace {

using testing::Harness;

constexpr std::size_t kPage = 4;

using Prefixes = std::set<std::vector<Token>>;

/// Rule 1 on a set of snapshot prefixes: the deepest one of prompt[0 : L-1].
std::size_t deepest(const Prefixes& snapshots, const std::vector<Token>& prompt) {
  const std::size_t limit = (prompt.size() - 1) / kPage * kPage;
  for (std::size_t b = limit; b > 0; b -= kPage) {
    if (snapshots.count(std::vector<Token>(prompt.begin(), prompt.begin() + b))) return b;
  }
  return 0;
}

struct Model {
  /// Per namespace: prefixes inserted with a snapshot if nothing was ever lost: then the
  /// cache must agree exactly.
  std::map<std::uint32_t, Prefixes> exact;
  /// Per namespace: every prefix that may have been inserted with a snapshot whatever was
  /// lost (a request that found less recomputes more and so places snapshots at other chunk
  /// ends).
  std::map<std::uint32_t, Prefixes> possible;
  std::size_t held = 0;          ///< admissions holding their lock
  std::uint32_t namespaces = 2;  ///< requests come in namespaces 0 .. namespaces - 1
  bool store = false;            ///< the cache has a store tier (the store commands apply)

  static const Prefixes& of(const std::map<std::uint32_t, Prefixes>& m, std::uint32_t ns) {
    static const Prefixes kNone;
    auto it = m.find(ns);
    return it == m.end() ? kNone : it->second;
  }
  std::size_t usable(std::uint32_t ns, const std::vector<Token>& prompt) const {
    return deepest(of(exact, ns), prompt);
  }
  bool knows(std::uint32_t ns, const std::vector<Token>& prompt, std::size_t b) const {
    return b == 0 || of(possible, ns).count(std::vector<Token>(prompt.begin(), prompt.begin() + b));
  }
};

/// A request's namespace (one of the model's) and retention priority.
struct Key {
  explicit Key(std::uint32_t namespaces = 2)
      : ns(*rc::gen::inRange<std::uint32_t>(0, namespaces)),
        priority(static_cast<RetentionPriority>(*rc::gen::inRange(0, 101))) {}
  Key(std::uint32_t n, RetentionPriority p) : ns(n), priority(p) {}
  std::uint32_t ns;
  RetentionPriority priority;
  RequestOptions options() const { return RequestOptions{NamespaceId(ns), priority}; }
};

struct Sut {
  /// The store tier (none when null); it outlives every cache h makes on it.
  std::unique_ptr<testing::MemoryStoreEngine> store;
  Harness h;
  std::vector<LockId> held;
  struct Pinned {
    PinId pin;
    std::vector<Token> prefix;
    NamespaceId ns;
  };
  std::vector<Pinned> pins;
  /// A serve stopped at a kOutOfMemory refusal: it inserted less than the model placed.
  bool refused = false;
  /// Something was lost before the last restart (whose cache's stats are gone), or a restart
  /// itself lost something (a crash, a persist() the store had no room for).
  bool lost_before = false;
  /// Every prompt served or held so far, with its namespace (the restart checks them all).
  std::vector<std::pair<std::uint32_t, std::vector<Token>>> prompts;

  explicit Sut(const CacheConfig& c, std::uint64_t store_slots = 0)
      : store(store_slots ? std::make_unique<testing::MemoryStoreEngine>(c, store_slots) : nullptr),
        h(c, HostTransferEngine::Mode::kManual, store.get()) {
    if (store) store->attach(h.memory);
    // Device copies (fills of live slots, materializations) stay pending like every other
    // copy: CompleteOne lands or fails them in any order (issue 33).
    h.engine.set_device_copies_at_submit(false);
  }

  void remember(std::uint32_t ns, const std::vector<Token>& prompt) {
    const std::pair<std::uint32_t, std::vector<Token>> p{ns, prompt};
    if (std::find(prompts.begin(), prompts.end(), p) == prompts.end()) prompts.push_back(p);
  }

  /// What the current cache lost that a request could have resumed from.
  std::uint64_t lost() const {
    const CacheStats s = h.cache->stats();
    return s.kv_pages_dropped_gpu + s.kv_pages_dropped_host - s.dead_kv_pages_dropped +
           s.snapshots_dropped + s.transfers_failed + s.kv_pages_dropped_store +
           s.store_records_lost + s.store_failures;
  }

  /// Nothing a request could resume from was lost. Dead KV (no snapshot at or below it) is
  /// not counted: the cost-aware orders drop it first precisely because dropping it never
  /// shortens a usable match, and the model checks exactly that.
  bool lossless() const { return !refused && !lost_before && lost() == 0; }
};

using Cmd = rc::state::Command<Model, Sut>;

/// Prompts share prefixes: a cut of one of three base sequences, a short tail, one more token.
rc::Gen<std::vector<Token>> gen_prompt() {
  return rc::gen::apply(
      [](int base, std::size_t cut, std::vector<Token> tail) {
        std::vector<Token> p;
        for (std::size_t i = 0; i < cut; ++i) p.push_back(Token(1000 * (base + 1) + Token(i)));
        p.insert(p.end(), tail.begin(), tail.end());
        p.push_back(7);
        return p;
      },
      rc::gen::inRange(0, 3), rc::gen::inRange<std::size_t>(0, 49),
      rc::gen::mapcat(rc::gen::inRange<std::size_t>(0, 9), [](std::size_t n) {
        return rc::gen::container<std::vector<Token>>(n, rc::gen::inRange<Token>(1, 4));
      }));
}

void check_usable(const Model& m, Sut& s, std::uint32_t ns, const std::vector<Token>& prompt,
                  std::size_t cached, bool exact) {
  if (exact && s.lossless()) {
    RC_ASSERT(cached == m.usable(ns, prompt));
  } else {
    RC_ASSERT(cached <= deepest(Model::of(m.possible, ns), prompt));
    RC_ASSERT(m.knows(ns, prompt, cached));
  }
}

void check_invariants(Sut& s) {
  const std::string e = s.h.cache->check_invariants();
  if (!e.empty()) RC_FAIL(e);
  // A pinned prefix stays usable through any pressure, drop_host() included; only a failed
  // copy may take it (rule 7).
  if (s.h.cache->stats().transfers_failed == 0) {
    for (const auto& p : s.pins)
      RC_ASSERT(s.h.cache->match(p.prefix, p.ns).usable_tokens == p.prefix.size());
  }
}

struct Serve : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  std::vector<std::size_t> snaps = *rc::gen::container<std::vector<std::size_t>>(
      rc::gen::map(rc::gen::inRange<std::size_t>(1, 15), [](std::size_t p) { return p * kPage; }));
  std::size_t chunk = *rc::gen::inRange<std::size_t>(1, 4);
  Key key;
  explicit Serve(const Model& m) : key(m.namespaces) {}

  void checkPreconditions(const Model& m) const override { RC_PRE(m.held <= 1u); }
  /// Snapshots land at the chunk ends the request computes itself, after what it reused.
  void place(Prefixes& into, std::size_t reused_tokens) const {
    const std::size_t whole = prompt.size() / kPage;
    for (std::size_t done = reused_tokens / kPage; done < whole;) {
      done = std::min(whole, done + chunk);
      if (std::find(snaps.begin(), snaps.end(), done * kPage) != snaps.end())
        into.insert(std::vector<Token>(prompt.begin(), prompt.begin() + done * kPage));
    }
  }
  void apply(Model& m) const override {
    const std::size_t reused = m.usable(key.ns, prompt);
    place(m.exact[key.ns], reused);
    Prefixes more;
    for (std::size_t b = 0; b < prompt.size(); b += kPage)
      if (m.knows(key.ns, prompt, b)) place(more, b);
    m.possible[key.ns].insert(more.begin(), more.end());
    m.possible[key.ns].insert(m.exact[key.ns].begin(), m.exact[key.ns].end());
  }
  void run(const Model& m, Sut& s) const override {
    const bool lossless = s.lossless();
    const std::uint64_t misses = s.h.cache->stats().store_load_misses;
    s.remember(key.ns, prompt);
    s.h.request_options = key.options();
    auto r = s.h.serve(prompt, snaps, chunk);
    // The one refusal a valid serve may meet: the GPU pool is full of pages pinned by the held
    // requests and this one. It must be a clear out-of-memory that changed nothing; the
    // serve stops there, so from now on the model only knows which boundaries are possible.
    if (r.refused) {
      RC_ASSERT(r.error.find("GPU pool") != std::string::npos);
      RC_ASSERT(r.refusal_changed == "");
      s.refused = true;
    } else {
      RC_ASSERT(r.error == "");
    }
    RC_ASSERT(r.bytes_ok);
    // A store match the host had no room to stage (held requests keep their host copies)
    // resumes shallower: the model only knows which boundaries are possible for this one.
    if (lossless && s.lossless() && s.h.cache->stats().store_load_misses == misses) {
      RC_ASSERT(r.cached == m.usable(key.ns, prompt));
    } else {
      RC_ASSERT(m.knows(key.ns, prompt, r.cached));
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Serve(" << prompt.size() << " tokens, chunk " << chunk << " pages, snapshots at";
    for (auto b : snaps) os << ' ' << b;
    os << ", namespace " << key.ns << ", priority " << int(key.priority) << ")";
  }
};

/// Admits `prompt` as `key`, waits for what it reuses and checks it: the match the model
/// says (exactly while nothing was lost), and every reused byte. Returns the held lock.
LockId admit_and_check(const Model& m, Sut& s, const Key& key, const std::vector<Token>& prompt,
                       bool stream = false) {
  const bool lossless = s.lossless();
  s.remember(key.ns, prompt);
  s.h.request_options = key.options();  // the bytes checked below are this namespace's
  const std::uint64_t misses = s.h.cache->stats().store_load_misses;
  auto a = s.h.cache->admit(prompt, key.options());
  RC_ASSERT(a.is_ok());
  // A store batch refused at submission (a fault) already shortens the admission's match, as
  // does a store match the host has no room to stage.
  const bool missed = s.h.cache->stats().store_load_misses != misses;
  if (lossless && s.lossless() && !missed) {
    RC_ASSERT(a->cached_tokens == m.usable(key.ns, prompt));
  }
  if (stream && a->cached_tokens > 0) {
    // The contract of stream_wait(): the ids before the copies land; the bytes are committed
    // only when poll(lock) says kDone (else wait() says where to resume).
    const Status sw = s.h.cache->stream_wait(a->lock, nullptr, 0);
    RC_ASSERT(sw.is_ok() || sw.code() == ErrorCode::kTransferFailed);
    if (sw.is_ok()) {
      auto pages = s.h.cache->path_pages(a->lock);
      auto slot = s.h.cache->path_snapshot(a->lock);
      auto state = s.h.cache->poll(a->lock);
      RC_ASSERT(state.is_ok());
      if (*state == TransferState::kDone) {
        RC_ASSERT(pages.is_ok() && slot.is_ok());
        RC_ASSERT(pages->size() * kPage == a->cached_tokens);
        for (std::size_t i = 0; i < pages->size(); ++i)
          RC_ASSERT(s.h.page_ok((*pages)[i], prompt, i));
        RC_ASSERT(s.h.snapshot_ok(*slot, std::span(prompt).first(a->cached_tokens)));
      }
    }
    check_invariants(s);
  }
  auto resumed = s.h.cache->wait(a->lock);
  RC_ASSERT(resumed.is_ok());
  const std::size_t cached = *resumed;
  // Only a failed promotion (or load) makes the request resume below its match.
  RC_ASSERT(cached == a->cached_tokens || (cached < a->cached_tokens && !s.lossless()));
  check_usable(m, s, key.ns, prompt, cached, !missed);
  if (cached > 0) {
    auto pages = s.h.cache->path_pages(a->lock);
    RC_ASSERT(pages.is_ok());
    RC_ASSERT(pages->size() * kPage == cached);
    for (std::size_t i = 0; i < pages->size(); ++i) RC_ASSERT(s.h.page_ok((*pages)[i], prompt, i));
    auto slot = s.h.cache->path_snapshot(a->lock);
    RC_ASSERT(slot.is_ok());
    RC_ASSERT(s.h.snapshot_ok(*slot, std::span(prompt).first(cached)));
  }
  return a->lock;
}

struct Hold : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  bool stream = *rc::gen::arbitrary<bool>();  ///< stream_wait() before wait()
  Key key;
  explicit Hold(const Model& m) : key(m.namespaces) {}
  void checkPreconditions(const Model& m) const override { RC_PRE(m.held < 2u); }
  void apply(Model& m) const override { ++m.held; }
  void run(const Model& m, Sut& s) const override {
    s.held.push_back(admit_and_check(m, s, key, prompt, stream));
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Hold(" << prompt.size() << " tokens, namespace " << key.ns
       << (stream ? ", stream_wait" : "") << ")";
  }
};

struct Release : Cmd {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.held > 0u); }
  void apply(Model& m) const override { --m.held; }
  void run(const Model&, Sut& s) const override {
    RC_ASSERT(s.h.cache->release(s.held.back()).is_ok());
    RC_ASSERT(!s.h.cache->release(s.held.back()).is_ok());  // double release: an error
    s.held.pop_back();
    check_invariants(s);
  }
  void show(std::ostream& os) const override { os << "Release"; }
};

struct Pressure : Cmd {
  std::size_t pages = *rc::gen::inRange<std::size_t>(1, 33);
  void run(const Model&, Sut& s) const override {
    const LockId side = s.h.side_lock();
    s.h.quiesce();
    const testing::Fingerprint before = s.h.fingerprint({});
    auto got = s.h.cache->alloc_pages(side, pages);
    check_invariants(s);
    if (got) {
      for (GpuPageId p : *got) {  // scribble: freed pages must never be read as cached
        auto bytes = s.h.memory.gpu_page(p);
        std::fill(bytes.begin(), bytes.end(), std::byte{0xA5});
      }
      RC_ASSERT(s.h.cache->free_pages(s.h.side_lock(), *got).is_ok());
    } else {
      RC_ASSERT(got.status().code() == ErrorCode::kOutOfMemory);
      RC_ASSERT(before.difference(s.h.fingerprint({})) == "");  // a refusal changes nothing
    }
    s.h.quiesce();
    const testing::Fingerprint before_slot = s.h.fingerprint({});
    auto slot = s.h.cache->alloc_snapshot_slot(side);
    if (slot) {
      RC_ASSERT(s.h.cache->free_snapshot_slot(side, *slot).is_ok());
    } else {
      RC_ASSERT(slot.status().code() == ErrorCode::kOutOfMemory);
      RC_ASSERT(before_slot.difference(s.h.fingerprint({})) == "");
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override { os << "Pressure(" << pages << " pages)"; }
};

struct CompleteOne : Cmd {
  std::size_t pick = *rc::gen::arbitrary<std::size_t>();
  bool fail = *rc::gen::weightedElement<bool>({{19, false}, {1, true}});
  void run(const Model&, Sut& s) const override {
    auto pending = s.h.engine.pending();
    if (pending.empty()) return;
    const TicketId id = pending[pick % pending.size()];
    if (fail) s.h.engine.fail_ticket(id);
    s.h.engine.complete(id);
    s.h.cache->poll();
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << (fail ? "FailOne(" : "CompleteOne(") << pick << ")";
  }
};

struct FailNext : Cmd {
  void run(const Model&, Sut& s) const override { s.h.engine.fail_nth_submission(0); }
  void show(std::ostream& os) const override { os << "FailNextCopy"; }
};

/// Pins a prefix of a prompt (most are not cached prefixes: a clear refusal), or unpins the
/// oldest pin when two are held.
struct Pin : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  std::size_t pages = *rc::gen::inRange<std::size_t>(1, 15);
  Key key;
  explicit Pin(const Model& m) : key(m.namespaces) {}
  void run(const Model&, Sut& s) const override {
    if (s.pins.size() >= 2) {
      RC_ASSERT(s.h.cache->unpin(s.pins.front().pin).is_ok());
      RC_ASSERT(s.h.cache->unpin(s.pins.front().pin).code() == ErrorCode::kNotFound);
      s.pins.erase(s.pins.begin());
      check_invariants(s);
      return;
    }
    const std::size_t len = std::min(pages * kPage, prompt.size() / kPage * kPage);
    if (len == 0) return;
    std::vector<Token> prefix(prompt.begin(), prompt.begin() + len);
    const NamespaceId ns(key.ns);
    auto r = s.h.cache->pin(prefix, ns);
    if (r) {
      s.pins.push_back({*r, prefix, ns});
    } else {
      const ErrorCode c = r.status().code();
      // kFailedPrecondition: part of the prefix is on the store only (admit it first).
      RC_ASSERT(c == ErrorCode::kInvalidArgument || c == ErrorCode::kOutOfMemory ||
                c == ErrorCode::kTransferFailed ||
                (s.store && c == ErrorCode::kFailedPrecondition));
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Pin(" << pages << " pages, namespace " << key.ns << ")";
  }
};

/// Enters a prefix of a prompt as host-resident data, as the shared tier does after a fetch
/// (PrefixCache::import_host): the fill writes the bytes the model would have computed, so
/// every later serve checks them; one fill in five fails (nothing may enter then).
struct Import : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  std::size_t pages = *rc::gen::inRange<std::size_t>(1, 15);
  bool fail = *rc::gen::weightedElement<bool>({{4, false}, {1, true}});
  Key key;
  explicit Import(const Model& m) : key(m.namespaces) {}
  std::size_t length() const { return std::min(pages * kPage, prompt.size() / kPage * kPage); }
  /// The imported prefix has KV and a snapshot at its end, as if served with one there.
  void apply(Model& m) const override {
    const std::size_t len = length();
    if (len == 0 || fail) return;
    const std::vector<Token> prefix(prompt.begin(), prompt.begin() + len);
    m.exact[key.ns].insert(prefix);
    m.possible[key.ns].insert(prefix);
  }
  void run(const Model&, Sut& s) const override {
    const std::size_t len = length();
    if (len == 0) return;
    s.remember(key.ns, prompt);
    const std::span<const Token> tokens = std::span(prompt).first(len);
    const NamespaceId ns(key.ns);
    const std::uint64_t salt = ns.value() * 0xD6E8FEB86659FD93ull;  // Harness::salt()
    auto& mem = s.h.memory;
    const std::size_t pb = mem.page_bytes();
    const std::size_t sb = s.h.config.snapshot_bytes;
    auto fill = [&](std::size_t first, std::span<const HostPageId> kv,
                    std::span<const HostPageId> snapshot) {
      if (fail) return false;
      for (std::size_t i = 0; i < kv.size(); ++i) {
        const auto h = testing::prefix_hash(tokens.first((first + i + 1) * kPage)) ^ salt;
        auto bytes = mem.host_page(kv[i]);
        for (std::size_t b = 0; b < bytes.size(); ++b)
          bytes[b] = testing::expected_byte(h, b, 0x11);
      }
      const auto h = testing::prefix_hash(tokens) ^ salt;
      for (std::size_t j = 0; j < snapshot.size(); ++j) {
        auto bytes = mem.host_page(snapshot[j]);
        for (std::size_t b = 0; b < bytes.size() && j * pb + b < sb; ++b)
          bytes[b] = testing::expected_byte(h, j * pb + b, 0x77);
      }
      return true;
    };
    const std::size_t before = s.h.cache->match(tokens, ns).usable_tokens;
    auto r = s.h.cache->import_host(tokens, ns, fill);
    if (r) {
      RC_ASSERT(!fail || (r->kv_pages == 0 && !r->snapshot));
      // Whole, unless the snapshot cap dropped a snapshot of the path (counted as a loss).
      if (!fail && s.lossless()) RC_ASSERT(s.h.cache->match(tokens, ns).usable_tokens == len);
    } else {
      const ErrorCode c = r.status().code();
      RC_ASSERT(c == ErrorCode::kOutOfMemory || c == ErrorCode::kFailedPrecondition);
      RC_ASSERT(c == ErrorCode::kOutOfMemory || fail);
      // A refused fill enters nothing; no room may have evicted on the way (as making room
      // for a demotion does), never added.
      RC_ASSERT(s.h.cache->match(tokens, ns).usable_tokens <= before);
      if (c == ErrorCode::kFailedPrecondition && s.lossless())
        RC_ASSERT(s.h.cache->match(tokens, ns).usable_tokens == before);
      // The model placed what did not enter: from now on it knows only what is possible.
      if (!fail) s.refused = true;
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Import(" << pages << " pages, namespace " << key.ns << (fail ? ", fill fails" : "")
       << ")";
  }
};

/// Publishes a prefix as the shared tier does: reads its host copies (PrefixCache::
/// host_copies) and marks them published up to the deepest host snapshot (mark_published).
/// Publishing changes no residency: what a prompt can resume from stays as it was.
struct Publish : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  Key key;
  explicit Publish(const Model& m) : key(m.namespaces) {}
  void run(const Model&, Sut& s) const override {
    const NamespaceId ns(key.ns);
    const std::size_t whole = prompt.size() / kPage * kPage;
    const std::span<const Token> tokens = std::span(prompt).first(whole);
    const HostCopies copies = s.h.cache->host_copies(tokens, ns);
    const std::size_t deepest = copies.snapshots.empty() ? 0 : copies.snapshots.back().boundary;
    const MatchResult before = s.h.cache->match(prompt, ns);
    s.h.cache->mark_published(tokens.first(deepest), ns);
    const MatchResult after = s.h.cache->match(prompt, ns);
    RC_ASSERT(after.usable_tokens == before.usable_tokens);
    RC_ASSERT(after.kv_tokens == before.kv_tokens);
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Publish(" << prompt.size() << " tokens, namespace " << key.ns << ")";
  }
};

struct DropHost : Cmd {
  void run(const Model&, Sut& s) const override {
    s.h.cache->drop_host();
    check_invariants(s);
  }
  void show(std::ostream& os) const override { os << "DropHost"; }
};

/// evict() on one tier (issue 15 item 6): on GPU it frees what the free counts show, and at
/// least what was asked as far as sizes() said was evictable; demotions are not losses.
struct Evict : Cmd {
  bool host = *rc::gen::arbitrary<bool>();
  std::size_t pages = *rc::gen::inRange<std::size_t>(0, 12);
  std::uint32_t snapshots = *rc::gen::inRange<std::uint32_t>(0, 4);
  void run(const Model&, Sut& s) const override {
    s.h.quiesce();
    const CacheSizes sizes = s.h.cache->sizes();
    const Occupancy before = s.h.cache->occupancy();
    // Eviction may wait for a device copy (a materialization holds pages it may take once it
    // lands): its landing frees the slot it read, and a failed one its pages.
    const bool device = s.h.cache->device_copies_in_flight() > 0;
    auto r = s.h.cache->evict({pages * kPage, snapshots, host ? Tier::kHost : Tier::kGpu});
    RC_ASSERT(r.is_ok());
    if (!host) {
      const Occupancy after = s.h.cache->occupancy();
      // One GPU pool: a snapshot frees its pages; live slots hold requests and never evict.
      const std::size_t snap_pages = s.h.cache->config().snapshot_pages();
      const std::size_t freed = r->kv_pages + r->snapshots * snap_pages;
      const std::size_t gained = after.gpu_pages_free - before.gpu_pages_free;
      const bool pages_ok = device ? gained >= freed : gained == freed;
      const bool slots_ok = device ? after.gpu_slots_free >= before.gpu_slots_free
                                   : after.gpu_slots_free == before.gpu_slots_free;
      RC_ASSERT(pages_ok);
      RC_ASSERT(slots_ok);
      RC_ASSERT(r->kv_pages >= std::min(pages, sizes.gpu.kv_pages_evictable));
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Evict(" << pages << " pages, " << snapshots << " snapshots, " << (host ? "host" : "gpu")
       << ")";
  }
};

/// The deepest boundary of what admit(prompt) matches whose every node has its KV on the
/// store and whose end has its snapshot there: what a cache rebuilt from the store finds.
std::size_t store_usable(const PrefixCache& cache, const std::vector<Token>& prompt) {
  std::size_t best = 0;
  for (const NodeInfo& n : cache.inspect(std::span(prompt).first(prompt.size() - 1))) {
    if (n.matched < n.boundary || !n.kv_on_store) break;
    if (n.snapshot_on_store) best = n.boundary;
  }
  return best;
}

/// A store fault (issue 13): the next write batch fails (nothing committed), a record's bytes
/// rot (its read reports kDataLoss), the next read reports an I/O error (the record stays),
/// or the next batch is refused at submission. Each may cost a recompute, never a wrong byte.
struct StoreFault : Cmd {
  int kind = *rc::gen::inRange(0, 4);
  std::size_t pick = *rc::gen::arbitrary<std::size_t>();
  void checkPreconditions(const Model& m) const override { RC_PRE(m.store); }
  void run(const Model&, Sut& s) const override {
    switch (kind) {
      case 0:
        s.store->fail_next_writes(1);
        break;
      case 1: {
        const std::vector<StoredRecord> records = s.store->records();
        if (!records.empty()) s.store->corrupt(records[pick % records.size()].id);
        break;
      }
      case 2:
        s.store->io_error_next_reads(1);
        break;
      default:
        s.store->refuse_next(1);
        break;
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    static constexpr const char* kNames[] = {"FailNextStoreWrite", "LoseStoreRecord",
                                             "StoreReadError", "RefuseNextStoreBatch"};
    os << kNames[kind] << "(" << pick << ")";
  }
};

/// Store copies complete when the cache polls (off) or only when it waits for them (held), so
/// writes and loads land in any order relative to the other commands.
struct StoreTiming : Cmd {
  bool hold = *rc::gen::arbitrary<bool>();
  void checkPreconditions(const Model& m) const override { RC_PRE(m.store); }
  void run(const Model&, Sut& s) const override {
    s.store->hold(hold);
    if (!hold) s.store->release();
    s.h.cache->poll();
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << (hold ? "HoldStoreCopies" : "ReleaseStoreCopies");
  }
};

/// A process restart on the same store. Graceful: every request finishes, persist(), the
/// cache goes. Crash (kill -9): requests and copies in flight die with the process, the store
/// keeps each record committed since its last sync or not (MemoryStoreEngine::crash). The new
/// cache holds the default namespace's tree as the store had it, no other namespace, and
/// every prefix it serves has the model's bytes.
struct Restart : Cmd {
  bool graceful = *rc::gen::arbitrary<bool>();
  std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  void checkPreconditions(const Model& m) const override { RC_PRE(m.store); }
  void apply(Model& m) const override {
    m.held = 0;
    // Other namespaces live in process memory only: a new process has none of them.
    for (std::uint32_t ns = 1; ns < m.namespaces; ++ns) m.exact.erase(ns);
  }
  void run(const Model& m, Sut& s) const override {
    if (graceful) {
      for (LockId l : s.held) RC_ASSERT(s.h.cache->release(l).is_ok());
      for (const auto& p : s.pins) RC_ASSERT(s.h.cache->unpin(p.pin).is_ok());
    }
    s.held.clear();
    s.pins.clear();
    bool lossless = s.lossless();
    if (graceful) {
      const std::uint64_t lost = s.lost();
      const Status persisted = s.h.cache->persist();
      check_invariants(s);
      // persist() fails only where a fault was injected (counted) or room ran out (it says so).
      RC_ASSERT(persisted.is_ok() || s.lost() > lost ||
                persisted.code() == ErrorCode::kOutOfMemory);
      // OK: nothing failed and every live KV node and snapshot has a store copy.
      lossless = lossless && persisted.is_ok() && s.lost() == lost;
    }
    std::vector<std::size_t> before;  // per remembered prompt: what the store can serve
    for (const auto& [ns, prompt] : s.prompts) {
      const std::size_t on_store = ns == 0 ? store_usable(*s.h.cache, prompt) : 0;
      // After persist() with room, the store has every usable match of the default namespace.
      if (graceful && lossless && ns == 0)
        RC_ASSERT(on_store ==
                  s.h.cache->match(std::span(prompt).first(prompt.size() - 1)).usable_tokens);
      before.push_back(on_store);
    }
    if (!graceful) s.store->crash(seed);
    const Status made = s.h.restart(false, [&] { s.store->reopen(); });
    RC_ASSERT(made.is_ok());
    s.lost_before = !(graceful && lossless);
    s.refused = false;  // the refused serve's request is gone with its process
    check_invariants(s);
    for (std::size_t i = 0; i < s.prompts.size(); ++i) {
      const auto& [ns, prompt] = s.prompts[i];
      const MatchResult now = s.h.cache->match(prompt, NamespaceId(ns));
      if (ns != 0) {
        RC_ASSERT(now.kv_tokens == 0u);  // nothing of another namespace survives
        continue;
      }
      const std::size_t usable =
          s.h.cache->match(std::span(prompt).first(prompt.size() - 1)).usable_tokens;
      // Graceful: exactly what the store held; a crash may lose what was not durable.
      if (graceful) {
        RC_ASSERT(usable == before[i]);
      } else {
        RC_ASSERT(usable <= before[i]);
      }
    }
    // Every remembered default-namespace prompt, served again from the store: byte-exact.
    for (const auto& [ns, prompt] : s.prompts) {
      if (ns != 0) continue;
      const LockId lock = admit_and_check(m, s, Key(0, RequestOptions{}.priority), prompt);
      RC_ASSERT(s.h.cache->release(lock).is_ok());
      check_invariants(s);
    }
  }
  void show(std::ostream& os) const override {
    os << (graceful ? "Restart(graceful)" : "Restart(crash, seed ")
       << (graceful ? "" : std::to_string(seed) + ")");
  }
};

/// One property run. `store_slots` > 0: a store tier of that many slots below the host pool
/// (the store commands and Restart join in); `namespaces`: 1 keeps every request in the
/// default namespace, the one the store keeps, so the exact checks hold across restarts.
void run_property(WritePolicy policy, std::uint32_t host_pages,
                  std::uint32_t max_snapshots_per_path = 0, std::uint64_t store_slots = 0,
                  std::uint32_t namespaces = 2, std::uint32_t host_snapshot_slots = 8) {
  CacheConfig c = testing::small_config(policy);
  c.host_pages = host_pages;
  c.host_snapshot_slots = host_snapshot_slots;
  c.max_snapshots_per_path = max_snapshots_per_path;
  // Off, or demoting ahead of need (the watermark step runs in the same commands).
  c.gpu_free_low_watermark = *rc::gen::element(0.0, 0.125, 0.25);
  c.gpu_free_high_watermark = 2 * c.gpu_free_low_watermark;
  if (store_slots > 0) {  // the host watermark: writing to the store ahead of need, or not
    c.host_free_low_watermark = *rc::gen::element(0.0, 0.125, 0.25);
    c.host_free_high_watermark = 2 * c.host_free_low_watermark;
  }
  Sut sut(c, store_slots);
  Model model;
  model.namespaces = namespaces;
  model.store = store_slots > 0;
  rc::state::check(
      model, sut,
      rc::state::gen::execOneOfWithArgs<Serve, Serve, Serve, Hold, Release, Pressure, Pressure,
                                        CompleteOne, CompleteOne, FailNext, DropHost, Evict, Pin,
                                        Import, Publish, StoreFault, StoreTiming, Restart>());
  for (LockId l : sut.held) RC_ASSERT(sut.h.cache->release(l).is_ok());
  for (const auto& p : sut.pins) RC_ASSERT(sut.h.cache->unpin(p.pin).is_ok());
  sut.pins.clear();  // unpinned: the final check must not expect them usable any more
  if (sut.store) {
    sut.store->hold(false);
    sut.store->release();
  }
  sut.h.settle();
  check_invariants(sut);
  const CacheStats st = sut.h.cache->stats();
  RC_CLASSIFY(st.kv_pages_promoted > 0, "promoted KV");
  RC_CLASSIFY(st.snapshots_promoted > 0, "promoted a snapshot");
  RC_CLASSIFY(st.transfers_failed > 0, "a copy failed");
  RC_CLASSIFY(st.kv_pages_dropped_host > 0, "dropped host KV");
  RC_CLASSIFY(st.dead_kv_pages_dropped > 0, "dropped dead KV");
  RC_CLASSIFY(!sut.pins.empty(), "a pin held at the end");
  if (sut.store) {
    RC_CLASSIFY(st.kv_pages_loaded > 0, "loaded KV from the store");
    RC_CLASSIFY(st.restored_kv_pages > 0, "restored KV after a restart");
    RC_CLASSIFY(st.store_failures > 0, "a store copy failed");
    RC_CLASSIFY(st.staged_loads > 0, "staged a store match through host");
    RC_CLASSIFY(sut.lossless(), "nothing lost: exact checks throughout");
  }
}

RC_GTEST_PROP(PrefixCacheProperty, WriteBackAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 64);
}

RC_GTEST_PROP(PrefixCacheProperty, WriteThroughAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteThrough, 64);
}

RC_GTEST_PROP(PrefixCacheProperty, SmallHostAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 12);
}

// Issue 15 item 10: with the cap, every path keeps at most 2 snapshots (check_invariants) and
// what is reused is still byte-exact and a boundary the model knows.
RC_GTEST_PROP(PrefixCacheProperty, SnapshotCapAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 64, 2);
}

// Issue 13: a small store below a small host pool (host victims go to the store and come
// back), restarts (graceful and crashes) and store faults; requests in two namespaces, so
// the restart also checks that only the default one survives.
RC_GTEST_PROP(PrefixCacheProperty, StoreAndRestartAgreeWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 12, 0, 60);
}

// Issue 25 item 4: a host pool of 7 pages (2 of KV and one snapshot's 5) below GPU and above
// the store: store matches longer than host can make room for are staged a chunk at a time
// (store faults, held copies and restarts included).
RC_GTEST_PROP(PrefixCacheProperty, TinyHostStagesStoreMatchesAndAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 2, 0, 60, 2, 1);
}

// The per-path snapshot cap with a store: a cap victim's store copy goes too.
RC_GTEST_PROP(PrefixCacheProperty, StoreWithSnapshotCapAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteBack, 12, 2, 60);
}

// The same with every request in the default namespace and a store that holds what the
// cache makes: the exact checks (match == model) hold across graceful restarts.
RC_GTEST_PROP(PrefixCacheProperty, DefaultNamespaceSurvivesRestartExactly, ()) {
  run_property(WritePolicy::kWriteBack, 12, 0, 400, 1);
}

// Write-through with a store whose copies land only when waited for: an allocation that needs
// the GPU copy of a node mid-store-write waits for that write (it used to evict others and then
// fail, breaking rule 8: seed 13004162534369575306 found it).
RC_GTEST_PROP(PrefixCacheProperty, WriteThroughStoreAgreesWithModel, ()) {
  run_property(WritePolicy::kWriteThrough, 24, 2, 60);
}

}  // namespace
}  // namespace radixtier
