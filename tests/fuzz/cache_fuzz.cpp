// The PrefixCache fuzz driver (see cache_fuzz.hpp for what it checks and the input layout).
#include "cache_fuzz.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "../cache_harness.hpp"
#include "../memory_store_engine.hpp"

namespace radixtier::fuzz {
namespace {

using testing::Fingerprint;
using testing::Harness;

constexpr std::size_t kMaxRequests = 4;
constexpr std::size_t kMaxKnownPrompts = 24;
constexpr std::byte kScribble{0xA5};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> data) : data_(data) {}
  std::uint8_t u8() { return pos_ < data_.size() ? data_[pos_++] : 0; }
  bool done() const { return pos_ >= data_.size(); }

 private:
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
};

/// The store tier's size in slots by header flags bits 6-7 (0: none).
constexpr std::uint64_t kStoreSlots[] = {0, 24, 60, 200};

/// Header: [flags: bit 0 write-through, bit 1 utility snapshot eviction, bit 2 page size 2
/// (else 4), bit 3 at most 2 snapshots per path, bit 4 load back only 2 pages or more, bit 5
/// GPU watermarks 25% / 50%, bits 6-7 a store of kStoreSlots slots]
/// [gpu pages 8 + b % 33] [host pages {0, 12, 24, 64}] [GPU slots 1 + b % 4]
/// [host slots {0, 2, 8}] [slice pages 1 + b % 4]. Invalid combinations are skipped.
std::optional<CacheConfig> decode_config(Reader& in, std::uint64_t& store_slots) {
  const std::uint8_t flags = in.u8();
  store_slots = kStoreSlots[flags >> 6];
  CacheConfig c =
      testing::small_config(flags & 1 ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack);
  c.snapshot_eviction = flags & 2 ? SnapshotEviction::kUtility : SnapshotEviction::kLru;
  c.page_size = flags & 4 ? 2 : 4;
  if (flags & 8) c.max_snapshots_per_path = 2;
  if (flags & 16) c.load_back_min_tokens = 2 * c.page_size;
  if (flags & 32) {  // the watermark step: demote ahead of need
    c.gpu_free_low_watermark = 0.25;
    c.gpu_free_high_watermark = 0.5;
  }
  c.gpu_pages = 8 + in.u8() % 33;
  static constexpr std::uint32_t kHostPages[] = {0, 12, 24, 64};
  c.host_pages = kHostPages[in.u8() % 4];
  c.gpu_snapshot_slots = 1 + in.u8() % 4;
  static constexpr std::uint32_t kHostSlots[] = {0, 2, 8};
  c.host_snapshot_slots = kHostSlots[in.u8() % 3];
  c.slice_pages = 1 + in.u8() % 4;
  if (!c.validate()) return std::nullopt;
  return c;
}

/// A running request as the driver models it.
struct Request {
  LockId lock;
  std::vector<Token> prompt;
  std::size_t cached = 0;                  ///< the admission's usable match
  std::size_t lock_boundary = 0;           ///< tokens the lock covers: an insert may not end before
  bool verified = false;                   ///< the reused prefix arrived and was checked (or none)
  std::vector<GpuPageId> table;            ///< the page of each position computed or reused so far
  std::optional<GpuSlotId> resume;         ///< the reused snapshot (read-only)
  std::map<GpuPageId, std::size_t> pages;  ///< pages it owns -> the position written there
  std::map<GpuSlotId, std::size_t> slots;  ///< slots it owns -> the boundary written there
};

class Driver;
using OpFn = void (Driver::*)(Reader&);
struct OpEntry {
  const char* name;
  OpFn fn;
};

class Driver {
 public:
  Driver(const CacheConfig& c, std::uint64_t store_slots)
      : store_(store_slots ? std::make_unique<testing::MemoryStoreEngine>(c, store_slots)
                           : nullptr),
        h_(c, HostTransferEngine::Mode::kManual, store_.get()),
        trace_(std::getenv("RADIXTIER_FUZZ_TRACE")) {
    if (store_) store_->attach(h_.memory);
  }

  void run(Reader& in);

 private:
  // --- the operations (cache_fuzz.hpp lists their arguments) --------------------------------
  void admit(Reader& in);
  void poll_lock(Reader& in);
  void wait(Reader& in);
  void compute(Reader& in);
  void insert(Reader& in);
  void free_duplicates_op(Reader& in);
  void free_tail(Reader& in);
  void free_slot(Reader& in);
  void release(Reader& in);
  void pressure(Reader& in);
  void pressure_slot(Reader& in);
  void unpressure(Reader& in);
  void complete_copy(Reader& in);
  void delay_copy(Reader& in);
  void resume_copy(Reader& in);
  void fail_next(Reader& in);
  void poll(Reader&) { h_.cache->poll(); }
  void drain(Reader&);
  void drop_host(Reader&) { h_.cache->drop_host(); }
  void settle(Reader& in);
  void bad_argument(Reader& in);
  void evict(Reader& in);
  void peek(Reader& in);
  void restart(Reader& in);
  void store_fault(Reader& in);

