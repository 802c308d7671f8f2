// An engine's view of the metrics component: only the installed headers of
// radixtier::metrics (and prometheus-cpp, which the component's package config found).
// Admits a prompt, updates, and finds the admission counter in the registry.
#include <cstdio>
#include <vector>

#include "radixtier/metrics/cache_metrics.hpp"
#include "tiny_cache.hpp"

int main() {
  using namespace radixtier;
  TinyCache tiny(16, 0);
  if (!tiny.cache) return 1;
  auto server = MetricsServer::create(*tiny.cache, "127.0.0.1:0");
  if (!server) return std::fprintf(stderr, "server: %s\n", server.status().to_string().c_str()), 1;
  const std::vector<Token> prompt = {1, 2, 3, 4, 5};
  for (int i = 0; i < 3; ++i) {
    auto a = tiny.cache->admit(prompt);
    if (!a) return std::fprintf(stderr, "admit\n"), 1;
    (void)tiny.cache->release(a->lock);
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
