// RedisCluster against fake nodes that answer what no healthy redis-server would (issue 32):
// hostile bulk lengths, replies nobody asked for, unbounded setup replies, unknown-endpoint
// addresses, MOVED storms, MOVED to a node outside the cluster. Nothing may throw, crash,
// serve a stray reply as a value, or grow without bound.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>
#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's allocator interface (sanitizer/allocator_interface.h, which GCC's
// packages do not install).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

#include "fake_resp_node.hpp"
#include "radixtier/shared/key_slot.hpp"
#include "radixtier/shared/redis_cluster.hpp"
#include "shared/endpoint.hpp"
#include "shared/slot_map.hpp"

namespace radixtier::shared {
namespace {

using namespace std::chrono_literals;
using testing::bulk;
using testing::FakeRespNode;

Deadline in(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

RedisClusterConfig config_of(const FakeRespNode& node) {
  RedisClusterConfig c;
  c.seeds = {node.address()};
  c.connect_timeout = 300ms;
  c.breaker_failures = 1000;  // the tests count protocol errors, not breaker trips
  c.slot_refresh_interval = 0ms;
  return c;
}

std::unique_ptr<RedisCluster> connect(const RedisClusterConfig& config) {
  auto c = RedisCluster::connect(config);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (!c) return nullptr;
  return std::move(c).value();
}

// The process's memory in use: its RSS, or under AddressSanitizer the heap bytes live (ASan
// keeps freed blocks in a quarantine of up to 256 MiB, which RSS would count as growth).
std::size_t rss_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#else
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
#endif
}

TEST(RedisClusterHostile, AHugeBulkLengthFailsTheKeyAndClosesItsConnection) {
  FakeRespNode node([](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET" && cmd[1] == "huge") return std::string("$4611686018427387904\r\nabc");
    if (cmd[0] == "GET" && cmd[1] == "long") return bulk(std::string(100, 'x'));
    if (cmd[0] == "GET") return bulk("v:" + cmd[1]);
    return std::nullopt;
  });
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  const std::vector<std::string> huge = {"huge"};
  std::vector<GetReply> got;
  EXPECT_NO_THROW(got = client->get(huge, in(500ms)));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].state, KeyState::kFailed);
  EXPECT_TRUE(got[0].value.empty());
  EXPECT_GE(client->stats().protocol_errors, 1u);
  const int before = node.accepted();
  // The next GET is answered on a fresh connection with its own bytes, never the stray ones.
  const std::vector<std::string> other = {"other"};
  got = client->get(other, in(500ms));
  ASSERT_EQ(got[0].state, KeyState::kFound);
  EXPECT_EQ(got[0].value, "v:other");
  EXPECT_GT(node.accepted(), before);

  // Longer than the call's bound: refused from its length, into the caller's buffer never.
  const std::vector<std::string> longer = {"long"};
  std::vector<GetReply> into(1);
  client->get_into(longer, in(500ms), into, GetBounds{99, 0});
  EXPECT_EQ(into[0].state, KeyState::kFailed);
  EXPECT_LT(into[0].value.capacity(), 100u);
  client->get_into(longer, in(500ms), into, GetBounds{100, 0});
  EXPECT_EQ(into[0].state, KeyState::kFound);
  EXPECT_EQ(into[0].value, std::string(100, 'x'));
  EXPECT_EQ(client->stats().internal_errors, 0u);
}

TEST(RedisClusterHostile, ABulkWhereExistsGetsAnIntegerCostsNoMemory) {
  // 256 MiB announced to the probe connection, half of it sent, then silence: refused from
  // the header, nothing kept (before: the probe connection sized a 256 MiB buffer for it and
  // kept its capacity after the deadline closed it).
  const std::size_t size = std::size_t{256} << 20;
  const std::string payload(size / 2, 'z');  // built before rss0: the node's, not the client's
  FakeRespNode* self = nullptr;
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] != "EXISTS") return std::nullopt;
    self->then_send(&payload);
    return "$" + std::to_string(size) + "\r\n";
  });
  self = &node;
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  const std::size_t rss0 = rss_bytes();
  const std::vector<std::string> keys = {"k"};
  const auto t0 = Clock::now();
  const auto states = client->exists(keys, in(500ms));
  EXPECT_LT(Clock::now() - t0, 510ms);
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0], KeyState::kFailed);
  EXPECT_GE(client->stats().protocol_errors, 1u);
  const std::size_t rss1 = rss_bytes();
  EXPECT_LT(rss1, rss0 + (std::size_t{64} << 20)) << "RSS grew " << (rss1 - rss0) << " bytes";
}

