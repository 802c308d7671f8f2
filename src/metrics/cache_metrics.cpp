#include "radixtier/metrics/cache_metrics.hpp"

#include <stdexcept>

namespace radixtier {

namespace {
using prometheus::Labels;

Labels with(Labels base, const std::string& k, const std::string& v) {
  base.emplace(k, v);
  return base;
}

prometheus::Histogram::BucketBoundaries seconds_buckets(double from, int n) {
  prometheus::Histogram::BucketBoundaries b;
  for (double x = from; n > 0; --n, x *= 4) b.push_back(x);
  return b;
}
}  // namespace

CacheMetrics::CacheMetrics(prometheus::Registry& r, const PrefixCache& cache, const Labels& labels,
                           const EventQueue* events)
    : cache_(cache), events_(events) {
  auto counter = [&](const std::string& name, const std::string& help) -> auto& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  auto mirror = [&](prometheus::Family<prometheus::Counter>& f, const Labels& l,
                    std::uint64_t CacheStats::*field) {
    counters_.push_back({&f.Add(l), field, 0});
  };
  mirror(counter("radixtier_admissions_total", "admit() calls"), labels, &CacheStats::admissions);
  mirror(counter("radixtier_requested_tokens_total", "tokens asked for at admission"), labels,
         &CacheStats::requested_tokens);
  auto& hits = counter("radixtier_hit_tokens_total",
                       "usable-match tokens at admission, by the tier their KV was on");
  mirror(hits, with(labels, "tier", "gpu"), &CacheStats::hit_tokens_gpu);
  mirror(hits, with(labels, "tier", "host"), &CacheStats::hit_tokens_host);
  auto& bytes = counter("radixtier_copy_bytes_total", "bytes copied, by direction");
  mirror(bytes, with(labels, "direction", "d2h"), &CacheStats::bytes_d2h);
  mirror(bytes, with(labels, "direction", "d2d"), &CacheStats::bytes_d2d);
  mirror(bytes, with(labels, "direction", "h2d"), &CacheStats::bytes_h2d);
  auto& copies = counter("radixtier_copies_total", "copies (slices) submitted, by direction");
  mirror(copies, with(labels, "direction", "d2h"), &CacheStats::copies_d2h);
  mirror(copies, with(labels, "direction", "h2d"), &CacheStats::copies_h2d);
  mirror(counter("radixtier_kv_pages_demoted_total", "KV pages demoted GPU to host"), labels,
         &CacheStats::kv_pages_demoted);
  mirror(counter("radixtier_kv_pages_promoted_total", "KV pages promoted host to GPU"), labels,
         &CacheStats::kv_pages_promoted);
  auto& dropped = counter("radixtier_kv_pages_dropped_total", "KV pages dropped, by tier");
  mirror(dropped, with(labels, "tier", "gpu"), &CacheStats::kv_pages_dropped_gpu);
  mirror(dropped, with(labels, "tier", "host"), &CacheStats::kv_pages_dropped_host);
  mirror(dropped, with(labels, "tier", "store"), &CacheStats::kv_pages_dropped_store);
  mirror(counter("radixtier_dead_kv_pages_dropped_total", "KV pages dropped as dead KV"), labels,
         &CacheStats::dead_kv_pages_dropped);
  mirror(counter("radixtier_snapshots_demoted_total", "snapshots demoted"), labels,
         &CacheStats::snapshots_demoted);
  mirror(counter("radixtier_snapshots_promoted_total", "snapshots promoted"), labels,
         &CacheStats::snapshots_promoted);
  mirror(counter("radixtier_snapshots_dropped_total", "snapshots lost from every tier"), labels,
         &CacheStats::snapshots_dropped);
  mirror(counter("radixtier_snapshots_inserted_total", "snapshots inserted"), labels,
         &CacheStats::snapshots_inserted);
  auto& resumes = counter("radixtier_snapshot_resumes_total",
                          "resumes from a path's last snapshot (frontier) or a spent one");
  mirror(resumes, with(labels, "kind", "frontier"), &CacheStats::frontier_resumes);
  mirror(resumes, with(labels, "kind", "spent"), &CacheStats::spent_resumes);
  mirror(counter("radixtier_snapshot_slot_misses_total", "GPU snapshot slots refused"), labels,
         &CacheStats::snapshot_slot_misses);
  mirror(counter("radixtier_transfers_failed_total", "transfer batches failed or refused"), labels,
         &CacheStats::transfers_failed);
  // The store tier (zero without one).
  auto& store_bytes = counter("radixtier_store_bytes_total", "store tier bytes, by direction");
  mirror(store_bytes, with(labels, "direction", "write"), &CacheStats::bytes_to_store);
  mirror(store_bytes, with(labels, "direction", "read"), &CacheStats::bytes_from_store);
  auto& store_records = counter("radixtier_store_records_total", "store records, by direction");
  mirror(store_records, with(labels, "direction", "write"), &CacheStats::store_writes);
  mirror(store_records, with(labels, "direction", "read"), &CacheStats::store_reads);
  mirror(hits, with(labels, "tier", "store"), &CacheStats::hit_tokens_store);
  mirror(counter("radixtier_store_records_lost_total", "store reads that failed their check"),
         labels, &CacheStats::store_records_lost);
  mirror(counter("radixtier_store_failures_total", "store writes or reads that failed"), labels,
         &CacheStats::store_failures);
  mirror(counter("radixtier_store_copy_waits_total", "waits on a store write for host room"),
         labels, &CacheStats::store_copy_waits);
  mirror(counter("radixtier_alloc_copy_waits_total", "waits on a copy for GPU room"), labels,
         &CacheStats::alloc_copy_waits);
  mirror(counter("radixtier_host_waits_total",
                 "copies the cache waited for on the calling thread (0 per admit/insert when "
                 "nothing forces a wait)"),
         labels, &CacheStats::host_waits);
  if (events_ != nullptr) {
    events_dropped_ =
        &counter("radixtier_events_dropped_total", "KV events dropped by a full queue").Add(labels);
    events_restarts_ = &counter("radixtier_events_restarts_total",
                                "KV event streams restarted (AllBlocksCleared and the contents) "
                                "because a full queue dropped events")
                            .Add(labels);
  }

  auto& free = prometheus::BuildGauge()
                   .Name("radixtier_pool_free")
                   .Help(
                       "free entries of each pool (host_snapshot_slots: snapshots the free "
                       "host pages would hold)")
                   .Register(r);
  gpu_free_ = &free.Add(with(labels, "pool", "gpu_pages"));
  host_free_ = &free.Add(with(labels, "pool", "host_pages"));
  gpu_slots_free_ = &free.Add(with(labels, "pool", "gpu_snapshot_slots"));
  host_slots_free_ = &free.Add(with(labels, "pool", "host_snapshot_slots"));
  auto& used = prometheus::BuildGauge()
                   .Name("radixtier_pool_used")
                   .Help("entries of each pool held by the tree, requests or copies")
                   .Register(r);
  gpu_used_ = &used.Add(with(labels, "pool", "gpu_pages"));
  host_used_ = &used.Add(with(labels, "pool", "host_pages"));
  gpu_slots_used_ = &used.Add(with(labels, "pool", "gpu_snapshot_slots"));
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
  };
  nodes_ = gauge("radixtier_nodes", "nodes in the tree, the root included");
  in_flight_ = gauge("radixtier_transfers_in_flight", "transfer batches in flight");
  host_peak_ = gauge("radixtier_host_bytes_peak", "most host bytes in use at once");

