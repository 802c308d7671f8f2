// SharedTier: the shared tier of one instance: what other instances computed, found and
// fetched on a local miss, and what this instance computed, published for them (issue 22).
// It links a PrefixCache (the local tree), the host memory its pages live in, and a
// SharedStore (RedisCluster, or another engine behind the same interface).
//
// A lookup (on the caller's thread, the scheduler's):
//   idle --lookup()--> probing (blocks at most probe_deadline: pipelined EXISTS of the KV
//                      pages after the local KV and the snapshot manifests after the local
//                      resume point; fetch_plan.hpp decides)
//        --> nothing worth fetching: done (id 0)
//        --> fetching on one of a fixed pool of worker threads (GET into private buffers:
//            reply vectors borrowed from a pool of fetch_buffer_bytes and given back once
//            decoded, so steady-state
//            fetches reuse warm memory; every value's header and checksum checked; the deepest
//            boundary whose KV and snapshot arrived whole; the next candidate down when a snapshot
//            did not) until fetch_deadline
//   fetching --finish(id)--> import_host() on the caller's thread: only checked bytes are
//            copied into freshly taken host pages; a fetch that failed or came late enters
//            nothing. A reply never lands in the cache's pages directly, so a late one cannot
//            land in reused pages.
// Publishing (after a request finished; publish()/after_finish()):
//   the usable host copies along its tokens are copied out at once (PrefixCache::host_copies:
//   KV up to the deepest host snapshot, every host snapshot on the way), queued as one job
//   (bounded bytes: a job that does not fit is dropped and counted), and written by the
//   publisher thread: EXISTS first (existing keys are skipped), then KV pages and snapshot
//   chunks, then the manifests last, so a reader that sees a manifest finds its chunks.
//   Host copies still on their way (a write-through copy in flight) are retried on later
//   calls. Nothing is ever deleted: the store's own eviction (maxmemory, allkeys-lru) ages
//   entries out, and a reader treats a hole as a miss.
// Never block, never corrupt: every store call has an absolute deadline; a failed, late or
// mismatching value is a miss, counted in stats().
//
// Threading: lookup/finish/before_admit/after_finish/publish/pump on the cache's thread; the
// fetch and publisher threads touch only their private buffers and the store.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/scheduler/shared_hook.hpp"
#include "radixtier/shared/fetch_plan.hpp"
#include "radixtier/shared/shared_keys.hpp"
#include "radixtier/shared/shared_store.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::shared {

namespace detail {
class ReplyPool;
}  // namespace detail

struct SharedTierConfig {
  ModelFingerprint model;  ///< its geometry must equal the cache's (create() checks)
  /// Namespaces shared besides the default one, by id, with their salt (what names them in
  /// the store: the same salt on every instance). The default namespace is shared under the
  /// salt "default" unless share_default is false or a salt is listed for it.
  std::map<std::uint32_t, std::string> namespace_salts;
  /// Secret keys by namespace id (kMinKeyBytes..kMaxKeyBytes bytes each, the same on every
  /// instance of the namespace; the namespace must be shared): its key names are derived
  /// with the key (namespace_hash(salt, key)), its values carry a keyed BLAKE2b MAC and its
  /// KV pages a keyed digest of their tokens instead of the tokens (value_codec.hpp). Without
  /// a key a namespace's values are checked against accidents only: anyone who can write to
  /// the store can make its readers serve wrong bytes (docs/shared-tier.md, Security).
  std::map<std::uint32_t, std::string> namespace_keys;
  bool share_default = true;
  std::chrono::milliseconds probe_deadline{20};
  std::chrono::milliseconds fetch_deadline{2000};
  std::chrono::milliseconds publish_deadline{5000};
  /// A lookup runs when the prompt reaches at least this many tokens past the local resume
  /// point (a shorter gain is not worth a round trip).
  std::size_t min_tokens = 256;
  std::size_t max_probe_pages = 4096;              ///< pages probed past the local KV, at most
  std::size_t chunk_bytes = std::size_t{4} << 20;  ///< a snapshot's chunks
  /// The cost rule (fetch_plan.hpp): the store's bandwidth to this reader and round trip, and
  /// this instance's prefill speed (what a fetch saves).
  double bandwidth = 2e9;
  double latency_s = 0.0005;
  double prefill_tokens_per_s = 20000;
  std::size_t publish_queue_bytes = std::size_t{1} << 30;
  /// Reply buffers kept between fetches, at most (bytes of value capacity; a few vectors):
  /// a fetch receives its values into memory an earlier fetch touched instead of fresh
  /// pages. 0: every fetch allocates its own.
  std::size_t fetch_buffer_bytes = std::size_t{512} << 20;
  std::size_t max_pending = 64;     ///< publishes waiting for host copies, at most
  std::uint32_t pending_tries = 8;  ///< calls a pending publish waits before it goes as is

  Status validate() const;
};