  static constexpr OpEntry kOps[] = {
      {"admit", &Driver::admit},
      {"poll(lock)", &Driver::poll_lock},
      {"wait", &Driver::wait},
      {"compute", &Driver::compute},
      {"insert", &Driver::insert},
      {"free duplicates", &Driver::free_duplicates_op},
      {"free tail", &Driver::free_tail},
      {"free slot", &Driver::free_slot},
      {"release", &Driver::release},
      {"pressure", &Driver::pressure},
      {"pressure slot", &Driver::pressure_slot},
      {"unpressure", &Driver::unpressure},
      {"complete copy", &Driver::complete_copy},
      {"delay copy", &Driver::delay_copy},
      {"resume copy", &Driver::resume_copy},
      {"fail next", &Driver::fail_next},
      {"poll", &Driver::poll},
      {"drain", &Driver::drain},
      {"drop host", &Driver::drop_host},
      {"settle", &Driver::settle},
      {"bad argument", &Driver::bad_argument},
      {"evict", &Driver::evict},
      {"peek", &Driver::peek},
      {"restart", &Driver::restart},
      {"store fault", &Driver::store_fault},
  };
  static_assert(std::size(kOps) == kOpCount, "one table entry per Op, in order");

  // --- checks ----------------------------------------------------------------------------
  [[noreturn]] void fail(const std::string& what) const;
  void expect(bool ok, const std::string& what) const {
    if (!ok) fail(what);
  }
  void check_all();
  /// After poll(): what a rejected call must leave as it is.
  Fingerprint settled() {
    h_.quiesce();
    return h_.fingerprint(known_);
  }
  void expect_unchanged(const Fingerprint& before, const std::string& call) const {
    const std::string d = before.difference(h_.fingerprint(known_));
    if (!d.empty()) fail(call + " was rejected but changed the cache: " + d);
  }
  /// An allocation refused: only kOutOfMemory, and it changed nothing.
  void expect_refusal(const Status& s, const Fingerprint& before, const std::string& call) const {
    if (s.code() != ErrorCode::kOutOfMemory) fail(call + " failed: " + s.to_string());
    expect_unchanged(before, call);
  }

  // --- helpers ---------------------------------------------------------------------------
  std::uint32_t ps() const { return h_.ps(); }
  Request* pick(Reader& in) {
    const std::uint8_t b = in.u8();
    return live_.empty() ? nullptr : &live_[b % live_.size()];
  }
  std::vector<Token> decode_prompt(Reader& in);
  void verify_reused(Request& r);
  void lose_reused(Request& r);
  void free_duplicates(Request& r);
  LockId page_owner(GpuPageId id) const;
  LockId slot_owner(GpuSlotId id) const;
  std::vector<TicketId> copies(bool delayed);
  /// The deepest boundary of what admit(prompt) matches that is all on the store.
  std::size_t store_usable(const std::vector<Token>& prompt) const;

  /// The store tier (none when null); it outlives every cache h_ makes on it.
  std::unique_ptr<testing::MemoryStoreEngine> store_;
  Harness h_;
  bool trace_;
  std::vector<Request> live_;
  std::vector<std::vector<Token>> known_;
  std::vector<LockId> released_;
  std::vector<GpuPageId> pressure_pages_;  ///< held by the side lock, scribbled
  std::vector<GpuSlotId> pressure_slots_;
  std::vector<TicketId> delayed_;
  std::vector<const char*> log_;  ///< the operations run so far
};

[[noreturn]] void Driver::fail(const std::string& what) const {
  std::fprintf(stderr, "radixtier cache fuzz: check failed after %zu operations:\n  ", log_.size());
  for (const char* op : log_) std::fprintf(stderr, "%s; ", op);
  std::fprintf(stderr, "\n  %s\n", what.c_str());
  std::abort();
}

std::vector<Token> Driver::decode_prompt(Reader& in) {
  const std::uint8_t s = in.u8();
  if ((s & kKnownPrompt) && !known_.empty()) return known_[(s & 0x7f) % known_.size()];
  std::vector<Token> p;
  const std::size_t cut = in.u8() % 41;
  for (std::size_t i = 0; i < cut; ++i) p.push_back(Token(1000 * (s % 4 + 1) + Token(i)));
  for (std::size_t n = in.u8() % 5; n > 0; --n) p.push_back(Token(1 + in.u8() % 3));
  p.push_back(7);
  if (known_.size() < kMaxKnownPrompts &&
      std::find(known_.begin(), known_.end(), p) == known_.end())
    known_.push_back(p);
  return p;
}

LockId Driver::page_owner(GpuPageId id) const {
  for (const Request& r : live_)
    if (r.pages.count(id)) return r.lock;
  if (std::find(pressure_pages_.begin(), pressure_pages_.end(), id) != pressure_pages_.end())
    return h_.side_;
  return LockId();
}

LockId Driver::slot_owner(GpuSlotId id) const {
  // The slot a request resumed from is its own live slot (issue 21), read-only here.
  for (const Request& r : live_)
    if (r.slots.count(id) || r.resume == id) return r.lock;
  if (std::find(pressure_slots_.begin(), pressure_slots_.end(), id) != pressure_slots_.end())
    return h_.side_;
  return LockId();
}

/// Pending copies that are (delayed) or are not (!delayed) held by delay_copy.
std::vector<TicketId> Driver::copies(bool delayed) {
  const std::vector<TicketId> pending = h_.engine.pending();
  std::erase_if(delayed_, [&](TicketId id) {
    return std::find(pending.begin(), pending.end(), id) == pending.end();
  });
  if (delayed) return delayed_;
  std::vector<TicketId> out;
  for (TicketId id : pending)
    if (std::find(delayed_.begin(), delayed_.end(), id) == delayed_.end()) out.push_back(id);
  return out;
}

// ---------------------------------------------------------------------------------------
// checks