TEST(RedisClusterHostile, AHugeValueAnnouncedKeepsTheDeadline) {
  // 1 GiB announced, a few bytes sent: the destination is not zero-filled at once (before:
  // resize(1 GiB) ran past a 100 ms deadline before the first poll).
  FakeRespNode node([](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET") return "$" + std::to_string(std::size_t{1} << 30) + "\r\nabc";
    return std::nullopt;
  });
  auto config = config_of(node);
  config.max_value_bytes = std::size_t{2} << 30;
  auto client = connect(config);
  ASSERT_TRUE(client);
  const std::vector<std::string> keys = {"big"};
  std::vector<GetReply> into(1);
  const auto t0 = Clock::now();
  client->get_into(keys, t0 + 100ms, into, GetBounds{std::size_t{2} << 30, 0});
  const auto took = Clock::now() - t0;
  EXPECT_EQ(into[0].state, KeyState::kFailed);
  EXPECT_LT(took, 110ms) << std::chrono::duration<double, std::milli>(took).count() << " ms";
  EXPECT_LT(into[0].value.capacity(), std::size_t{64} << 20);
}

TEST(RedisClusterHostile, AReplyTooManyIsNeverMatchedToALaterCommand) {
  FakeRespNode* self = nullptr;
  bool late_sent = false;  // the node's thread only
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET" && cmd[1] == "twice") return bulk("stray") + bulk("stray");
    if (cmd[0] == "GET" && cmd[1] == "late") {
      late_sent = true;
      return bulk("v:late");
    }
    if (cmd[0] == "ECHO" && late_sent) {  // after this call's last reply went back
      late_sent = false;
      self->then_after(20ms, bulk("stray-late"));
    }
    if (cmd[0] == "GET") return bulk("v:" + cmd[1]);
    if (cmd[0] == "EXISTS" && cmd[1] == "twice") return std::string(":1\r\n:1\r\n");
    return std::nullopt;
  });
  self = &node;
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  // Two replies to one GET: the batch's ECHO comes back shifted, nothing of it is taken.
  const std::vector<std::string> twice = {"twice"};
  auto got = client->get(twice, in(500ms));
  EXPECT_NE(got[0].state, KeyState::kFound);
  for (const char* key : {"a", "b", "c"}) {
    const std::vector<std::string> one = {key};
    got = client->get(one, in(500ms));
    ASSERT_EQ(got[0].state, KeyState::kFound) << key;
    EXPECT_EQ(got[0].value, std::string("v:") + key);
  }
  // A reply arriving after its call returned: the next call never reads it as its own.
  const std::vector<std::string> late = {"late"};
  got = client->get(late, in(500ms));
  EXPECT_EQ(got[0].value, "v:late");
  std::this_thread::sleep_for(60ms);
  const std::vector<std::string> next = {"next"};
  got = client->get(next, in(500ms));
  EXPECT_NE(got[0].value, "stray-late");
  EXPECT_EQ(got[0].state, KeyState::kFound);
  EXPECT_EQ(got[0].value, "v:next");
  // Probes too: an extra ":1" never makes a later missing key found.
  const std::vector<std::string> probe_twice = {"twice"};
  (void)client->exists(probe_twice, in(500ms));
  const std::vector<std::string> absent = {"absent"};
  EXPECT_EQ(client->exists(absent, in(500ms))[0], KeyState::kMissing);
  EXPECT_GE(client->stats().protocol_errors, 2u);
}

TEST(RedisClusterHostile, GarbledRepliesFailOnlyTheirCall) {
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET" && cmd[1] == "crlf") return std::string("\r\n\r\n");
    if (cmd[0] == "GET" && cmd[1] == "array") return std::string("*2\r\n$1\r\na\r\n$1\r\nb\r\n");
    if (cmd[0] == "GET" && cmd[1] == "nocrlf") return std::string("$3\r\nabcXY");
    if (cmd[0] == "GET") return bulk("v:" + cmd[1]);
    return std::nullopt;
  });
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  for (const char* key : {"crlf", "array", "nocrlf"}) {
    const std::vector<std::string> one = {key};
    const auto got = client->get(one, in(300ms));
    EXPECT_EQ(got[0].state, KeyState::kFailed) << key;
    const std::vector<std::string> fine = {"fine"};
    const auto again = client->get(fine, in(300ms));
    ASSERT_EQ(again[0].state, KeyState::kFound) << "after " << key;
    EXPECT_EQ(again[0].value, "v:fine");
  }
  EXPECT_EQ(client->stats().internal_errors, 0u);
}

