// Scheduler: a reference continuous-batching scheduler that links a CacheBackend as its cache
// and an Executor as its compute.
//
// A request's states and the calls that move it (all on the scheduler's one thread):
//
//   Queued   --admit()-------------> Running/prefill   cache.admit(prompt); cache.wait(lock)
//                                                      gives where it resumes (less than the
//                                                      match when part of it failed to
//                                                      arrive; kTransferFailed from a backend
//                                                      that cannot resume: release, admit
//                                                      again); executor.begin(request,
//                                                      path_snapshot) copies the matched
//                                                      snapshot into the request's own state
//   prefill  --one forward per step-> prefill/decode  alloc_pages; slots for the states it
//                                                      captures; forward; insert each
//                                                      capture, then the end if on a page
//                                                      boundary (a snapshot if the policy
//                                                      keeps one there)
//   decode   --one token per step--> decode/finish     alloc a page when one fills;
//                                                      checkpoint() at each page boundary
//                                                      (or every decode_checkpoint_interval)
//   finish                           Finished          insert the last page boundary of
//                                                      prompt + output with the checkpoint as
//                                                      its snapshot; free own pages; release
//   Running  --no GPU room--------->  Queued           preempted (youngest first) when no
//                                                      running request can progress; or
//                                     Failed           when it is the only one running
//
// Chunks: prefill resumes at the usable match; its boundaries are every multiple of
// chunk_tokens (absolute positions, so boundaries line up across requests), every boundary
// the policy asks for (SnapshotPolicy::next_cut: interval multiples, the adaptive policy's
// aligned tail and branch point; the +tail and +branch boundaries are chunk multiples
// already) and the prompt length floored to a page; the tokens after that last page boundary
// run as one short chunk. So every chunk but the last ends on a page boundary.
// Forwards: one forward runs up to forward_tokens of prompt (the engine's chunked-prefill
// size), ending on a boundary. A boundary inside it where the policy keeps a snapshot gets
// its state from a capture (Executor::forward_capturing) when the executor can capture there;
// else the forward ends at that boundary. Boundaries inside a forward that keep no snapshot
// are not inserted on their own: the forward's end inserts their KV.
//
// Time: a virtual clock. Each forward() advances it by the seconds the executor returns
// (requests in flight take turns: one forward or one decode token each per step). A request
// is admitted only when now >= its arrival; when nothing runs the clock jumps to the next
// arrival. Reload time is not on the clock: each request records the CacheStats deltas of
// its admission so the caller can price the copies with its own cost model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/scheduler/executor.hpp"
#include "radixtier/scheduler/placement_learner.hpp"
#include "radixtier/scheduler/shared_hook.hpp"
#include "radixtier/scheduler/snapshot_policy.hpp"

namespace radixtier::sched {

/// Where prefill chunks are counted from: multiples of chunk_tokens from the root (a chunk end
/// is the same token position for every request that shares it), or from where the request
/// resumed (SGLang's and vLLM's chunked prefill: chunk_tokens at a time from the cache hit).
enum class ChunkOrigin { kRoot, kResume };

struct SchedulerConfig {
  std::size_t chunk_tokens = 256;  ///< prefill chunk, a positive multiple of the page size
  ChunkOrigin chunk_origin = ChunkOrigin::kRoot;
  /// Prompt tokens one forward runs at most: a positive multiple of chunk_tokens, or 0 for
  /// chunk_tokens (see "Forwards" above). Even at chunk_tokens a boundary the policy adds
  /// inside a chunk (next_cut) is captured when the executor can, not cut; one it adds and
  /// does not keep is not inserted on its own.
  std::size_t forward_tokens = 0;
  std::size_t max_running = 4;  ///< requests in flight at once
  SnapshotPolicy policy = SnapshotPolicy::adaptive();
  bool snapshot_at_finish = true;  ///< keep a snapshot at the finish boundary
  /// Decode checkpoints the live state every this many tokens (0: every page boundary); the
  /// finish boundary is the last of them. A positive page multiple (SGLang tracks the state
  /// every mamba_track_interval = 256 decode tokens).
  std::size_t decode_checkpoint_interval = 0;
  /// Decode also inserts every checkpoint boundary it crosses with its state, not only the
  /// finish boundary (vLLM's align mode caches the state of each block decode fills).
  bool insert_decode_checkpoints = false;
  std::uint32_t max_admissions = 8;    ///< admissions per request (failed promotions, preemption)
  bool check_invariants = false;       ///< run cache.check_invariants() after every step
  std::size_t kv_bytes_per_token = 0;  ///< for the budgeted policy's default budget (0: unknown)
  /// The stream the forward passes run on (RequestOptions::stream of every admission;
  /// nullptr: the engine's default). With a cache that supports_stream_wait(), a resumed
  /// request's forward starts right after admit: its stream waits on the device for the
  /// copies (stream_wait, layer by layer) instead of the host waiting (wait(lock)); the
  /// scheduler checks poll(lock) after the first forward, before any insert or sampling, and
  /// recomputes the request when a copy failed (docs/scheduler.md).
  StreamHandle stream = nullptr;
  /// Layers (or layer groups) the forward reads in order: stream_wait(lock, stream, L) for L
  /// = 0 .. forward_layers - 1 before the forward reads layer L (0: one wait for them all).
  std::uint32_t forward_layers = 0;
  /// Use stream_wait when the cache supports it (false: wait(lock) on the host, as before).
  bool use_stream_wait = true;

