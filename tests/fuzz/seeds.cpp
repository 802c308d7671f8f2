// The seed corpus of the cache fuzzer, written as operations (cache_fuzz.hpp) so that each
// seed says what it exercises. `radixtier_cache_fuzz_replay --write-seeds DIR` writes them
// as files; tests/fuzz/corpus/ holds that output.
#include <initializer_list>

#include "cache_fuzz.hpp"

namespace radixtier::fuzz {
namespace {

class Enc {
 public:
  /// The header: flags (bit 0 write-through, bit 1 utility eviction, bit 2 page size 2, bit 3
  /// two snapshots per path, bit 4 load back only from two pages on, bit 5 GPU watermarks,
  /// bits 6-7 a store: {none, 24, 60, 200} slots),
  /// GPU pages (8..40), host pages index ({0, 12, 24, 64}), GPU slots (1..4), host slots
  /// index ({0, 2, 8}), slice pages (1..4).
  Enc(std::uint8_t flags, std::uint8_t gpu_pages, std::uint8_t host_pages, std::uint8_t gpu_slots,
      std::uint8_t host_slots, std::uint8_t slice_pages) {
    bytes_ = {flags,      static_cast<std::uint8_t>(gpu_pages - 8),
              host_pages, static_cast<std::uint8_t>(gpu_slots - 1),
              host_slots, static_cast<std::uint8_t>(slice_pages - 1)};
  }
  /// A new prompt: `cut` tokens of conversation `conv`, the tail tokens (1..3), token 7.
  Enc& admit(std::uint8_t conv, std::uint8_t cut, std::initializer_list<std::uint8_t> tail = {}) {
    bytes_.insert(bytes_.end(), {kAdmit, conv, cut, static_cast<std::uint8_t>(tail.size())});
    for (std::uint8_t t : tail) bytes_.push_back(static_cast<std::uint8_t>(t - 1));
    return *this;
  }
  /// The i-th prompt seen so far again.
  Enc& admit_known(std::uint8_t i) {
    return op(kAdmit, {static_cast<std::uint8_t>(kKnownPrompt | i)});
  }
  Enc& op(Op o, std::initializer_list<std::uint8_t> args = {}) {
    bytes_.push_back(o);
    bytes_.insert(bytes_.end(), args);
    return *this;
  }
  /// Request `req` computes `chunks` chunks of `pages` pages, inserting after each (with a
  /// snapshot when `snapshot`).
  Enc& compute(std::uint8_t req, std::uint8_t chunks, std::uint8_t pages, bool snapshot) {
    for (std::uint8_t i = 0; i < chunks; ++i) {
      op(kCompute, {req, static_cast<std::uint8_t>(pages - 1)});
      op(kInsert, {req, static_cast<std::uint8_t>(snapshot ? 3 : 2)});
    }
    return *this;
  }
  /// Admission already made: wait, compute everything with snapshots, release.
  Enc& finish(std::uint8_t req, std::uint8_t chunks, std::uint8_t pages) {
    op(kWait, {req});
    compute(req, chunks, pages, true);
    return op(kRelease, {req});
  }
  /// Every unlocked page and slot off the GPU: the side request takes the whole pool.
  Enc& demote_all(std::uint8_t gpu_pages, std::uint8_t gpu_slots) {
    op(kPressure, {gpu_pages});
    for (std::uint8_t i = 0; i < gpu_slots; ++i) op(kPressureSlot);
    op(kUnpressure, {gpu_pages});
    for (std::uint8_t i = 1; i < gpu_slots; ++i) op(kUnpressure, {0});
    return *this;
  }
  std::vector<std::uint8_t> bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

}  // namespace

std::vector<Seed> seeds() {
  std::vector<Seed> out;

  // Serve, reuse, demote everything, re-admit from host (promotion), finish it out of order.
  for (std::uint8_t policy : {0, 1}) {
    Enc e(policy, 32, 3, 4, 2, 3);
    e.admit(0, 40).finish(0, 3, 4);
    e.admit_known(0).finish(0, 1, 1);
    e.admit(0, 24, {1, 2}).finish(0, 2, 2);
    e.demote_all(32, 4);
    e.admit_known(0).op(kPollLock, {0}).op(kCompleteCopy, {1, 2}).op(kCompleteCopy, {0, 2});
    e.op(kPollLock, {0}).compute(0, 1, 1, true).op(kRelease, {0});
    e.op(kDropHost).admit_known(1).finish(0, 2, 4);
    out.push_back(
        {policy ? "serve-demote-promote-write-through" : "serve-demote-promote", e.bytes()});
  }

  // Issue 9, bug 1, as filed: the admission's own promotion fails while it makes snapshot-slot
  // room, so try_admit_at's re-check after making room refuses the target.
  {
    Enc e(0, 32, 3, 2, 2, 3);
    e.admit(0, 8).finish(0, 1, 2);                // P: 9 tokens, snapshot at 8
    e.admit(1, 8).finish(0, 1, 2);                // Q
    e.op(kPressure, {32}).op(kUnpressure, {32});  // all KV demoted
    e.admit_known(0).op(kRelease, {0});           // P promoting, released without waiting
    e.op(kPressureSlot);                          // takes a snapshot slot
    e.admit_known(1).op(kRelease, {0});           // Q promoting
    e.op(kCompleteCopy, {0, 1 | 4});              // P's promotion will fail
    e.admit_known(0).op(kWait, {0}).compute(0, 1, 1, true).op(kRelease, {0});
    out.push_back({"readmit-own-promotion-fails", e.bytes()});
  }

  // The target's own earlier snapshot promotion fails while the admission waits for page
  // room (write-through, so the other in-flight copy is a background one): the re-check
  // after making room finds the target without a snapshot.
  {
    Enc e(1, 8, 3, 1, 2, 3);
    e.admit(0, 8).finish(0, 1, 2).op(kSettle, {0});  // P: 2 pages, snapshot at 8, host copies
    e.op(kPressureSlot).op(kUnpressure, {0});        // P's snapshot: host only
    e.admit_known(0).op(kRelease, {0});              // its promotion pending ...
    e.op(kCompleteCopy, {0, 1 | 4});                 // ... and will fail
    e.op(kPressure, {8}).op(kUnpressure, {8});       // P's KV: host only
    // C, without a snapshot (its slot would wait for P's promotion): its write-through is
    // pending, so its pages are not evictable yet.
    e.admit(1, 8).op(kWait, {0}).compute(0, 1, 2, false).op(kRelease, {0});
    e.op(kPressure, {6});  // no free GPU page left
    e.admit_known(0).op(kWait, {0}).compute(0, 1, 2, true).op(kRelease, {0});
    out.push_back({"admit-while-own-snapshot-promotion-fails", e.bytes()});
  }

  // A promotion fails while an admission makes snapshot-slot room (issue 9, bug 1, with a
  // longer prompt below P so that the failed node stays as an inner tombstone): the
  // re-check after making room finds a path node without KV; the next admission of the
  // longer prompt falls back and recomputes.
  {
    Enc e(0, 32, 3, 2, 2, 3);
    e.admit(0, 8).finish(0, 1, 2);
    e.admit(0, 16, {1}).finish(0, 2, 2);  // P + 8 tokens (+1): a child below P
    e.admit(1, 8).finish(0, 1, 2);
    e.op(kPressure, {32}).op(kUnpressure, {32});
    e.admit_known(0).op(kRelease, {0});
    e.op(kPressureSlot);
    e.admit_known(2).op(kRelease, {0});
    e.op(kCompleteCopy, {0, 1 | 4});
    e.admit_known(0).op(kWait, {0}).compute(0, 1, 1, true).op(kRelease, {0});
    e.admit_known(1).finish(0, 3, 2);
    out.push_back({"readmit-promotion-fails-inner-node", e.bytes()});
  }

  // A demotion fails (rule 7: the node becomes a tombstone), then a write-through copy
  // fails (the GPU copy stays); later admissions find less and recompute, reviving them.
  for (std::uint8_t policy : {0, 1}) {
    Enc e(policy, 12, 3, 4, 2, 1);
    e.admit(0, 16).finish(0, 2, 2);       // A: 4 pages, snapshots at 8 and 16
    e.admit(0, 32, {2}).finish(0, 1, 4);  // A + B: 8 pages, snapshot at 32
    e.op(kSettle, {0}).op(kFailNext, {0});
    e.op(kPressure, {12}).op(kUnpressure, {12});  // its first copy fails
    e.admit_known(1).finish(0, 2, 4).op(kFailNext, {0});
    e.admit(1, 16).finish(0, 1, 4).op(kSettle, {1});  // C's write-through fails
    e.op(kPressure, {12}).op(kUnpressure, {12}).admit_known(2).finish(0, 1, 4);
    out.push_back({policy ? "failed-write-through" : "failed-demotion", e.bytes()});
  }

  // Two requests at once, every kind of bad argument against them.
  {
    Enc e(0, 24, 3, 3, 2, 2);
    e.admit(0, 20).finish(0, 2, 3);
    e.admit_known(0).op(kWait, {0}).compute(0, 1, 2, false);
    e.admit(1, 12, {3}).op(kCompute, {1, 1}).op(kPressure, {3}).op(kPressureSlot);
    e.op(kInsert, {1, 1});
    for (std::uint8_t kind = 0; kind < 16; ++kind)
      for (std::uint8_t req : {0, 1}) e.op(kBadArgument, {kind, req, kind, req});
    for (std::uint8_t b = 0; b < 10; ++b) e.op(kBadArgument, {0, 0, 0, b});
    e.op(kRelease, {1}).op(kBadArgument, {0, 0, 0, 0}).op(kRelease, {0});
    out.push_back({"bad-arguments", e.bytes()});
  }

  // A small GPU and page size 2: allocations refused, duplicates, tails freed.
  {
    Enc e(4, 8, 1, 1, 1, 2);
    e.admit(0, 12).finish(0, 2, 3);
    e.admit(0, 12, {1}).op(kWait, {0}).compute(0, 2, 4, true);
    e.admit(1, 10).op(kCompute, {1, 3}).op(kCompute, {1, 3}).op(kInsert, {1, 1});
    e.op(kFreeTail, {1, 2}).op(kFreeDuplicates, {0}).op(kFreeSlot, {0});
    e.op(kPressure, {8}).op(kPressure, {2}).op(kUnpressure, {2});
    e.op(kRelease, {0}).op(kRelease, {0});
    out.push_back({"small-gpu-page-size-2", e.bytes()});
  }

  // Copies out of order: promotions and demotions in flight together, some failed, some
  // delayed and resumed, then drain and settle.
  {
    Enc e(2, 20, 2, 2, 2, 1);
    e.admit(0, 16).finish(0, 2, 2);
    e.admit(1, 16).finish(0, 2, 2);
    e.admit(2, 16).finish(0, 2, 2);
    e.demote_all(20, 2);
    e.admit_known(0).admit_known(1).op(kDelayCopy, {0}).op(kFailNext, {0});
    e.admit_known(2).op(kCompleteCopy, {1, 0}).op(kCompleteCopy, {0, 1 | 2});
    e.op(kPollLock, {0}).op(kPollLock, {1}).op(kPollLock, {2}).op(kResumeCopy, {0});
    e.op(kSettle, {1}).op(kWait, {0}).op(kWait, {1}).op(kWait, {2});
    e.compute(0, 2, 2, true).compute(1, 2, 2, true).compute(2, 1, 4, false);
    e.op(kPoll).op(kDrain).op(kDropHost);
    e.op(kRelease, {2}).op(kRelease, {1}).op(kRelease, {0});
    out.push_back({"copies-out-of-order", e.bytes()});
  }

  // Issue 15: the per-path cap and the load-back threshold, explicit eviction on both tiers
  // (a demotion failing meanwhile), peek before and after, every copy of an admission failing.
  {
    Enc e(8 | 16, 24, 2, 3, 2, 2);
    e.admit(0, 24).finish(0, 6, 1);  // a snapshot at every page: the cap keeps two
    e.admit(1, 16).finish(0, 2, 2);
    e.op(kPeek, {kKnownPrompt | 0}).op(kEvict, {0, 3, 1}).op(kPeek, {kKnownPrompt | 0});
    e.op(kFailNext, {0}).op(kEvict, {0, 15, 3}).op(kPeek, {kKnownPrompt | 1});
    e.admit_known(0).op(kFailNext, {0}).op(kFailNext, {1}).op(kWait, {0});
    e.op(kEvict, {1, 15, 3}).op(kPeek, {kKnownPrompt | 0});
    e.compute(0, 6, 1, true).op(kRelease, {0});
    e.admit_known(1).op(kWait, {0}).op(kRelease, {0});
    out.push_back({"cap-threshold-evict-peek", e.bytes()});
  }

  // Issue 13: a store of 60 slots below a 12-page host pool. Prefixes pushed host -> store by
  // pressure and loaded back (store -> host -> GPU), then a graceful restart (persist) whose
  // new cache serves them from the store, then a crash (kill -9) and a cache on what survived.
  {
    Enc e(0x80, 16, 1, 2, 2, 2);
    e.admit(0, 16).finish(0, 2, 2);
    e.admit(1, 16).finish(0, 2, 2);
    e.admit(2, 12, {1}).finish(0, 3, 1);
    e.demote_all(16, 2).op(kSettle, {0}).demote_all(16, 2).op(kSettle, {0});
    e.admit_known(0).op(kWait, {0}).op(kRelease, {0});
    e.op(kRestart, {1 | 2, 0});
    e.admit_known(1).op(kWait, {0}).compute(0, 1, 1, true).op(kRelease, {0});
    e.admit_known(2).op(kWait, {0}).op(kRelease, {0});
    e.admit(3, 8).op(kWait, {0}).compute(0, 1, 2, true);  // running through the crash
    e.op(kStoreFault, {4, 1}).admit_known(0).op(kRestart, {0, 7});
    e.admit_known(0).op(kWait, {0}).op(kRelease, {0}).admit_known(1).finish(0, 2, 2);
    out.push_back({"store-restart", e.bytes()});
  }

  // Store faults: a failed write, a rotten record, an I/O error and a refused batch, each
  // met by a load or a demotion; every admission after them recomputes what was lost.
  {
    Enc e(0xC0, 12, 1, 2, 1, 3);
    e.admit(0, 20).finish(0, 2, 3);
    e.admit(1, 20).finish(0, 2, 3);
    e.op(kStoreFault, {0, 0}).demote_all(12, 2).op(kSettle, {0}).demote_all(12, 2);
    e.op(kStoreFault, {1, 0}).admit_known(0).op(kWait, {0}).op(kRelease, {0});
    e.op(kStoreFault, {2, 0}).admit_known(1).op(kWait, {0}).op(kRelease, {0});
    e.op(kStoreFault, {3, 0}).admit_known(0).op(kWait, {0}).op(kRelease, {0});
    e.op(kRestart, {1, 0}).admit_known(1).finish(0, 2, 3).admit_known(0).finish(0, 2, 3);
    out.push_back({"store-faults", e.bytes()});
  }
  return out;
}

}  // namespace radixtier::fuzz