struct SharedTierStats {
  std::uint64_t lookups = 0;         ///< lookups that probed
  std::uint64_t probe_failures = 0;  ///< probes with a key failed (deadline, shard down)
  std::uint64_t probe_keys = 0;
  std::uint64_t fetches = 0;            ///< fetches started
  std::uint64_t fetches_refused = 0;    ///< fetches worth making but not started (queue full)
  std::uint64_t fetches_abandoned = 0;  ///< fetches never finished, freed (see finish())
  std::uint64_t fetch_failures = 0;     ///< fetches that brought nothing usable
  std::uint64_t fallbacks = 0;          ///< fetches that resumed below their first candidate
  std::uint64_t imports = 0;            ///< fetches entered into the cache
  std::uint64_t import_refused = 0;     ///< fetches the cache could not enter (no room, changed)
  std::uint64_t imported_pages = 0, imported_snapshots = 0, imported_tokens = 0;
  std::uint64_t bytes_fetched = 0;
  std::uint64_t values_rejected = 0;  ///< values whose header, tokens or checksum failed
  std::uint64_t values_missing = 0;   ///< values gone between probe and fetch
  std::uint64_t publish_jobs = 0, publish_dropped = 0, publish_failures = 0;
  std::uint64_t published_keys = 0, publish_skipped = 0;  ///< written / already there
  std::uint64_t bytes_published = 0;
};

class SharedTier final : public sched::SharedHook {
 public:
  /// kInvalidArgument: a bad config, or a model geometry that is not the cache's.
  static Result<std::unique_ptr<SharedTier>> create(const SharedTierConfig& config,
                                                    PrefixCache& cache, HostPages& host,
                                                    SharedStore& store);
  ~SharedTier() override;
  SharedTier(const SharedTier&) = delete;
  SharedTier& operator=(const SharedTier&) = delete;

  /// Probes for `prompt` and starts the fetch worth making; 0 when none (no lookup needed,
  /// nothing shared, a failed probe, not worth it). Blocks at most probe_deadline.
  std::uint64_t lookup(std::span<const Token> prompt, NamespaceId ns);
  /// True when fetch `id` has ended (never blocks).
  bool ready(std::uint64_t id) const;
  /// Waits for fetch `id` (at most its deadline) and enters what arrived whole into the cache.
  /// A fetch not finished within fetch_deadline after its own deadline is abandoned: the next
  /// lookup() frees it (fetches_abandoned) and finish() on it then returns nothing.
  sched::SharedFetch finish(std::uint64_t id);

  /// lookup() + finish(): what the reference scheduler calls before each admission.
  sched::SharedFetch before_admit(sched::RequestId id, std::span<const Token> prompt,
                                  NamespaceId ns) override;
  void after_finish(sched::RequestId id, std::span<const Token> tokens, NamespaceId ns) override;

  /// Queues what the cache holds on host along `tokens` for publishing.
  void publish(std::span<const Token> tokens, NamespaceId ns);
  /// Retries the publishes waiting for host copies (the hook calls run it too).
  void pump();
  /// Waits until every queued publish was written (tests, a graceful shutdown).
  void flush_publishes();

  SharedTierStats stats() const;
  const SharedTierConfig& config() const { return config_; }

 private:
  struct Fetch;
  struct Job;
  struct Pending {
    std::vector<Token> tokens;
    NamespaceId ns;
    std::uint32_t tries = 0;
  };
  SharedTier(const SharedTierConfig& config, PrefixCache& cache, HostPages& host,
             SharedStore& store);
  /// The key space of `ns`, or none when it is not shared.
  const KeySpace* space(NamespaceId ns) const;
  /// Copies the host data along tokens into a job; false when it should wait for more.
  bool try_publish(const Pending& p, bool last_try);
  void publisher_loop();
  void worker_loop();
  void reap_abandoned();
  void run_job(Job& job);
  static void run_fetch(Fetch& f, SharedStore& store, detail::ReplyPool& pool,
                        std::size_t page_bytes);
  static void run_fetch_unguarded(Fetch& f, SharedStore& store, detail::ReplyPool& pool,
                                  std::size_t page_bytes);

  SharedTierConfig config_;
  PrefixCache& cache_;
  HostPages& host_;
  SharedStore& store_;
  std::unordered_map<std::uint32_t, KeySpace> spaces_;
  std::uint64_t next_fetch_ = 1;
  std::unique_ptr<detail::ReplyPool> reply_pool_;  ///< outlives fetches_ (declared before)
  /// Fetches run on a fixed pool of workers (no thread per lookup); fetch_mu_ guards the
  /// queue, fetches_ and each Fetch::done.
  mutable std::mutex fetch_mu_;
  std::condition_variable fetch_cv_, done_cv_;
  std::deque<Fetch*> fetch_queue_;
  bool fetch_stop_ = false;
  std::unordered_map<std::uint64_t, std::unique_ptr<Fetch>> fetches_;
  std::vector<std::thread> workers_;
  std::deque<Pending> pending_;

  mutable std::mutex mu_;  ///< guards the queue, the stats and stop_
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::size_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  SharedTierStats stats_;
  std::thread publisher_;
};

}  // namespace radixtier::shared
