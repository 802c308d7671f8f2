// The cache run of the shared scenario (Workload::shared_before): two processes of the tiny
// model on one Redis Cluster. The first plays requests [0, shared_before) with a SharedTier
// that publishes what it computed and exits; the second, a new process with empty memory and
// an empty cache, plays the rest and resumes from what the first published. Each process is a
// fork() of this one (the parent has no other thread then) that sends its results back
// through a pipe; the cluster is Workload::shared_seeds, or a LocalCluster started for the run.
#pragma once

#include "demo/scenarios.hpp"

namespace radixtier::demo {

void run_with_shared(const Workload& w, const model::TinyHybridModel& model, const CacheConfig& c,
                     const sched::SchedulerConfig& sc, RunOutcome& out);

/// Plays requests [begin, end) of `w` through a scheduler over `cache` (runner.cpp).
Status play(const Workload& w, std::size_t begin, std::size_t end, CacheBackend& cache,
            sched::Executor& executor, const sched::SchedulerConfig& sc, const std::string& phase,
            const ProgressFn& progress, RunOutcome& out, sched::SharedHook* shared = nullptr);

/// The demo's virtual clock: 0.1 ms per forwarded token.
inline constexpr double kSecondsPerToken = 1e-4;

}  // namespace radixtier::demo
