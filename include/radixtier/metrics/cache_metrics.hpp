// CacheMetrics: a PrefixCache's stats(), occupancy() and latencies as Prometheus metrics.
//
// It registers its families into the caller's prometheus::Registry (names in
// docs/events-and-metrics.md) and is the cache's TimingHooks for the two histograms. The
// cache is single-threaded, so update() -- which copies stats() and occupancy() into the
// counters and gauges -- runs on the cache's thread (a scheduler calls it once per step);
// a scrape on the exposer's thread reads only the metrics' own atomics.
// MetricsServer is the same plus a registry and prometheus-cpp's HTTP exposer.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "radixtier/cache/event_queue.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/cache/timing_hooks.hpp"

namespace radixtier {

class CacheMetrics final : public TimingHooks {
 public:
  /// Registers the families (every metric carries `labels`, e.g. {"cache", "worker-0"}).
  /// `events`, if given, is reported as radixtier_events_dropped_total and
  /// radixtier_events_restarts_total (ZmqPublisher::queue()). Both must outlive it.
  CacheMetrics(prometheus::Registry& registry, const PrefixCache& cache,
               const prometheus::Labels& labels = {}, const EventQueue* events = nullptr);

  /// Brings counters and gauges up to the cache's stats() and occupancy() now.
  void update();

  void on_admit(std::chrono::nanoseconds elapsed) override;
  void on_copy(const CopyTiming& copy) override;

 private:
  struct Mirrored {
    prometheus::Counter* counter;
    std::uint64_t CacheStats::*field;
    std::uint64_t last = 0;
  };
  const PrefixCache& cache_;
  const EventQueue* events_;
  std::vector<Mirrored> counters_;
  prometheus::Counter* events_dropped_ = nullptr;
  std::uint64_t events_dropped_last_ = 0;
  prometheus::Counter* events_restarts_ = nullptr;
  std::uint64_t events_restarts_last_ = 0;
  prometheus::Gauge *gpu_free_, *host_free_, *gpu_slots_free_, *host_slots_free_;
  prometheus::Gauge *gpu_used_, *host_used_, *gpu_slots_used_;
  prometheus::Gauge *nodes_, *in_flight_, *host_peak_;
  prometheus::Histogram* admit_latency_;
  prometheus::Histogram *copy_latency_d2h_, *copy_latency_h2d_;
};

/// CacheMetrics in its own registry, served over HTTP at /metrics.
class MetricsServer {
 public:
  /// bind: "host:port" (port 0: any free port, see port()). Attaches the timing hooks.
  static Result<std::unique_ptr<MetricsServer>> create(PrefixCache& cache, const std::string& bind,
                                                       const EventQueue* events = nullptr);
  ~MetricsServer();  ///< detaches the timing hooks
  void update() { metrics_->update(); }
  int port() const;
  prometheus::Registry& registry() { return *registry_; }

 private:
  MetricsServer() = default;
  PrefixCache* cache_ = nullptr;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<CacheMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace radixtier
