// SharedTierModel: the simulator's model of the shared tier (issue 22): one content model
// that every instance of a cluster run reads and publishes to, and one sched::SharedHook per
// instance (attach()) that plays the real tier's part around its scheduler's admissions.
//
//   content      a byte-bounded LRU of entries keyed by (namespace, 128-bit path hash of
//                extend_path(), kind): a KV page (page_bytes) or the snapshot at a page's end
//                (snapshot_bytes); no bytes are kept, as in the counting engines
//   before_admit cache.peek() for the local usable and KV tokens, probe_range() (one round
//                trip), presence of each probed page and snapshot in the content, plan_fetch()
//                with the cost row's bandwidth and latency against the CostModel's prefill,
//                then the first (deepest) candidate: import_host() of the prompt up to it with
//                a fill that returns true (the engine has no bytes); on success its entries are
//                touched and SharedFetch{boundary, bytes, probe + fetch seconds} returned
//   after_finish cache.host_copies() of what the request inserted: every KV page up to the
//                deepest host snapshot on the path, and every host snapshot, published into the
//                content parents first (an entry already there is touched, not duplicated; a
//                published page whose host copy left is touched if there and ends the publish
//                if not), then cache.mark_published() up to where it got.
//                Write-through copies of the request's last insert may still be in flight: when
//                the host copies do not cover the insert yet, (tokens, ns) waits in a small
//                per-instance pending list, retried at that instance's later hook calls (at
//                most kSharedPendingRetries times) and dropped, counted, when the list is full
//
// The fetch rule is radixtier::shared's (fetch_plan.hpp), the one the real tier uses.
// Publishing is off every request's critical path (the real tier writes in the background):
// it costs no modeled time. Not modelled: readers contending for the shards or the NIC, a
// partial fetch (everything planned arrives), the tier's own failures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/scheduler/shared_hook.hpp"
#include "radixtier/transfer/store_record.hpp"

namespace radixtier::sim {

/// A probe reaches at least this many tokens past the local resume point (else it is not worth
/// its round trip): one 64-token page, the smallest thing a fetch can bring.
inline constexpr std::size_t kSharedProbeMinTokens = 64;
/// A probe asks about at most this many pages past the local KV in its one pipelined round.
inline constexpr std::size_t kSharedProbeMaxPages = 4096;
/// Requests per instance whose host copies are awaited for publishing.
inline constexpr std::size_t kSharedPendingPerInstance = 8;
/// Hook calls of its instance a pending publish is retried at before it is given up.
inline constexpr std::size_t kSharedPendingRetries = 8;

struct SharedTierOptions {
  std::uint64_t capacity_bytes = 0;  ///< the content model's budget (--shared-gib)
  std::uint32_t page_size = 0;
  std::uint64_t page_bytes = 0;
  std::uint64_t snapshot_bytes = 0;
  double bandwidth = 0;  ///< bytes/s to one reader (shared_bandwidth())
  double latency_s = 0;  ///< one round trip
  /// Prefill seconds from `from` to `to` tokens: the cost of not fetching.
  std::function<double(std::size_t from, std::size_t to)> recompute_s;
  std::size_t min_tokens = kSharedProbeMinTokens;
  std::size_t max_pages = kSharedProbeMaxPages;
  std::size_t pending_per_instance = kSharedPendingPerInstance;
  std::size_t pending_retries = kSharedPendingRetries;
};

/// What the shared tier did over a run (all instances).
struct SharedTierCounters {
  std::uint64_t probes = 0;           ///< lookups that probed (a non-empty probe range)
  std::uint64_t candidates = 0;       ///< probes that found a boundary worth fetching
  std::uint64_t fetches = 0;          ///< fetches entered into a cache (import_host succeeded)
  std::uint64_t import_failures = 0;  ///< import_host refused (no host room): nothing entered
  std::uint64_t fetched_tokens = 0;   ///< tokens past the local resume point the fetches brought
  std::uint64_t fetched_bytes = 0;
  std::uint64_t fetched_kv_pages = 0, fetched_snapshots = 0;
  double wait_s = 0;  ///< probe and fetch seconds, summed over admissions
  std::uint64_t published_kv_pages = 0, published_snapshots = 0;  ///< new entries
  std::uint64_t publish_touches = 0;                     ///< entries published again (touched)
  std::uint64_t evicted_entries = 0;                     ///< LRU victims
  std::uint64_t pending_queued = 0;                      ///< publishes that waited for host copies
  std::uint64_t pending_dropped = 0;                     ///< ... dropped: the list was full
  std::uint64_t pending_given_up = 0;                    ///< ... still incomplete after the retries
  std::uint64_t entries = 0, bytes = 0, peak_bytes = 0;  ///< the content at the end / at most
};

class SharedTierModel {
 public:
  explicit SharedTierModel(SharedTierOptions options);
  ~SharedTierModel();
  SharedTierModel(const SharedTierModel&) = delete;
  SharedTierModel& operator=(const SharedTierModel&) = delete;

  /// The hook of instance `instance`, over its cache (which must outlive its attachment).
  /// Attaching an instance again (a new process) replaces its hook and drops its pending list.
  sched::SharedHook& attach(std::size_t instance, PrefixCache& cache);

  const SharedTierCounters& counters() const { return counters_; }
  const SharedTierOptions& options() const { return options_; }

  enum class Kind : std::uint8_t { kKvPage = 1, kSnapshot = 2 };
  /// Whether the content holds the entry (no touch).
  bool contains(NamespaceId ns, const PathHash& path, Kind kind) const;

 private:
  class Client;
  struct Key {
    std::uint32_t ns = 0;
    Kind kind = Kind::kKvPage;
    PathHash path;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key;
    std::uint64_t bytes = 0;
  };

  enum class Put : std::uint8_t { kNew, kTouched, kTooLarge };
  /// Inserts (evicting the least recent entries for room) or touches.
  Put put(const Key& key, std::uint64_t bytes);
  void touch(const Key& key);

  SharedTierOptions options_;
  SharedTierCounters counters_;
  std::list<Entry> lru_;  ///< most recent first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace radixtier::sim
