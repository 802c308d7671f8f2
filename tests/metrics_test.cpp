// The metrics endpoint: scrape /metrics over HTTP and find stats() and occupancy().
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <sstream>

#include "cache_harness.hpp"
#include "radixtier/cache/event_queue.hpp"
#include "radixtier/metrics/cache_metrics.hpp"

namespace radixtier {
namespace {

using testing::Harness;

/// GET /metrics from 127.0.0.1:port, the body.
std::string scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return {};
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, std::size_t(n));
  ::close(fd);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : out.substr(body + 4);
}

/// "name{labels} value" lines, keyed by "name{labels}".
std::map<std::string, double> parse(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return m;
}

TEST(Metrics, RejectsAnAddressItCannotListenOn) {
  Harness h(testing::small_config());
  auto m = MetricsServer::create(*h.cache, "256.0.0.1:1");
  ASSERT_FALSE(m);
  EXPECT_NE(m.status().message().find("cannot listen"), std::string::npos);
}

TEST(Metrics, ScrapedValuesEqualStatsAndOccupancy) {
  CacheConfig c = testing::small_config();
  Harness h(c, HostTransferEngine::Mode::kThreaded);
  auto server = MetricsServer::create(*h.cache, "127.0.0.1:0");
  ASSERT_TRUE(server) << server.status().to_string();
  ASSERT_GT((*server)->port(), 0);
  for (int i = 0; i < 300; ++i) {
    const std::vector<Token> p = testing::seq({{Token(100 * (i % 9)), std::size_t(5 + i % 40)}});
    const std::size_t snaps[] = {8, 16, 24};
    (void)h.serve(p, snaps);
    if (i == 150) h.engine.fail_nth_submission(0);
    (*server)->update();
  }
  h.cache->drain();
  (*server)->update();
  const CacheStats s = h.cache->stats();
  const Occupancy o = h.cache->occupancy();
  ASSERT_GT(s.kv_pages_promoted, 0u);
  ASSERT_GT(s.bytes_d2h, 0u);
  auto m = parse(scrape((*server)->port()));
  ASSERT_FALSE(m.empty()) << "nothing scraped";
  EXPECT_EQ(m["radixtier_admissions_total"], double(s.admissions));
  EXPECT_EQ(m["radixtier_requested_tokens_total"], double(s.requested_tokens));
  EXPECT_EQ(m["radixtier_hit_tokens_total{tier=\"gpu\"}"], double(s.hit_tokens_gpu));
  EXPECT_EQ(m["radixtier_hit_tokens_total{tier=\"host\"}"], double(s.hit_tokens_host));
  EXPECT_EQ(m["radixtier_copy_bytes_total{direction=\"d2h\"}"], double(s.bytes_d2h));
  EXPECT_EQ(m["radixtier_copy_bytes_total{direction=\"h2d\"}"], double(s.bytes_h2d));
  EXPECT_EQ(m["radixtier_copies_total{direction=\"d2h\"}"], double(s.copies_d2h));
  EXPECT_EQ(m["radixtier_copies_total{direction=\"h2d\"}"], double(s.copies_h2d));
  EXPECT_EQ(m["radixtier_kv_pages_demoted_total"], double(s.kv_pages_demoted));
  EXPECT_EQ(m["radixtier_kv_pages_promoted_total"], double(s.kv_pages_promoted));
  EXPECT_EQ(m["radixtier_kv_pages_dropped_total{tier=\"gpu\"}"], double(s.kv_pages_dropped_gpu));
  EXPECT_EQ(m["radixtier_kv_pages_dropped_total{tier=\"host\"}"], double(s.kv_pages_dropped_host));
  EXPECT_EQ(m["radixtier_snapshots_inserted_total"], double(s.snapshots_inserted));
  EXPECT_EQ(m["radixtier_snapshots_dropped_total"], double(s.snapshots_dropped));
  EXPECT_EQ(m["radixtier_transfers_failed_total"], double(s.transfers_failed));
  EXPECT_GT(s.transfers_failed, 0u);
  EXPECT_EQ(m["radixtier_pool_free{pool=\"gpu_pages\"}"], double(o.gpu_pages_free));
  EXPECT_EQ(m["radixtier_pool_free{pool=\"host_pages\"}"], double(o.host_pages_free));
  EXPECT_EQ(m["radixtier_pool_free{pool=\"gpu_snapshot_slots\"}"], double(o.gpu_slots_free));
  EXPECT_EQ(m["radixtier_pool_used{pool=\"gpu_pages\"}"], double(c.gpu_pages - o.gpu_pages_free));
  EXPECT_EQ(m["radixtier_nodes"], double(o.nodes));
  // One admission latency per admit() (serve() re-admits after a failed promotion).
  EXPECT_EQ(m["radixtier_admission_latency_seconds_count"], double(s.admissions));
  EXPECT_GT(m["radixtier_copy_latency_seconds_count{direction=\"d2h\"}"], 0);
  EXPECT_GT(m["radixtier_copy_latency_seconds_count{direction=\"h2d\"}"], 0);
}

// Issue 34 item 1: a queue's drops and the stream restarts that followed them are scraped.
TEST(Metrics, EventDropsAndTheStreamRestartsTheyCausedAreCounted) {
  Harness h(testing::small_config());
  auto q = EventQueue::create(2);
  ASSERT_TRUE(q);
  h.cache->add_event_sink(q->get());
  auto m = MetricsServer::create(*h.cache, "127.0.0.1:0", q->get());
  ASSERT_TRUE(m) << m.status().to_string();
  CacheEvent e;
  for (int round = 0; round < 2; ++round) {
    while ((*q)->pop(e)) {  // the consumer takes what waits (the attach's restart first)
    }
    for (std::uint64_t i = 0; i < 5; ++i) (*q)->on_event(BlockRemoved{{i}, Medium::kGpu});
    h.cache->poll();  // restarts the lossy stream
  }
  ASSERT_EQ((*q)->restarts(), 2u);
  (*m)->update();
  auto v = parse(scrape((*m)->port()));
  EXPECT_EQ(v["radixtier_events_dropped_total"], double((*q)->dropped()));
  EXPECT_GT(v["radixtier_events_dropped_total"], 0.0);
  EXPECT_EQ(v["radixtier_events_restarts_total"], 2.0);
  h.cache->remove_event_sink(q->get());
}

}  // namespace
}  // namespace radixtier
