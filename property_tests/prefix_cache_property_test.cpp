// Stateful property test of PrefixCache against a simple model.
//
// The model remembers which prefixes were inserted with a snapshot. After every command:
//  - check_invariants() passes (rules 2, 3, 4 and the tree's shape);
//  - every byte a request reuses equals what was written for that prefix (rule 5);
//  - the usable match agrees with the model (rule 1): exactly while nothing was lost, and
//    once something was dropped or a copy failed, it is still a boundary the model knows
//    (never a wrong or shorter-than-claimed one, never bytes that are not there).
// Transfers complete only when a command says so, in any order; some fail. Requests come in
// two key namespaces whose "model" bytes differ (Harness::salt()) and at random retention
// priorities: the model keeps one set of prefixes per namespace, so a match or a byte shared
// across namespaces fails the checks, and priorities reorder eviction without breaking any.
// Reproduce a failure with RC_PARAMS="seed=N" (rapidcheck prints the seed).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <map>
#include <set>

#include "../tests/cache_harness.hpp"

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
  std::size_t held = 0;  ///< admissions holding their lock

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

/// A request's namespace (two of them) and retention priority.
struct Key {
  std::uint32_t ns = *rc::gen::inRange<std::uint32_t>(0, 2);
  RetentionPriority priority = static_cast<RetentionPriority>(*rc::gen::inRange(0, 101));
  RequestOptions options() const { return RequestOptions{NamespaceId(ns), priority}; }
};

struct Sut {
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
  explicit Sut(const CacheConfig& c) : h(c) {}

  /// Nothing a request could resume from was lost. Dead KV (no snapshot at or below it) is
  /// not counted: the cost-aware orders drop it first precisely because dropping it never
  /// shortens a usable match, and the model checks exactly that.
  bool lossless() const {
    const CacheStats s = h.cache->stats();
    const std::uint64_t lost = s.kv_pages_dropped_gpu + s.kv_pages_dropped_host -
                               s.dead_kv_pages_dropped + s.snapshots_dropped + s.transfers_failed;
    return !refused && lost == 0;
  }
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
                  std::size_t cached) {
  if (s.lossless()) {
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
    s.h.request_options = key.options();
    auto r = s.h.serve(prompt, snaps, chunk);
    // The one refusal a valid serve may meet: the GPU pool is full of pages pinned by the held
    // requests and this one. It must be a clear out-of-memory that changed nothing; the
    // serve stops there, so from now on the model only knows which boundaries are possible.
    if (r.refused) {
      RC_ASSERT(r.error.find("GPU KV pool") != std::string::npos);
      RC_ASSERT(r.refusal_changed == "");
      s.refused = true;
    } else {
      RC_ASSERT(r.error == "");
    }
    RC_ASSERT(r.bytes_ok);
    if (lossless && s.lossless()) {
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

struct Hold : Cmd {
  std::vector<Token> prompt = *gen_prompt();
  Key key;
  void checkPreconditions(const Model& m) const override { RC_PRE(m.held < 2u); }
  void apply(Model& m) const override { ++m.held; }
  void run(const Model& m, Sut& s) const override {
    const bool lossless = s.lossless();
    s.h.request_options = key.options();  // the bytes checked below are this namespace's
    auto a = s.h.cache->admit(prompt, key.options());
    RC_ASSERT(a.is_ok());
    if (lossless) RC_ASSERT(a->cached_tokens == m.usable(key.ns, prompt));
    s.held.push_back(a->lock);
    auto resumed = s.h.cache->wait(a->lock);
    RC_ASSERT(resumed.is_ok());
    const std::size_t cached = *resumed;
    // Only a failed promotion makes the request resume below its match.
    RC_ASSERT(cached == a->cached_tokens || (cached < a->cached_tokens && !s.lossless()));
    check_usable(m, s, key.ns, prompt, cached);
    if (cached > 0) {
      auto pages = s.h.cache->path_pages(a->lock);
      RC_ASSERT(pages.is_ok());
      RC_ASSERT(pages->size() * kPage == cached);
      for (std::size_t i = 0; i < pages->size(); ++i)
        RC_ASSERT(s.h.page_ok((*pages)[i], prompt, i));
      auto slot = s.h.cache->path_snapshot(a->lock);
      RC_ASSERT(slot.is_ok());
      RC_ASSERT(s.h.snapshot_ok(*slot, std::span(prompt).first(cached)));
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Hold(" << prompt.size() << " tokens, namespace " << key.ns << ")";
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
    s.h.cache->poll();
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
    s.h.cache->poll();
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
      RC_ASSERT(c == ErrorCode::kInvalidArgument || c == ErrorCode::kOutOfMemory ||
                c == ErrorCode::kTransferFailed);
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Pin(" << pages << " pages, namespace " << key.ns << ")";
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
    s.h.cache->poll();
    const CacheSizes sizes = s.h.cache->sizes();
    const Occupancy before = s.h.cache->occupancy();
    auto r = s.h.cache->evict({pages * kPage, snapshots, host ? Tier::kHost : Tier::kGpu});
    RC_ASSERT(r.is_ok());
    if (!host) {
      const Occupancy after = s.h.cache->occupancy();
      RC_ASSERT(after.gpu_pages_free - before.gpu_pages_free == r->kv_pages);
      RC_ASSERT(after.gpu_slots_free - before.gpu_slots_free == r->snapshots);
      RC_ASSERT(r->kv_pages >= std::min(pages, sizes.gpu.kv_pages_evictable));
    }
    check_invariants(s);
  }
  void show(std::ostream& os) const override {
    os << "Evict(" << pages << " pages, " << snapshots << " snapshots, " << (host ? "host" : "gpu")
       << ")";
  }
};

void run_property(WritePolicy policy, std::uint32_t host_pages,
                  std::uint32_t max_snapshots_per_path = 0) {
  CacheConfig c = testing::small_config(policy);
  c.host_pages = host_pages;
  c.max_snapshots_per_path = max_snapshots_per_path;
  // Off, or demoting ahead of need (the watermark step runs in the same commands).
  c.gpu_free_low_watermark = *rc::gen::element(0.0, 0.125, 0.25);
  c.gpu_free_high_watermark = 2 * c.gpu_free_low_watermark;
  Sut sut(c);
  rc::state::check(Model{}, sut,
                   rc::state::gen::execOneOfWithArgs<Serve, Serve, Serve, Hold, Release, Pressure,
                                                     Pressure, CompleteOne, CompleteOne, FailNext,
                                                     DropHost, Evict, Pin>());
  for (LockId l : sut.held) RC_ASSERT(sut.h.cache->release(l).is_ok());
  for (const auto& p : sut.pins) RC_ASSERT(sut.h.cache->unpin(p.pin).is_ok());
  sut.h.settle();
  check_invariants(sut);
  const CacheStats st = sut.h.cache->stats();
  RC_CLASSIFY(st.kv_pages_promoted > 0, "promoted KV");
  RC_CLASSIFY(st.snapshots_promoted > 0, "promoted a snapshot");
  RC_CLASSIFY(st.transfers_failed > 0, "a copy failed");
  RC_CLASSIFY(st.kv_pages_dropped_host > 0, "dropped host KV");
  RC_CLASSIFY(st.dead_kv_pages_dropped > 0, "dropped dead KV");
  RC_CLASSIFY(!sut.pins.empty(), "a pin held at the end");
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

}  // namespace
}  // namespace radixtier