void Driver::check_all() {
  if (std::string e = h_.cache->check_invariants(); !e.empty()) fail("invariant: " + e);
  for (const Request& r : live_) {
    for (std::size_t i = 0; i < r.table.size(); ++i)
      expect(h_.page_ok(r.table[i], r.prompt, i),
             "page " + std::to_string(i) + " (GPU page " + std::to_string(r.table[i].value()) +
                 ") of running request " + std::to_string(r.lock.value()) + " lost its bytes");
    if (r.resume)
      expect(h_.snapshot_ok(*r.resume, std::span(r.prompt).first(r.cached)),
             "the snapshot a running request resumed from lost its bytes");
    for (auto [slot, boundary] : r.slots)
      expect(h_.snapshot_ok(slot, std::span(r.prompt).first(boundary)),
             "a snapshot slot a request owns lost its bytes");
  }
  for (GpuPageId p : pressure_pages_)
    for (std::byte b : h_.memory.gpu_page(p))
      expect(b == kScribble, "a page held for pressure was written by someone else");
  for (GpuSlotId s : pressure_slots_)
    for (std::byte b : h_.memory.gpu_snapshot(s))
      expect(b == kScribble, "a slot held for pressure was written by someone else");
}

void Driver::verify_reused(Request& r) {
  auto pages = h_.cache->path_pages(r.lock);
  expect(pages.is_ok(), "path_pages after the prefix arrived: " + pages.status().to_string());
  expect(pages->size() * ps() == r.cached, "path_pages does not cover the usable match");
  for (std::size_t i = 0; i < pages->size(); ++i)
    expect(h_.page_ok((*pages)[i], r.prompt, i),
           "reused page " + std::to_string(i) + " has bytes of another prefix");
  auto slot = h_.cache->path_snapshot(r.lock);
  expect(slot.is_ok(), "path_snapshot after the prefix arrived: " + slot.status().to_string());
  expect(h_.snapshot_ok(*slot, std::span(r.prompt).first(r.cached)),
         "the reused snapshot has bytes of another prefix");
  r.table = *pages;
  r.resume = *slot;
  r.verified = true;
}

/// The admission's promotion failed: nothing of it is reused; the request recomputes from 0.
void Driver::lose_reused(Request& r) {
  r.verified = true;
  r.table.clear();
  r.resume.reset();
}

void Driver::free_duplicates(Request& r) {
  auto tree = h_.cache->path_pages(r.lock);
  if (!tree) return;  // a copy onto the path is still arriving, or failed: keep own pages
  expect(tree->size() * ps() == r.lock_boundary, "path_pages does not cover the locked path");
  std::vector<GpuPageId> dup;
  for (std::size_t i = 0; i < tree->size(); ++i) {
    expect(h_.page_ok((*tree)[i], r.prompt, i),
           "the tree's page " + std::to_string(i) + " has bytes of another prefix");
    if (i >= r.table.size()) continue;  // free_tail forgot it: computed again if needed
    if (r.table[i] == (*tree)[i]) continue;
    expect(r.pages.count(r.table[i]) == 1, "a table page is neither the request's nor the tree's");
    dup.push_back(r.table[i]);
    r.table[i] = (*tree)[i];
  }
  Status s = h_.cache->free_pages(r.lock, dup);
  expect(s.is_ok(), "free_pages of own duplicates: " + s.to_string());
  for (GpuPageId p : dup) r.pages.erase(p);
}

// ---------------------------------------------------------------------------------------
// operations

void Driver::admit(Reader& in) {
  std::vector<Token> prompt = decode_prompt(in);
  if (live_.size() >= kMaxRequests) return;
  auto a = h_.cache->admit(prompt);
  expect(a.is_ok(), "admit failed: " + a.status().to_string());
  expect(a->cached_tokens % ps() == 0 && a->cached_tokens < prompt.size(),
         "admit: the usable match is not a page multiple below the prompt size");
  expect(a->kv_tokens >= a->cached_tokens, "admit: kv_tokens below the usable match");
  expect(a->gpu_tokens + a->host_tokens == a->cached_tokens,
         "admit: GPU and host tokens do not add up to the usable match");
  Request r;
  r.lock = a->lock;
  r.prompt = std::move(prompt);
  r.cached = r.lock_boundary = a->cached_tokens;
  if (trace_)
    std::fprintf(stderr, "  admit %zu tokens -> %s cached %zu%s\n", r.prompt.size(),
                 std::to_string(r.lock.value()).c_str(), r.cached,
                 a->promoting ? " (promoting)" : "");
  if (r.cached == 0) {
    r.verified = true;
  } else if (!a->promoting) {  // not promoting: the reused prefix is on GPU now
    verify_reused(r);
  }
  live_.push_back(std::move(r));
}

void Driver::poll_lock(Reader& in) {
  Request* r = pick(in);
  if (r == nullptr) return;
  const auto st = h_.cache->poll(r->lock);
  expect(st.is_ok(), "poll of a running request: " + st.status().to_string());
  if (r->verified) return;
  // kFailed: a copy failed; wait() moves the lock to what is still usable.
  if (*st == TransferState::kDone) verify_reused(*r);
}

void Driver::wait(Reader& in) {
  Request* r = pick(in);
  if (r == nullptr) return;
  auto resumed = h_.cache->wait(r->lock);
  if (!resumed) {
    expect(resumed.status().code() == ErrorCode::kTransferFailed,
           "wait: " + resumed.status().to_string());
    if (!r->verified) lose_reused(*r);
    return;
  }
  if (trace_)
    std::fprintf(stderr, "  wait %s -> resumes %zu\n", std::to_string(r->lock.value()).c_str(),
                 *resumed);
  if (r->verified) return;
  expect(*resumed <= r->cached, "wait resumed deeper than the admission's match");
  if (*resumed < r->cached) {
    // A copy failed: the lock moved up to the deepest boundary still usable (rule 7).
    r->cached = r->lock_boundary = *resumed;
  }
  if (r->cached == 0) return lose_reused(*r);
  verify_reused(*r);
}

