// The PrefixCache fuzz driver: decodes bytes into a configuration and a sequence of
// operations on a cache over real byte arenas and the manual host engine, and checks after
// every operation that
//   - check_invariants() is empty;
//   - every reused prefix (pages and snapshot a request reads) has the bytes written for
//     that prefix, as does every page and slot a request owns, and pages held for pressure
//     keep the scribble written into them (nobody else wrote them);
//   - every valid call succeeds (or, for an allocation, is a kOutOfMemory refusal) and every
//     rejected call changed nothing (testing::Fingerprint).
// A failed check prints the operation and aborts, so libFuzzer keeps the input.
//
// With a store tier (header flags bits 6-7, issue 13: a MemoryStoreEngine below host), also
//   - every prefix served after a restart has the bytes written for it before, whatever
//     the store lost (a crash, a failed write, a rotten record, an I/O error);
//   - after a graceful restart (persist()) the new cache's usable match of every known
//     prompt is exactly what the store held, after a crash at most that.
//
// Input layout: 6 header bytes (the configuration, see decode_config), then operations, each
// one byte (its index in the table, modulo the table size) followed by its argument bytes.
// Arguments past the end read as 0. New operations go at the end of the table, so the bytes
// of an existing input keep their meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace radixtier::fuzz {

/// The operation table, in order (the byte that selects each one). Arguments in brackets.
enum Op : std::uint8_t {
  kAdmit,           // [prompt]: a new request (at most 4 run at once)
  kPollLock,        // [req]: poll(lock); checks the reused prefix once it arrived
  kWait,            // [req]: wait(lock); likewise
  kCompute,         // [req, n]: alloc_pages(lock, 1 + n % 4) for the next pages; fills them
  kInsert,          // [req, flags]: insert what was computed; flags & 1: with a snapshot,
                    //   flags & 2: then free the duplicates
  kFreeDuplicates,  // [req]: free the pages insert handed back, use the tree's instead
  kFreeTail,        // [req, n]: forget the last n % (computed + 1) pages, freeing own ones
  kFreeSlot,        // [req]: free one snapshot slot the request owns
  kRelease,         // [req]: release, then release again (must be kNotFound, no change)
  kPressure,        // [n]: alloc_pages(side lock, n % (gpu_pages + 3)) and hold them
  kPressureSlot,    // []: alloc_snapshot_slot(side lock) and hold it
  kUnpressure,      // [n]: free n % (held + 1) held pressure pages and one slot
  kCompleteCopy,    // [pick, flags]: complete one pending copy (any order); flags & 1: fail
                    //   it, flags & 2: then cache.poll(), flags & 4: only mark it failing
                    //   (it runs when the cache waits for it)
  kDelayCopy,       // [pick]: delay_ticket (kept pending until resumed)
  kResumeCopy,      // [pick]: resume a delayed copy
  kFailNext,        // [n]: fail_nth_submission(n % 4)
  kPoll,            // []: cache.poll()
  kDrain,           // []: cache.drain()
  kDropHost,        // []: cache.drop_host()
  kSettle,          // [flags]: complete every pending copy (flags & 1: newest first)
  kBadArgument,     // [kind, a, b]: an invalid call (see bad_argument) that must change nothing
  kEvict,           // [tier, n, s]: evict(n % 16 pages of tokens, s % 4 snapshots, tier & 1:
                    //   host); on GPU it frees exactly what the free count shows, at least
                    //   what was asked as far as sizes() said was evictable
  kPeek,            // [prompt]: peek(prompt) changes nothing and agrees with match()
  kRestart,         // [flags, seed]: a process restart on the same store; flags & 1: graceful
                    //   (persist() first; flags & 2: every request finishes before it), else a
                    //   crash (kill -9: MemoryStoreEngine::crash(seed)); a new cache follows
  kStoreFault,      // [kind, pick]: kind % 5: the next store write fails, a record rots
                    //   (records()[pick % count]), the next read has an I/O error, the next
                    //   store batch is refused, or store copies are held (pick & 1) / released
  kOpCount
};

/// A prompt argument: one byte s; s & 0x80 with known prompts: known[(s & 0x7f) % count];
/// else conversation s % 4 cut at [cut] % 41 tokens, [n] % 5 tail tokens [t] (1 + t % 3
/// each), then token 7.
constexpr std::uint8_t kKnownPrompt = 0x80;

/// Runs one input; returns normally when every check held, aborts otherwise.
void run_input(std::span<const std::uint8_t> data);

/// Seeds of the committed corpus (tests/fuzz/corpus/), by name.
struct Seed {
  std::string name;
  std::vector<std::uint8_t> bytes;
};
std::vector<Seed> seeds();

}  // namespace radixtier::fuzz
