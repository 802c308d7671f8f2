// TimingHooks: what the cache measures for latency histograms (radixtier_metrics uses it).
//
// Called on the cache's thread; only read the clock while a hook is attached, so a cache
// without one pays a null check. Copy latency runs from submission to the reap that finds
// the copy finished (poll() or an entry point), an upper bound of the copy's own time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace radixtier {

struct CopyTiming {
  bool to_host = false;     ///< device-to-host (demotion, write-through), else promotion
  std::uint64_t bytes = 0;  ///< bytes of the batch
  std::size_t slices = 0;   ///< copies (slices) of the batch
  bool ok = false;          ///< false: the copy failed
  std::chrono::nanoseconds elapsed{0};
};

class TimingHooks {
 public:
  virtual ~TimingHooks() = default;
  /// One admit() call, from entry to return (match, lock, room, promotion submitted).
  virtual void on_admit(std::chrono::nanoseconds elapsed) = 0;
  /// One transfer batch, reaped.
  virtual void on_copy(const CopyTiming& copy) = 0;
};

}  // namespace radixtier