void Driver::compute(Reader& in) {
  Request* r = pick(in);
  std::size_t n = 1 + in.u8() % 4;
  if (r == nullptr || !r->verified) return;
  const std::size_t done = r->table.size();
  n = std::min(n, r->prompt.size() / ps() - done);
  if (n == 0) return;
  const Fingerprint before = settled();
  auto pages = h_.cache->alloc_pages(r->lock, n);
  if (trace_)
    std::fprintf(stderr, "  alloc_pages(%s, %zu) -> %s\n", std::to_string(r->lock.value()).c_str(),
                 n, pages ? "ok" : pages.status().to_string().c_str());
  if (trace_ && pages)
    for (GpuPageId p : *pages) std::fprintf(stderr, "    got page %u\n", p.value());
  if (trace_) {
    std::fprintf(stderr, "    table:");
    for (GpuPageId p : r->table) std::fprintf(stderr, " %u", p.value());
    std::fprintf(stderr, "\n");
  }
  if (!pages) return expect_refusal(pages.status(), before, "alloc_pages");
  expect(pages->size() == n, "alloc_pages returned another count");
  for (std::size_t i = 0; i < n; ++i) {
    const GpuPageId p = (*pages)[i];
    expect(page_owner(p) == LockId(), "alloc_pages handed out a page someone owns");
    h_.fill_page(p, r->prompt, done + i);
    r->table.push_back(p);
    r->pages.emplace(p, done + i);
  }
}

void Driver::insert(Reader& in) {
  Request* r = pick(in);
  const std::uint8_t flags = in.u8();
  if (r == nullptr || !r->verified) return;
  const std::size_t boundary = r->table.size() * ps();
  if (boundary < r->lock_boundary) return;
  const auto tokens = std::span(r->prompt).first(boundary);
  std::optional<GpuSlotId> snap;
  if ((flags & 1) && boundary > 0) {
    const Fingerprint before = settled();
    auto slot = h_.cache->alloc_snapshot_slot(r->lock);
    if (slot) {
      expect(slot_owner(*slot) == LockId(), "alloc_snapshot_slot handed out an owned slot");
      h_.fill_snapshot(*slot, tokens);
      r->slots.emplace(*slot, boundary);
      snap = *slot;
    } else {
      expect_refusal(slot.status(), before, "alloc_snapshot_slot");
    }
  }
  auto ins = h_.cache->insert(r->lock, tokens, r->table, snap);
  if (trace_)
    std::fprintf(stderr, "  insert(%s, %zu tokens, %s) -> %zu pages not taken\n",
                 std::to_string(r->lock.value()).c_str(), boundary,
                 snap ? "snapshot" : "no snapshot", ins ? ins->not_taken.size() : 0);
  expect(ins.is_ok(), "a valid insert was rejected: " + ins.status().to_string());
  for (GpuPageId p : ins->not_taken)
    expect(r->pages.count(p) == 1, "insert handed back a page the request does not own");
  std::erase_if(r->pages, [&](const auto& kv) {
    return std::find(ins->not_taken.begin(), ins->not_taken.end(), kv.first) ==
           ins->not_taken.end();
  });
  if (snap && ins->snapshot_taken) r->slots.erase(*snap);
  r->lock_boundary = boundary;
  if (flags & 2) free_duplicates(*r);
}

void Driver::free_duplicates_op(Reader& in) {
  if (Request* r = pick(in); r != nullptr && r->verified) free_duplicates(*r);
}

void Driver::free_tail(Reader& in) {
  Request* r = pick(in);
  const std::uint8_t n = in.u8();
  if (r == nullptr) return;
  const std::size_t keep = r->table.size() - n % (r->table.size() + 1);
  std::vector<GpuPageId> mine;
  for (std::size_t i = keep; i < r->table.size(); ++i)
    if (r->pages.count(r->table[i])) mine.push_back(r->table[i]);
  Status s = h_.cache->free_pages(r->lock, mine);
  expect(s.is_ok(), "free_pages of own pages: " + s.to_string());
  for (GpuPageId p : mine) r->pages.erase(p);
  r->table.resize(keep);
}

void Driver::free_slot(Reader& in) {
  Request* r = pick(in);
  if (r == nullptr || r->slots.empty()) return;
  const GpuSlotId slot = r->slots.begin()->first;
  Status s = h_.cache->free_snapshot_slot(r->lock, slot);
  expect(s.is_ok(), "free_snapshot_slot of an own slot: " + s.to_string());
  r->slots.erase(slot);
}

void Driver::release(Reader& in) {
  Request* r = pick(in);
  if (r == nullptr) return;
  const LockId lock = r->lock;
  Status s = h_.cache->release(lock);
  expect(s.is_ok(), "release: " + s.to_string());
  live_.erase(live_.begin() + (r - live_.data()));
  released_.push_back(lock);
  check_all();
  const Fingerprint before = settled();
  expect(h_.cache->release(lock).code() == ErrorCode::kNotFound, "a second release");
  expect_unchanged(before, "a second release");
}

void Driver::pressure(Reader& in) {
  const std::size_t n = in.u8() % (h_.config.gpu_pages + 3);
  const LockId side = h_.side_lock();
  const Fingerprint before = settled();
  auto pages = h_.cache->alloc_pages(side, n);
  if (n > h_.config.gpu_pages) {
    expect(pages.status().code() == ErrorCode::kInvalidArgument,
           "alloc_pages beyond the pool's capacity");
    return expect_unchanged(before, "alloc_pages beyond the pool's capacity");
  }
  if (!pages) return expect_refusal(pages.status(), before, "alloc_pages (pressure)");
  for (GpuPageId p : *pages) {
    expect(page_owner(p) == LockId(), "alloc_pages handed out a page someone owns");
    auto bytes = h_.memory.gpu_page(p);
    std::fill(bytes.begin(), bytes.end(), kScribble);
    pressure_pages_.push_back(p);
  }
}