TEST(RedisClusterHostile, AnUnboundedClusterSlotsReplyIsRefusedQuickly) {
  // A billion elements announced (hiredis allocated them: 6 s, 2.3 GB), a giant bulk, arrays
  // nested past any CLUSTER SLOTS, a reply that never ends.
  const std::string replies[] = {
      "*1000000000\r\n*3\r\n:0\r\n:1\r\n",
      "*1\r\n$1000000000\r\nabc",
      "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
      "*1\r\n*3\r\n:0\r\n",
  };
  for (const std::string& reply : replies) {
    FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
      if (cmd[0] == "CLUSTER") return reply;
      return std::nullopt;
    });
    auto config = config_of(node);
    const std::size_t rss0 = rss_bytes();
    const auto t0 = Clock::now();
    auto client = RedisCluster::connect(config);
    const auto took = Clock::now() - t0;
    EXPECT_FALSE(client.is_ok()) << reply.substr(0, 20);
    // connect() waits at most connect_timeout x 2 per seed.
    EXPECT_LT(took, config.connect_timeout * 2 + 10ms) << reply.substr(0, 20);
    EXPECT_LT(rss_bytes(), rss0 + (std::size_t{64} << 20)) << reply.substr(0, 20);
  }
}

TEST(RedisClusterHostile, UnknownEndpointSlotsAndMovedUseTheAddressTheReplyCameFrom) {
  // cluster-preferred-endpoint-type unknown-endpoint: CLUSTER SLOTS names no host (nil), a
  // MOVED names ":port".
  FakeRespNode target([](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET") return bulk("from-target:" + cmd[1]);
    return std::nullopt;
  });
  FakeRespNode* self = nullptr;
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "CLUSTER") return self->slots_reply(std::nullopt);
    if (cmd[0] == "GET") {
      return "-MOVED " + std::to_string(key_slot(cmd[1])) + " :" + std::to_string(target.port()) +
             "\r\n";
    }
    return std::nullopt;
  });
  self = &node;
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  const std::vector<std::string> keys = {"k1", "k2"};
  const auto got = client->get(keys, in(1000ms));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i].state, KeyState::kFound) << keys[i];
    EXPECT_EQ(got[i].value, "from-target:" + keys[i]);
  }
  EXPECT_EQ(client->stats().moved, 2u);
}

TEST(RedisClusterHostile, AnUnusableMovedNeitherPoisonsTheSlotNorStopsRefreshes) {
  std::atomic<bool> hostile{true};
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET" && hostile) {
      return "-MOVED " + std::to_string(key_slot(cmd[1])) + " garbage\r\n";
    }
    if (cmd[0] == "GET") return bulk("v:" + cmd[1]);
    return std::nullopt;
  });
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  const auto refreshes = client->stats().slot_map_refreshes;
  const std::vector<std::string> keys = {"k"};
  EXPECT_EQ(client->get(keys, in(500ms))[0].state, KeyState::kFailed);
  EXPECT_GT(client->stats().slot_map_refreshes, refreshes);
  hostile = false;
  // The slot still goes to the node (before: its owner became "garbage" for good).
  const auto got = client->get(keys, in(500ms));
  ASSERT_EQ(got[0].state, KeyState::kFound);
  EXPECT_EQ(got[0].value, "v:k");
}

TEST(RedisClusterHostile, AMovedStormKeepsTheShardTableBounded) {
  // Every GET is MOVED to a fresh address (nothing listens there): the table and refresh
  // stay bounded (before: one shard per address, every one tried by each refresh).
  int next_port = 20000;
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET") {
      return "-MOVED " + std::to_string(key_slot(cmd[1])) +
             " 127.0.0.1:" + std::to_string(next_port++) + "\r\n";
    }
    return std::nullopt;
  });
  auto config = config_of(node);
  config.max_redirects = 0;
  auto client = connect(config);
  ASSERT_TRUE(client);
  for (int i = 0; i < 300; ++i) {
    const std::vector<std::string> keys = {"storm:" + std::to_string(i)};
    const auto t0 = Clock::now();
    EXPECT_EQ(client->get(keys, in(50ms))[0].state, KeyState::kFailed);
    EXPECT_LT(Clock::now() - t0, 60ms);
  }
  // The node, this call's MOVED target, at most 32 former masters.
  EXPECT_LE(client->shards().size(), 34u);
}