  /// Rejects nonsense with a message naming the field.
  Status validate(std::uint32_t page_size) const;
};

struct Request {
  RequestId id = 0;
  std::vector<Token> prompt;       ///< at least one token
  std::size_t max_new_tokens = 0;  ///< output tokens to generate (0: prefill only)
  double arrival_s = 0.0;          ///< not admitted before the clock reaches it
  /// Key namespace (adapter, cache salt, tenant) and retention priority, passed to every
  /// admission (CacheBackend::admit(prompt, options)); a backend without namespaces fails
  /// the request when ns is not the default one.
  NamespaceId ns = kDefaultNamespace;
  RetentionPriority priority = kDefaultPriority;
};

struct RequestResult {
  RequestId id = 0;
  Status status;                    ///< ok, or why the request failed
  std::vector<Token> output;        ///< max_new_tokens tokens when ok
  std::vector<float> first_logits;  ///< logits after the whole prompt (empty: cost executor)
  std::vector<float> final_logits;  ///< logits of the last forward() (empty: cost executor)
  std::size_t prompt_tokens = 0;

  // --- reuse, of the admission that completed the request --------------------------------
  std::size_t cached_tokens = 0;       ///< usable match at admission
  std::size_t kv_tokens = 0;           ///< cached KV along the prompt at admission, snapshot
                                       ///< or not (Admission::kv_tokens; the +branch rule)
  std::size_t gpu_cached_tokens = 0;   ///< of which already on GPU
  std::size_t host_cached_tokens = 0;  ///< of which promoted from host
  bool snapshot_from_host = false;
  std::size_t recomputed_tokens = 0;  ///< prompt tokens prefilled (prompt - cached)
  std::uint64_t admit_bytes_h2d = 0;  ///< CacheStats deltas around admit + wait
  std::uint64_t admit_copies_h2d = 0;
  std::uint64_t admit_bytes_d2h = 0;
  /// The tier below host, the same deltas: records read from the store (store -> host, before
  /// the host -> GPU copies above), their bytes, and the usable-match tokens they gave.
  std::uint64_t admit_store_reads = 0;
  std::uint64_t admit_bytes_from_store = 0;
  std::size_t store_cached_tokens = 0;
  /// The shared tier (set_shared_hook): what its before_admit() brought for this admission.
  std::size_t shared_tokens = 0;
  std::uint64_t shared_bytes = 0;
  double shared_s = 0;

  // --- totals over the request's life (every admission) -----------------------------------
  std::size_t computed_tokens = 0;  ///< every token forwarded, prefill and decode
  std::uint64_t bytes_h2d = 0;      ///< CacheStats deltas of the cache calls made for it
  std::uint64_t bytes_d2h = 0;
  std::uint32_t snapshots_kept = 0;              ///< snapshots the cache adopted from this request
  std::vector<std::size_t> snapshot_boundaries;  ///< where (token counts)
  std::uint32_t admissions = 0;
  std::uint32_t transfer_failures = 0;  ///< admissions whose promotion failed (in part)
  std::uint32_t preemptions = 0;