void Driver::pressure_slot(Reader&) {
  const LockId side = h_.side_lock();
  const Fingerprint before = settled();
  auto slot = h_.cache->alloc_snapshot_slot(side);
  if (!slot) return expect_refusal(slot.status(), before, "alloc_snapshot_slot (pressure)");
  expect(slot_owner(*slot) == LockId(), "alloc_snapshot_slot handed out an owned slot");
  auto bytes = h_.memory.gpu_snapshot(*slot);
  std::fill(bytes.begin(), bytes.end(), kScribble);
  pressure_slots_.push_back(*slot);
}

void Driver::unpressure(Reader& in) {
  const std::size_t n = in.u8() % (pressure_pages_.size() + 1);
  const std::vector<GpuPageId> give(pressure_pages_.end() - static_cast<std::ptrdiff_t>(n),
                                    pressure_pages_.end());
  if (!give.empty()) {
    Status s = h_.cache->free_pages(h_.side_lock(), give);
    expect(s.is_ok(), "free_pages of pressure pages: " + s.to_string());
    pressure_pages_.resize(pressure_pages_.size() - n);
  }
  if (!pressure_slots_.empty()) {
    Status s = h_.cache->free_snapshot_slot(h_.side_lock(), pressure_slots_.back());
    expect(s.is_ok(), "free_snapshot_slot of a pressure slot: " + s.to_string());
    pressure_slots_.pop_back();
  }
}

void Driver::complete_copy(Reader& in) {
  const std::uint8_t pick = in.u8(), flags = in.u8();
  const std::vector<TicketId> ready = copies(false);
  if (ready.empty()) return;
  const TicketId id = ready[pick % ready.size()];
  if (flags & 1) h_.engine.fail_ticket(id);
  if (flags & 4) return;  // it fails whenever it runs: in a wait the cache makes later
  expect(h_.engine.complete(id), "complete() of a pending copy");
  if (flags & 2) h_.cache->poll();
}

void Driver::delay_copy(Reader& in) {
  const std::uint8_t pick = in.u8();
  const std::vector<TicketId> ready = copies(false);
  if (ready.empty()) return;
  const TicketId id = ready[pick % ready.size()];
  h_.engine.delay_ticket(id);
  delayed_.push_back(id);
}

void Driver::resume_copy(Reader& in) {
  const std::uint8_t pick = in.u8();
  const std::vector<TicketId> held = copies(true);
  if (held.empty()) return;
  const TicketId id = held[pick % held.size()];
  h_.engine.resume(id);
  std::erase(delayed_, id);
}

void Driver::fail_next(Reader& in) {
  h_.engine.fail_nth_submission(in.u8() % 4);
}

void Driver::drain(Reader&) {
  h_.cache->drain();
  expect(h_.cache->in_flight() == 0, "drain left copies in flight");
}

void Driver::settle(Reader& in) {
  const bool reverse = in.u8() & 1;
  if (store_) {  // held store copies land too
    store_->hold(false);
    store_->release();
  }
  // poll() may start demotions ahead of need (the watermarks); each round takes evictable
  // nodes out of the GPU, so they stop within as many rounds as the GPU has pages and slots.
  const std::size_t rounds = h_.config.gpu_pages + h_.config.gpu_snapshot_slots + 1;
  for (std::size_t round = 0; round < rounds; ++round) {
    std::vector<TicketId> pending = h_.engine.pending();
    if (reverse) std::reverse(pending.begin(), pending.end());
    for (TicketId id : pending) {
      // Completing a copy runs the ones it runs after first (TransferBatch::after): those
      // are no longer pending when their turn in this list comes.
      if (h_.engine.poll(id) != TransferState::kPending) continue;
      expect(h_.engine.complete(id), "complete() of a pending copy");
    }
    h_.cache->poll();
    if (h_.cache->in_flight() == 0) break;
  }
  expect(h_.cache->in_flight() == 0, "poll after every copy finished left copies in flight");
  delayed_.clear();
}