TEST(RedisClusterHostile, SlotOwnersPastInt16StayRight) {
  // 40000 MOVEDs to distinct addresses (one map update, as a storm would make over time):
  // every slot names the last address it was moved to.
  detail::SetupReply reply;
  reply.type = detail::SetupReply::Type::kArray;
  auto parsed = detail::SlotMap::parse(reply, "127.0.0.1");
  ASSERT_TRUE(parsed.is_ok());
  std::vector<std::pair<std::uint16_t, std::string>> moved;
  for (int i = 0; i < 40000; ++i) {
    moved.emplace_back(static_cast<std::uint16_t>(i % kClusterSlots),
                       "10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ":1");
  }
  detail::SlotMap map = *parsed;
  for (std::size_t at = 0; at < moved.size(); at += 1000) {
    map = map.with_owners(
        std::span(moved).subspan(at, std::min<std::size_t>(1000, moved.size() - at)));
  }
  for (int i = 40000 - kClusterSlots; i < 40000; ++i) {
    const auto* m = map.master_of(static_cast<std::uint16_t>(i % kClusterSlots));
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(*m, moved[static_cast<std::size_t>(i)].second) << i;
  }
  EXPECT_LE(map.masters().size(), static_cast<std::size_t>(kClusterSlots));
}

TEST(RedisClusterHostile, AuthGoesOnlyToTheClustersNetworks) {
  // A MOVED to 127.0.1.2 (outside the seed's 127.0.0.0/24) gets no credentials.
  FakeRespNode outside({}, "127.0.1.2");
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "GET") {
      return "-MOVED " + std::to_string(key_slot(cmd[1])) + " " + outside.address() + "\r\n";
    }
    return std::nullopt;
  });
  auto config = config_of(node);
  config.password = "s3cret";
  auto client = connect(config);
  ASSERT_TRUE(client);
  EXPECT_GE(node.count("AUTH"), 1u);
  const std::vector<std::string> keys = {"k"};
  EXPECT_EQ(client->get(keys, in(500ms))[0].state, KeyState::kFailed);
  EXPECT_EQ(outside.count("AUTH"), 0u);
  EXPECT_EQ(outside.count("GET"), 0u);

  // An allow-list that names it lets AUTH go there.
  config.auth_networks = {"127.0.0.0/24", "127.0.1.2"};
  client = connect(config);
  ASSERT_TRUE(client);
  (void)client->get(keys, in(500ms));
  EXPECT_GE(outside.count("AUTH"), 1u);
}

TEST(RedisClusterHostile, ConfigRefusesABadAuthNetwork) {
  RedisClusterConfig c;
  c.seeds = {"127.0.0.1:7000"};
  EXPECT_TRUE(c.validate().is_ok());
  for (const char* bad : {"10.0.0.0/33", "nowhere", "10.0.0.0/", "::1/129"}) {
    c.auth_networks = {bad};
    EXPECT_EQ(c.validate().code(), ErrorCode::kInvalidArgument) << bad;
  }
  c.auth_networks = {"10.0.0.0/8", "fd00::/64", "127.0.0.1"};
  EXPECT_TRUE(c.validate().is_ok());
  c.max_value_bytes = 0;
  EXPECT_EQ(c.validate().code(), ErrorCode::kInvalidArgument);
}

/// A listening socket that never accepts, its one-slot queue already full: a connect to it
/// is never answered (its SYNs are dropped), as a black-holed host's.
struct BlackHole {
  BlackHole() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 0) != 0) {
      throw std::runtime_error("black hole: cannot listen");
    }
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    for (int i = 0; i < 4; ++i) {  // fill the accept queue
      const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      (void)::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      fillers.push_back(c);
    }
    std::this_thread::sleep_for(50ms);
  }
  ~BlackHole() {
    for (int c : fillers) ::close(c);
    ::close(fd);
  }
  int fd = -1;
  int port = 0;
  std::vector<int> fillers;
};