  // --- time (virtual clock) ---------------------------------------------------------------
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  double prefill_s = 0;  ///< executor seconds of the prompt's chunks (last admission)
  double decode_s = 0;   ///< executor seconds of decode
  double queue_s() const { return admitted_s - arrival_s; }
};

struct SchedulerStats {
  std::uint64_t steps = 0;
  std::uint64_t admissions = 0;
  std::uint64_t transfer_failures = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t stalls = 0;  ///< request-steps that waited for GPU room
  std::uint64_t finished = 0;
  std::uint64_t failed = 0;
  std::uint64_t forwarded_tokens = 0;
  std::uint64_t snapshots_offered = 0;     ///< boundaries where the policy said keep
  std::uint64_t snapshots_kept = 0;        ///< of which the cache adopted
  std::uint64_t snapshot_slot_misses = 0;  ///< keep, but no GPU snapshot slot free
  std::uint64_t snapshots_captured = 0;    ///< of the kept, captured inside a forward
  /// Seconds the cache's copy waits (CacheStats::alloc_wait_*) held the scheduler's thread,
  /// as Executor::copy_wait_seconds() reports them; charged to the virtual clock.
  double copy_wait_s = 0;
  /// The same for store writes the cache waited for (CacheStats::store_copy_waits /
  /// store_wait_bytes), as Executor::store_wait_seconds() reports them.
  double store_wait_s = 0;
};

/// Reported by run_until_idle() after each step.
struct Progress {
  std::size_t submitted = 0, finished = 0, failed = 0, running = 0, queued = 0;
  std::uint64_t forwarded_tokens = 0;
  double now_s = 0;
};

class Scheduler {
 public:
  /// Throws std::invalid_argument with validate()'s message when the config is invalid; use
  /// create() to get a Status instead. Both must outlive the scheduler.
  Scheduler(CacheBackend& cache, Executor& executor, SchedulerConfig config);
  static Result<std::unique_ptr<Scheduler>> create(CacheBackend& cache, Executor& executor,
                                                   SchedulerConfig config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queues a request. kInvalidArgument: empty prompt, id already used.
  Status submit(Request request);

  /// One round: admit what has arrived and fits, then one forward or one decode token for
  /// every running request. An error means the scheduler itself is broken (an invariant
  /// check failed or the cache rejected a call it must accept); request failures are
  /// reported in their results, not here.
  Status step();
  /// Steps until nothing is queued or running.
  Status run_until_idle(const std::function<void(const Progress&)>& on_progress = {});

  bool idle() const { return queue_.empty() && running_.empty(); }
  double now() const { return now_; }
  std::size_t running() const { return running_.size(); }
  std::size_t queued() const { return queue_.size(); }
  /// The clock at which the next step() runs: now(), or the next arrival when nothing runs
  /// (step() jumps there). Lets a caller interleave several schedulers in time order.
  double next_step_s() const;

  /// Results of finished and failed requests, by id.
  const std::map<RequestId, RequestResult>& results() const { return results_; }
  const RequestResult* result(RequestId id) const;
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }
  /// What the adaptive placement has learned (alignment, finish continuations).
  const PlacementLearner& learner() const { return learner_; }
  /// Attaches a shared tier (not owned; nullptr detaches): before_admit() runs before every
  /// admission, after_finish() after every finished request (shared_hook.hpp).
  void set_shared_hook(SharedHook* hook) { shared_ = hook; }

 private:
  struct Running;
  enum class Outcome { kProgress, kStalled, kFinished, kFailed };

  void admit_arrived();
  Status admit(Request request, RequestResult result);
  Outcome advance(Running& r);
  Outcome prefill_chunk(Running& r);
  Outcome decode_token(Running& r);
  Outcome emit_token(Running& r);               ///< next_token into the output and the sequence
  SnapshotQuery query(const Running& r) const;  ///< the policy query of r's prompt (no boundary)
  Outcome finish(Running& r);
  /// Inserts table pages up to `boundary` (and a snapshot from live state or checkpoint).
  enum class StateSource { kNone, kLive, kCheckpoint };
  Status insert_boundary(Running& r, std::size_t boundary, StateSource source);
  /// The same with a snapshot already in `slot` (a capture; nullopt: none).
  Status insert_boundary(Running& r, std::size_t boundary, std::optional<GpuSlotId> slot);
  /// The end of the forward that starts at r.done, and the boundaries inside it whose states
  /// it captures (see "Forwards" above).
  std::size_t plan_forward(const Running& r, const SnapshotQuery& q,
                           std::vector<std::size_t>& captures) const;
  Result<std::vector<GpuPageId>> alloc_pages(Running& r, std::size_t n);
  void stop(Running& r);  ///< frees own pages, releases the lock, ends the executor state
  void fail(Running& r, Status why);
  void preempt(Running& r);
  /// poll(lock) of a request started with stream_wait: kProgress when its prefix arrived,
  /// else it is stopped and queued again (its work discarded).
  Outcome confirm_prefix(Running& r);
  void note_stats(RequestResult& result, const CacheStats& before);
  Progress progress() const;

  CacheBackend& cache_;
  Executor& executor_;
  SchedulerConfig config_;
  std::uint32_t page_size_;
  PlacementLearner learner_;  ///< observes every admission and finish (adaptive placement)

  std::deque<std::pair<Request, RequestResult>> queue_;  ///< by arrival, then submission
  std::vector<std::unique_ptr<Running>> running_;        ///< admission order
  std::map<RequestId, RequestResult> results_;
  std::set<RequestId> known_ids_;
  SharedHook* shared_ = nullptr;
  bool hold_admission_ = false;  ///< after a preemption: admit nothing until one finishes
  double now_ = 0.0;
  SchedulerStats stats_;
};

}  // namespace radixtier::sched