/// [kind, req, a, b]: one invalid call. Kinds whose precondition does not hold do nothing.
void Driver::bad_argument(Reader& in) {
  const std::uint8_t kind = in.u8() % 16;
  Request* r = pick(in);
  const std::uint8_t a = in.u8(), b = in.u8();
  PrefixCache& c = *h_.cache;
  const std::uint32_t cap = h_.config.gpu_pages, slots = h_.config.gpu_snapshot_slots;
  const LockId lock = r ? r->lock : h_.side_lock();
  auto owns_page = [&](GpuPageId id) { return page_owner(id) == lock; };
  auto foreign_page = [&]() -> std::optional<GpuPageId> {  // owned by another request
    for (std::uint32_t k = 0; k < cap; ++k) {
      const GpuPageId id((a + k) % cap);
      if (page_owner(id).valid() && !owns_page(id)) return id;
    }
    return std::nullopt;
  };
  // The live slot is the request's from admission; once its fill lands path_snapshot names it,
  // even while the prefix's pages still arrive (before the driver has verified the request).
  const auto live_slot = r ? c.path_snapshot(lock) : Result<GpuSlotId>(GpuSlotId());
  auto not_own_slot = [&]() -> GpuSlotId {  // out of range, or any slot this lock lacks
    if (b & 1) return GpuSlotId(slots + a);
    for (std::uint32_t k = 0; k < slots; ++k) {
      const GpuSlotId id((a + k) % slots);
      if (slot_owner(id) != lock && !(live_slot && *live_slot == id)) return id;
    }
    return GpuSlotId(slots + a);
  };
  // An insert that is valid so far (tokens and table), for the kinds that spoil one thing.
  const bool can_insert = r && r->verified && r->table.size() * ps() >= r->lock_boundary;
  const std::span<const Token> tokens =
      r ? std::span<const Token>(r->prompt).first(r->table.size() * ps())
        : std::span<const Token>();
  std::vector<GpuPageId> pages = r ? r->table : std::vector<GpuPageId>();

  const Fingerprint before = settled();
  std::string call;
  bool rejected = true;
  auto refused = [&](const auto& result, const char* what) {
    call = what;
    rejected = !result.is_ok();
  };
  switch (kind) {
    case 0: {  // every entry point with a lock that is not running
      const LockId bogus =
          released_.empty() ? LockId(0x40000000u + a) : released_[a % released_.size()];
      if (bogus == h_.side_ || std::any_of(live_.begin(), live_.end(),
                                           [&](const Request& q) { return q.lock == bogus; }))
        return;
      switch (b % 10) {
        case 0:
          refused(c.release(bogus), "release(unknown lock)");
          break;
        case 1:
          refused(c.wait(bogus), "wait(unknown lock)");
          break;
        case 2:
          refused(c.path_pages(bogus), "path_pages(unknown lock)");
          break;
        case 3:
          refused(c.path_snapshot(bogus), "path_snapshot(unknown lock)");
          break;
        case 4:
          refused(c.alloc_pages(bogus, 1), "alloc_pages(unknown lock)");
          break;
        case 5:
          refused(c.alloc_snapshot_slot(bogus), "alloc_snapshot_slot(unknown lock)");
          break;
        case 6:
          refused(c.free_pages(bogus, {}), "free_pages(unknown lock)");
          break;
        case 7:
          refused(c.free_snapshot_slot(bogus, GpuSlotId(0)), "free_snapshot_slot(unknown lock)");
          break;
        case 8:
          refused(c.insert(bogus, {}, {}, std::nullopt), "insert(unknown lock)");
          break;
        default:
          // An error, not a "failed copy" state (issue 9 item 6).
          refused(c.poll(bogus), "poll(unknown lock)");
          break;
      }
      break;
    }
    case 1:
      refused(c.admit({}), "admit(empty prompt)");
      break;
    case 2:
      refused(c.alloc_pages(lock, cap + 1 + a % 4), "alloc_pages beyond capacity");
      break;
    case 3: {
      const GpuPageId bad[] = {GpuPageId(cap + a)};
      refused(c.free_pages(lock, bad), "free_pages(out of range)");
      break;
    }
    case 4: {
      const GpuPageId id((a + b) % cap);
      if (owns_page(id)) return;
      const GpuPageId bad[] = {id};
      refused(c.free_pages(lock, bad), "free_pages(a page it does not own)");
      break;
    }
    case 5: {
      if (!r || r->pages.empty()) return;
      const GpuPageId p = r->pages.begin()->first;
      const GpuPageId twice[] = {p, p};
      refused(c.free_pages(lock, twice), "free_pages(an own page twice)");
      break;
    }
    case 6:
      refused(c.free_snapshot_slot(lock, not_own_slot()), "free_snapshot_slot(not own)");
      break;
    case 7: {
      if (!r) return;
      const std::vector<Token> odd(1 + ps() * (a % 3), 5);
      refused(c.insert(lock, odd, {}, std::nullopt), "insert(tokens not a page multiple)");
      break;
    }
    case 8: {
      if (!r) return;
      if (pages.empty()) {
        pages.push_back(GpuPageId(0));
      } else {
        pages.pop_back();
      }
      refused(c.insert(lock, tokens, pages, std::nullopt), "insert(page count differs)");
      break;
    }
    case 9: {
      if (!r || r->lock_boundary < ps()) return;
      const auto shorter = std::span(r->prompt).first(r->lock_boundary - ps());
      const std::vector<GpuPageId> some(shorter.size() / ps(), GpuPageId(0));
      refused(c.insert(lock, shorter, some, std::nullopt), "insert(ends before the lock)");
      break;
    }
    case 10: {
      const auto other = foreign_page();
      if (!can_insert || pages.empty() || !other) return;
      pages[a % pages.size()] = *other;
      refused(c.insert(lock, tokens, pages, std::nullopt), "insert(another request's page)");
      break;
    }
    case 11: {
      if (!can_insert || pages.size() < 2) return;
      pages[1 + a % (pages.size() - 1)] = pages[0];
      refused(c.insert(lock, tokens, pages, std::nullopt), "insert(a page listed twice)");
      break;
    }
    case 12: {
      if (!can_insert || tokens.empty()) return;
      refused(c.insert(lock, tokens, pages, not_own_slot()), "insert(a slot it does not own)");
      break;
    }
    case 13:
      refused(c.insert(lock, {}, {}, GpuSlotId(a % slots)), "insert(a snapshot at the root)");
      break;
    case 14: {
      if (!can_insert || pages.empty()) return;
      pages[a % pages.size()] = GpuPageId(cap + b);
      refused(c.insert(lock, tokens, pages, std::nullopt), "insert(a page out of range)");
      break;
    }
    default: {  // reading a prefix that has not arrived
      if (!r || r->verified) return;
      if (auto st = c.poll(r->lock); !st || *st != TransferState::kPending) return;
      // Something of the prefix is still arriving: the pages, the snapshot or both.
      call = "path_pages and path_snapshot before the promotion finished";
      rejected = !c.path_pages(lock) || !c.path_snapshot(lock);
      break;
    }
  }
  if (trace_) std::fprintf(stderr, "  bad argument: %s\n", call.c_str());
  expect(rejected, call + " was accepted");
  expect_unchanged(before, call);
}

