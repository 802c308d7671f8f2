// An engine's view of the metrics component: only the installed headers of
// radixtier::metrics (and prometheus-cpp, which the component's package config found).
// Admits a prompt, updates, and finds the admission counter in the registry.
#include <cstdio>
#include <vector>

#include "radixtier/metrics/cache_metrics.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

int main() {
  using namespace radixtier;
  CacheConfig config;
  config.page_size = 4;
  config.gpu_pages = 16;
  config.host_pages = 0;
  config.gpu_snapshot_slots = 2;
  config.host_snapshot_slots = 0;
  config.page_bytes = 64;
  config.snapshot_bytes = 128;
  HostArenas memory(config);
  HostTransferEngine engine(memory, config.slice_pages);
  auto cache = PrefixCache::create(config, engine);
  if (!cache) return std::fprintf(stderr, "create: %s\n", cache.status().to_string().c_str()), 1;
  auto server = MetricsServer::create(**cache, "127.0.0.1:0");
  if (!server) return std::fprintf(stderr, "server: %s\n", server.status().to_string().c_str()), 1;
  const std::vector<Token> prompt = {1, 2, 3, 4, 5};
  for (int i = 0; i < 3; ++i) {
    auto a = (*cache)->admit(prompt);
    if (!a) return std::fprintf(stderr, "admit\n"), 1;
    (void)(*cache)->release(a->lock);
  }
  (*server)->update();
  double admissions = -1;
  for (const auto& family : (*server)->registry().Collect())
    if (family.name == "radixtier_admissions_total" && family.metric.size() == 1)
      admissions = family.metric[0].counter.value;
  if (admissions != 3) return std::fprintf(stderr, "admissions = %g, not 3\n", admissions), 1;
  if ((*server)->port() <= 0) return std::fprintf(stderr, "no port\n"), 1;
  std::printf("consumer metrics: 3 admissions counted, served on port %d\n", (*server)->port());
  return 0;
}