/// Keys whose slots are below (first) and at or above (second) `split`.
std::pair<std::vector<std::string>, std::vector<std::string>> keys_split(int split, int n) {
  std::vector<std::string> low, high;
  for (int i = 0; low.size() < std::size_t(n) || high.size() < std::size_t(n); ++i) {
    std::string k = "split:" + std::to_string(i);
    auto& into = key_slot(k) < split ? low : high;
    if (into.size() < std::size_t(n)) into.push_back(std::move(k));
  }
  return {low, high};
}

/// CLUSTER SLOTS of two masters: [0, 8191] at `a`, [8192, 16383] at `b` (host, port).
std::string two_masters(const std::string& host_a, int port_a, const std::string& host_b,
                        int port_b) {
  auto node = [](const std::string& h, int p) {
    return "*2\r\n" + bulk(h) + ":" + std::to_string(p) + "\r\n";
  };
  return "*2\r\n*3\r\n:0\r\n:8191\r\n" + node(host_a, port_a) + "*3\r\n:8192\r\n:16383\r\n" +
         node(host_b, port_b);
}

TEST(RedisClusterHostile, ASlowLorisSlotMapDuringACallKeepsItsDeadline) {
  // After connect(), CLUSTER SLOTS trickles (a byte every 5 ms, never done) and every GET is
  // MOVED, so each call asks for a refresh: the call still returns by its deadline + 10 ms.
  std::atomic<bool> connected{false};
  FakeRespNode* self = nullptr;
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "CLUSTER" && connected) {
      for (int i = 0; i < 20; ++i) self->then_after(5ms, "*");
      return std::string("*1\r\n");
    }
    if (cmd[0] == "GET") {
      return "-MOVED " + std::to_string(key_slot(cmd[1])) + " " + self->address() + "\r\n";
    }
    return std::nullopt;
  });
  self = &node;
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  connected = true;
  for (int call = 0; call < 5; ++call) {
    const std::vector<std::string> keys = {"loris:" + std::to_string(call)};
    const auto t0 = Clock::now();
    EXPECT_EQ(client->get(keys, t0 + 50ms)[0].state, KeyState::kFailed);
    const auto took = Clock::now() - t0;
    EXPECT_LT(took, 60ms) << std::chrono::duration<double, std::milli>(took).count() << " ms";
  }
}

TEST(RedisClusterHostile, TenThousandCallsWithHostileRepliesKeepMemoryBounded) {
  // Every other call meets a hostile reply (a huge length, a reply too many, garbage); RSS
  // after 10^4 calls stays within 64 MiB of where it started.
  int n = 0;
  FakeRespNode node([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] != "GET") return std::nullopt;
    switch (n++ % 6) {
      case 1:
        return std::string("$4611686018427387904\r\n");
      case 3:
        return bulk("x") + bulk("y");
      case 5:
        return std::string("?garbage\r\n");
      default:
        return bulk(std::string(4096, 'v'));
    }
  });
  auto client = connect(config_of(node));
  ASSERT_TRUE(client);
  const std::vector<std::string> keys = {"mem"};
  std::vector<GetReply> into;
  for (int i = 0; i < 200; ++i) client->get_into(keys, in(500ms), into);  // warm
  const std::size_t rss0 = rss_bytes();
  std::size_t found = 0;
  for (int i = 0; i < 10000; ++i) {
    client->get_into(keys, in(500ms), into, GetBounds{1u << 20, 0});
    if (into[0].state == KeyState::kFound) {
      ++found;
      ASSERT_EQ(into[0].value, std::string(4096, 'v'));
    }
  }
  const std::size_t rss1 = rss_bytes();
  EXPECT_GE(found, 10000u / 2 - 10);
  EXPECT_LT(rss1, rss0 + (std::size_t{64} << 20)) << "grew " << (rss1 - rss0) << " bytes";
  EXPECT_EQ(client->stats().internal_errors, 0u);
}

