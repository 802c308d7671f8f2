// SharedHook: what a shared tier does around the reference scheduler's admissions
// (radixtier::shared::SharedTier over a real store; the simulator's model of one).
//
//   submit --> [before_admit: may enter what other instances computed into the cache, as
//               host-resident nodes] --> cache.admit (promotes it like any host node)
//   finish --> release --> [after_finish: what the request computed may be published]
//
// Both run on the scheduler's thread. before_admit blocks at most the shared tier's own
// deadlines (probe, then fetch) and reports what it brought and how long the admission waited
// for it, so a caller can price it (the simulator adds `seconds` to the request's TTFT).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "radixtier/ids.hpp"
#include "radixtier/scheduler/executor.hpp"

namespace radixtier::sched {

/// What before_admit() brought into the cache for one admission.
struct SharedFetch {
  std::size_t tokens = 0;   ///< the boundary the cache can now resume at thanks to it (0: none)
  std::uint64_t bytes = 0;  ///< bytes fetched (KV pages and the snapshot)
  double seconds = 0;       ///< the admission's wait for the lookup and the fetch
};

class SharedHook {
 public:
  virtual ~SharedHook() = default;
  virtual SharedFetch before_admit(RequestId id, std::span<const Token> prompt, NamespaceId ns) = 0;
  /// `tokens`: what the request inserted (prompt + output up to its last inserted boundary).
  virtual void after_finish(RequestId id, std::span<const Token> tokens, NamespaceId ns) = 0;
};

}  // namespace radixtier::sched