void Driver::evict(Reader& in) {
  const std::uint8_t tier = in.u8(), n = in.u8(), s = in.u8();
  EvictRequest req;
  req.tier = tier & 1 ? Tier::kHost : Tier::kGpu;
  req.tokens = std::size_t{n % 16u} * ps();
  req.snapshots = s % 4u;
  h_.cache->poll();
  const CacheSizes sizes = h_.cache->sizes();
  const Occupancy before = h_.cache->occupancy();
  auto freed = h_.cache->evict(req);
  expect(freed.is_ok(), "evict: " + freed.status().to_string());
  if (trace_)
    std::fprintf(stderr, "  evict(%zu tokens, %u snapshots, %s) -> %zu pages, %u snapshots\n",
                 req.tokens, req.snapshots, to_string(req.tier), freed->kv_pages, freed->snapshots);
  if (req.tier == Tier::kHost) return;
  const Occupancy after = h_.cache->occupancy();
  // One GPU pool (issue 21): a snapshot frees its pages; live slots never evict. A slot may
  // come back meanwhile: evict waits for copies in flight when nothing is evictable, and a
  // copy into the live slot of a request released before it landed gives that slot back.
  const std::size_t snap_pages = h_.cache->config().snapshot_pages();
  expect(after.gpu_pages_free - before.gpu_pages_free ==
                 freed->kv_pages + freed->snapshots * snap_pages &&
             after.gpu_slots_free >= before.gpu_slots_free,
         "evict: what it reports freed is not what the free counts show");
  expect(freed->kv_pages >= std::min(std::size_t{n % 16u}, sizes.gpu.kv_pages_evictable),
         "evict freed less GPU KV than was asked and evictable");
}

void Driver::peek(Reader& in) {
  const std::vector<Token> prompt = decode_prompt(in);
  const Fingerprint before = settled();
  auto m = h_.cache->peek(prompt);
  expect(m.is_ok(), "peek: " + m.status().to_string());
  expect_unchanged(before, "peek");
  const MatchResult all = h_.cache->match(std::span(prompt).first(prompt.size() - 1));
  expect(m->usable_tokens == all.usable_tokens && m->resume_tokens == all.resume_tokens,
         "peek differs from match of all but the last token");
  expect(m->gpu_usable_tokens <= m->usable_tokens &&
             (m->resume_tokens == m->gpu_usable_tokens || m->resume_tokens == m->usable_tokens),
         "peek: the resume point is neither the GPU-only nor the usable match");
  expect(m->load_back == (m->resume_tokens != m->gpu_usable_tokens),
         "peek: load_back does not say whether the resume point needs a copy");
}

std::size_t Driver::store_usable(const std::vector<Token>& prompt) const {
  if (!store_) return 0;
  std::size_t best = 0;
  for (const NodeInfo& n : h_.cache->inspect(std::span(prompt).first(prompt.size() - 1))) {
    if (n.matched < n.boundary || !n.kv_on_store) break;
    if (n.snapshot_on_store) best = n.boundary;
  }
  return best;
}

void Driver::restart(Reader& in) {
  const std::uint8_t flags = in.u8(), seed = in.u8();
  const bool graceful = flags & 1;
  if (graceful && (flags & 2)) {  // every request finishes first
    for (const Request& r : live_) {
      Status s = h_.cache->release(r.lock);
      expect(s.is_ok(), "release before a graceful restart: " + s.to_string());
    }
    live_.clear();
  }
  bool complete = false;  // persist() had room for everything and nothing failed
  if (graceful && store_) {
    if (trace_) {
      std::fprintf(stderr, "  before persist: %u host pages free\n",
                   h_.cache->occupancy().host_pages_free);
      for (const auto& p : known_)
        for (const NodeInfo& n : h_.cache->inspect(p))
          std::fprintf(stderr, "    [%zu kv=%s%s snap=%s%s locks=%u]\n", n.boundary,
                       to_string(n.kv), n.kv_on_store ? "+store" : "", to_string(n.snapshot),
                       n.snapshot_on_store ? "+store" : "", n.locks);
    }
    const CacheStats before = h_.cache->stats();
    Status s = h_.cache->persist();
    const CacheStats after = h_.cache->stats();
    const bool faulted = after.store_failures > before.store_failures ||
                         after.transfers_failed > before.transfers_failed;
    // persist() fails only where a fault was injected, and says so in the stats.
    // Or it says that some of it found no room (kOutOfMemory).
    expect(s.is_ok() || faulted || s.code() == ErrorCode::kOutOfMemory,
           "persist failed without a fault: " + s.to_string());
    if (trace_)
      std::fprintf(stderr, "  persist: %s, %zu records, %llu slots free, %llu store writes\n",
                   s.to_string().c_str(), store_->record_count(),
                   static_cast<unsigned long long>(store_->free_slots()),
                   static_cast<unsigned long long>(after.store_writes - before.store_writes));
    // OK means every live KV node and snapshot has a store copy.
    complete = s.is_ok();
    check_all();
  }
  std::vector<std::size_t> on_store;
  for (std::size_t i = 0; i < known_.size(); ++i) {
    on_store.push_back(store_usable(known_[i]));
    // With room for the largest record left, persist() gave every usable match a store copy.
    const std::size_t usable =
        h_.cache->match(std::span(known_[i]).first(known_[i].size() - 1)).usable_tokens;
    if (complete)
      expect(on_store.back() == usable, "after persist(), known prompt " + std::to_string(i) +
                                            " has " + std::to_string(usable) + " usable tokens, " +
                                            std::to_string(on_store.back()) +
                                            " of them on the store");
  }
  if (!graceful && store_) store_->crash(0x9E3779B97F4A7C15ull * (seed + 1u));
  // The old process's requests, pressure and delayed copies die with it.
  live_.clear();
  pressure_pages_.clear();
  pressure_slots_.clear();
  delayed_.clear();
  released_.clear();
  Status made = h_.restart(false, [&] {
    if (store_) store_->reopen();
  });
  expect(made.is_ok(), "create() after a restart: " + made.to_string());
  if (trace_)
    std::fprintf(stderr, "  restart(%s): %llu KV pages, %llu snapshots restored\n",
                 graceful ? "graceful" : "crash",
                 static_cast<unsigned long long>(h_.cache->stats().restored_kv_pages),
                 static_cast<unsigned long long>(h_.cache->stats().restored_snapshots));
  for (std::size_t i = 0; i < known_.size(); ++i) {
    const std::size_t usable =
        h_.cache->match(std::span(known_[i]).first(known_[i].size() - 1)).usable_tokens;
    if (graceful) {
      expect(usable == on_store[i], "after a graceful restart, known prompt " + std::to_string(i) +
                                        " matches " + std::to_string(usable) +
                                        " tokens; the store held " + std::to_string(on_store[i]));
    } else {
      expect(usable <= on_store[i], "after a crash, known prompt " + std::to_string(i) +
                                        " matches more than the store held");
    }
  }
}