TEST(RedisClusterHostile, ABlackHoledShardFailsOnlyItsOwnKeysByTheDeadline) {
  // The black hole sorts first (127.0.0.1 < 127.0.0.2): before, its connect ran first and
  // spent the whole deadline, so the healthy shard's keys failed too.
  BlackHole hole;
  FakeRespNode* self = nullptr;
  FakeRespNode healthy(
      [&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
        if (cmd[0] == "CLUSTER") {
          return two_masters("127.0.0.2", self->port(), "127.0.0.1", hole.port);
        }
        if (cmd[0] == "GET") return bulk("v:" + cmd[1]);
        return std::nullopt;
      },
      "127.0.0.2");
  self = &healthy;
  auto config = config_of(healthy);
  config.connect_timeout = 1000ms;  // longer than the calls' deadlines
  auto client = connect(config);
  ASSERT_TRUE(client);
  const auto [low, high] = keys_split(8192, 8);
  std::vector<std::string> keys = low;
  keys.insert(keys.end(), high.begin(), high.end());
  for (int call = 0; call < 10; ++call) {
    const auto t0 = Clock::now();
    const auto got = client->get(keys, t0 + 50ms);
    const auto took = Clock::now() - t0;
    EXPECT_LT(took, 60ms) << call;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i < low.size()) {
        ASSERT_EQ(got[i].state, KeyState::kFound) << call << " " << keys[i];
        EXPECT_EQ(got[i].value, "v:" + keys[i]);
      } else {
        EXPECT_EQ(got[i].state, KeyState::kFailed) << call << " " << keys[i];
      }
    }
  }
}

TEST(RedisClusterHostile, WaitingForABusyConnectionSpendsNoOtherShardsTime) {
  // Shard a (127.0.0.1, first in address order) is held by a slow call; a second call's
  // keys on shard b (127.0.0.2) are answered at once.
  FakeRespNode b(
      [](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
        if (cmd[0] == "GET") return bulk("b:" + cmd[1]);
        return std::nullopt;
      },
      "127.0.0.2");
  FakeRespNode* self = nullptr;
  FakeRespNode a([&](const FakeRespNode::Command& cmd) -> std::optional<std::string> {
    if (cmd[0] == "CLUSTER") return two_masters("127.0.0.1", self->port(), "127.0.0.2", b.port());
    if (cmd[0] == "GET" && cmd[1].rfind("slow", 0) == 0) std::this_thread::sleep_for(300ms);
    if (cmd[0] == "GET") return bulk("a:" + cmd[1]);
    return std::nullopt;
  });
  self = &a;
  auto client = connect(config_of(a));
  ASSERT_TRUE(client);
  const auto [low, high] = keys_split(8192, 4);
  std::string slow;
  for (int i = 0; slow.empty(); ++i) {
    const std::string k = "slow" + std::to_string(i);
    if (key_slot(k) < 8192) slow = k;
  }
  std::thread holder([&] {
    const std::vector<std::string> one = {slow};
    (void)client->get(one, in(400ms));
  });
  std::this_thread::sleep_for(50ms);  // the holder has a's fetch connection
  std::vector<std::string> keys = low;
  keys.insert(keys.end(), high.begin(), high.end());
  const auto t0 = Clock::now();
  const auto got = client->get(keys, t0 + 50ms);
  EXPECT_LT(Clock::now() - t0, 60ms);
  for (std::size_t i = low.size(); i < keys.size(); ++i) {
    EXPECT_EQ(got[i].state, KeyState::kFound) << keys[i];
    EXPECT_EQ(got[i].value, "b:" + keys[i]);
  }
  holder.join();
}

TEST(RedisClusterHostile, NamesAreResolvedOffTheRequestPath) {
  // A name is never looked up on the calling thread: the first ask fails at once and starts
  // a background lookup; a later ask finds it.
  // "LocalHost": the resolver matches names without regard to case, the cache does not, so
  // no other test of this process has put this spelling in the cache.
  const detail::Endpoint name{"LocalHost", 6379};
  const auto t0 = Clock::now();
  auto first = detail::resolve_cached(name);
  EXPECT_LT(Clock::now() - t0, 5ms);
  ASSERT_FALSE(first.is_ok());
  EXPECT_NE(first.status().message().find("resolving"), std::string::npos);
  Result<std::vector<detail::SocketAddress>> later = first.status();
  for (int i = 0; i < 200 && !later; ++i) {
    std::this_thread::sleep_for(5ms);
    later = detail::resolve_cached(name);
  }
  ASSERT_TRUE(later.is_ok()) << later.status().to_string();
  EXPECT_FALSE(later->empty());
  // A numeric host needs no lookup at all.
  EXPECT_TRUE(detail::resolve_cached(detail::Endpoint{"127.0.0.1", 1}).is_ok());
}

}  // namespace
}  // namespace radixtier::shared