  auto& admit = prometheus::BuildHistogram()
                    .Name("radixtier_admission_latency_seconds")
                    .Help("time of one admit() call")
                    .Register(r);
  admit_latency_ = &admit.Add(labels, seconds_buckets(1e-6, 12));
  auto& copy = prometheus::BuildHistogram()
                   .Name("radixtier_copy_latency_seconds")
                   .Help("submission to reap of one transfer batch, by direction")
                   .Register(r);
  copy_latency_d2h_ = &copy.Add(with(labels, "direction", "d2h"), seconds_buckets(1e-5, 12));
  copy_latency_h2d_ = &copy.Add(with(labels, "direction", "h2d"), seconds_buckets(1e-5, 12));
  update();
}

void CacheMetrics::update() {
  const CacheStats s = cache_.stats();
  for (Mirrored& m : counters_) {
    const std::uint64_t now = s.*m.field;
    if (now > m.last) m.counter->Increment(double(now - m.last));
    m.last = now;
  }
  if (events_dropped_ != nullptr) {
    const std::uint64_t d = events_->dropped();
    if (d > events_dropped_last_) events_dropped_->Increment(double(d - events_dropped_last_));
    events_dropped_last_ = d;
    const std::uint64_t r = events_->restarts();
    if (r > events_restarts_last_) events_restarts_->Increment(double(r - events_restarts_last_));
    events_restarts_last_ = r;
  }
  const Occupancy o = cache_.occupancy();
  const CacheConfig& c = cache_.config();
  gpu_free_->Set(o.gpu_pages_free);
  host_free_->Set(o.host_pages_free);
  gpu_slots_free_->Set(o.gpu_slots_free);
  host_slots_free_->Set(o.host_slots_free);
  gpu_used_->Set(double(c.gpu_pages) - o.gpu_pages_free);
  host_used_->Set(double(c.host_pool_pages()) - o.host_pages_free);
  gpu_slots_used_->Set(double(c.gpu_snapshot_slots) - o.gpu_slots_free);
  nodes_->Set(double(o.nodes));
  in_flight_->Set(double(cache_.in_flight()));
  host_peak_->Set(double(s.host_bytes_peak));
}

void CacheMetrics::on_admit(std::chrono::nanoseconds elapsed) {
  admit_latency_->Observe(std::chrono::duration<double>(elapsed).count());
}

void CacheMetrics::on_copy(const CopyTiming& copy) {
  (copy.to_host ? copy_latency_d2h_ : copy_latency_h2d_)
      ->Observe(std::chrono::duration<double>(copy.elapsed).count());
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::create(PrefixCache& cache,
                                                             const std::string& bind,
                                                             const EventQueue* events) {
  std::unique_ptr<MetricsServer> m(new MetricsServer);
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->metrics_ = std::make_unique<CacheMetrics>(*m->registry_, cache, Labels{}, events);
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(bind);
  } catch (const std::exception& e) {
    return invalid_argument("MetricsServer: cannot listen on " + bind + ": " + e.what());
  }
  m->exposer_->RegisterCollectable(m->registry_);
  m->cache_ = &cache;
  cache.set_timing_hooks(m->metrics_.get());
  return m;
}

MetricsServer::~MetricsServer() {
  if (cache_) cache_->set_timing_hooks(nullptr);
}

int MetricsServer::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace radixtier