void Driver::store_fault(Reader& in) {
  const std::uint8_t kind = in.u8() % 5, pick = in.u8();
  if (trace_) std::fprintf(stderr, "  store fault %u (%u)\n", kind, pick);
  if (!store_) return;
  switch (kind) {
    case 0:
      store_->fail_next_writes(1);
      break;
    case 1: {
      const std::vector<StoredRecord> records = store_->records();
      if (!records.empty()) store_->corrupt(records[pick % records.size()].id);
      break;
    }
    case 2:
      store_->io_error_next_reads(1);
      break;
    case 3:
      store_->refuse_next(1);
      break;
    default:
      store_->hold(pick & 1);
      if (!(pick & 1)) store_->release();
      break;
  }
}

void Driver::run(Reader& in) {
  while (!in.done()) {
    const OpEntry& op = kOps[in.u8() % std::size(kOps)];
    log_.push_back(op.name);
    if (trace_) std::fprintf(stderr, "op %zu: %s\n", log_.size(), op.name);
    (this->*op.fn)(in);
    if (trace_) {
      for (const Request& r : live_) {
        std::fprintf(stderr, "    req %s table %zu:", std::to_string(r.lock.value()).c_str(),
                     r.table.size());
        for (const NodeInfo& n : h_.cache->inspect(r.prompt))
          std::fprintf(stderr, " [%zu kv=%s snap=%s x=%s locks=%u]", n.boundary, to_string(n.kv),
                       to_string(n.snapshot), to_string(n.kv_copy), n.locks);
        std::fprintf(stderr, "\n");
      }
    }
    check_all();
  }
  log_.push_back("(end: release everything)");
  for (const Request& r : live_) {
    Status s = h_.cache->release(r.lock);
    expect(s.is_ok(), "release at the end: " + s.to_string());
  }
  live_.clear();
  // The side request's release frees the pressure pages and slots it still owns.
  if (!pressure_pages_.empty() || !pressure_slots_.empty()) {
    expect(h_.cache->release(h_.side_lock()).is_ok(), "release of the side request");
    pressure_pages_.clear();
    pressure_slots_.clear();
  }
  h_.cache->drain();
  expect(h_.engine.pending().empty() && h_.cache->in_flight() == 0, "copies left after drain");
  check_all();
  // Nothing runs: every GPU page and slot must be reclaimable by a new request.
  const Token one[] = {-2};
  auto a = h_.cache->admit(one);
  expect(a.is_ok(), "admit at the end");
  if (trace_) {
    const Occupancy o = h_.cache->occupancy();
    std::fprintf(stderr, "  end: %u GPU pages free, %zu nodes\n", o.gpu_pages_free, o.nodes);
    for (const auto& p : known_)
      for (const NodeInfo& n : h_.cache->inspect(p))
        std::fprintf(stderr, "    [%zu kv=%s%s snap=%s x=%s locks=%u]\n", n.boundary,
                     to_string(n.kv), n.kv_on_store ? "+store" : "", to_string(n.snapshot),
                     to_string(n.kv_copy), n.locks);
  }
  auto all = h_.cache->alloc_pages(a->lock, h_.config.gpu_pages);
  expect(all.is_ok(), "with nothing running, the whole GPU pool is not reclaimable: " +
                          all.status().to_string());
  for (std::uint32_t i = 0; i < h_.config.gpu_snapshot_slots; ++i) {
    auto slot = h_.cache->alloc_snapshot_slot(a->lock);
    expect(slot.is_ok(), "with nothing running, a GPU snapshot slot is not reclaimable: " +
                             slot.status().to_string());
  }
  expect(h_.cache->release(a->lock).is_ok(), "release at the end");
  h_.cache->drain();
  check_all();
}

}  // namespace

void run_input(std::span<const std::uint8_t> data) {
  Reader in(data);
  std::uint64_t store_slots = 0;
  const std::optional<CacheConfig> config = decode_config(in, store_slots);
  if (!config) return;
  Driver driver(*config, store_slots);
  driver.run(in);
}

}  // namespace radixtier::fuzz
