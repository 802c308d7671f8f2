#include "shared/local_cluster.hpp"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "radixtier/shared/key_slot.hpp"

extern char** environ;

namespace radixtier::shared {
namespace {

using namespace std::chrono_literals;

Status failed(std::string message) {
  return {ErrorCode::kFailedPrecondition, "local cluster: " + std::move(message)};
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};

bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // As redis-server binds (SO_REUSEADDR, anet.c): a port whose last connection is in
  // TIME_WAIT is free to it. Without this, a suite that made thousands of connections saw
  // every window taken.
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

/// The range of base ports for n nodes (each with its bus port 10000 above): below the
/// kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) when it leaves room,
/// else 20000-50000 as before.
std::pair<int, int> port_window(std::size_t n) {
  int ephemeral_low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int lo = 0, hi = 0;
    if (std::fscanf(f, "%d %d", &lo, &hi) == 2 && lo > 0) ephemeral_low = lo;
    std::fclose(f);
  }
  const int highest = ephemeral_low - 10000 - static_cast<int>(n);
  if (highest - 10000 >= 1000) return {10000, highest};
  return {20000, 50000 - static_cast<int>(n)};
}

std::string text_of(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER:
      return std::to_string(r->integer);
    case REDIS_REPLY_NIL:
      return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string out;
      for (std::size_t i = 0; i < r->elements; ++i) {
        if (i) out += "\n";
        out += text_of(r->element[i]);
      }
      return out;
    }
    default:
      return "(unknown)";
  }
}

// "field:value" of an INFO-like text.
std::string info_field(const std::string& text, std::string_view field) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 &&
        line[field.size()] == ':') {
      return line.substr(field.size() + 1);
    }
  }
  return {};
}

}  // namespace

Result<std::string> find_redis_program(std::string_view program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? end : end - start);
    if (!dir.empty()) {
      std::string full = dir + "/" + std::string(program);
      if (::access(full.c_str(), X_OK) == 0) return full;
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return Status{ErrorCode::kNotFound, std::string(program) +
                                          " not found on PATH (install redis-server "
                                          "redis-tools: scripts/setup.sh)"};
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::start(std::size_t masters,
                                                          std::size_t replicas_per_master,
                                                          LocalClusterOptions options) {
  if (masters == 0 || masters > 32 || replicas_per_master > 4) {
    return invalid_argument("local cluster: masters in [1, 32], replicas_per_master <= 4");
  }
  auto server = find_redis_program("redis-server");
  if (!server) return server.status();
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = std::move(options);
  cluster->masters_ = masters;
  cluster->replicas_ = replicas_per_master;
  char tmpl[] = "/tmp/radixtier-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return failed(std::string("mkdtemp: ") + std::strerror(errno));
  cluster->dir_ = tmpl;
  const std::size_t n = masters * (1 + replicas_per_master);
  std::random_device rd;
  std::mt19937 rng(rd() ^ static_cast<unsigned>(::getpid()));
  // Client ports come from the kernel's ephemeral range: below it (node and bus ports both)
  // a port a test's own connections took cannot collide with a node's.
  const auto [lowest, highest] = port_window(n);
  Status last =
      failed("no free window of " + std::to_string(n) + " node ports (and their bus ports) in [" +
             std::to_string(lowest) + ", " + std::to_string(highest) + "]");
  for (int attempt = 0; attempt < 32; ++attempt) {
    std::uniform_int_distribution<int> pick(lowest, highest);
    const int base = pick(rng);
    bool free = true;
    for (std::size_t i = 0; i < n && free; ++i) {
      const int p = base + static_cast<int>(i);
      free = port_free(p) && port_free(p + 10000);
    }
    if (!free) continue;
    last = cluster->spawn_all(*server, base);
    if (last) break;
    // A port taken meanwhile (or a node that died): kill what started, try other ports.
    for (auto& node : cluster->nodes_) {
      if (node.pid > 0 && !node.dead) {
        ::kill(node.pid, SIGKILL);
        ::waitpid(node.pid, nullptr, 0);
      }
    }
    cluster->nodes_.clear();
  }
  if (!last) return last;
  if (auto st = cluster->assemble(); !st) return st;
  if (auto st = cluster->wait_ready(cluster->options_.start_timeout); !st) return st;
  return cluster;
}

Status LocalCluster::spawn_all(const std::string& server, int base_port) {
  const std::size_t n = masters_ * (1 + replicas_);
  for (std::size_t i = 0; i < n; ++i) {
    Node node;
    node.port = base_port + static_cast<int>(i);
    const std::string port = std::to_string(node.port);
    std::vector<std::string> args = {server,
                                     "--port",
                                     port,
                                     "--cluster-enabled",
                                     "yes",
                                     "--cluster-config-file",
                                     "nodes-" + port + ".conf",
                                     "--cluster-node-timeout",
                                     std::to_string(options_.node_timeout.count()),
                                     "--cluster-require-full-coverage",
                                     "no",
                                     "--cluster-replica-validity-factor",
                                     "0",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     dir_,
                                     "--daemonize",
                                     "no",
                                     "--maxmemory-policy",
                                     "allkeys-lru"};
    if (!options_.password.empty()) {
      for (const char* opt : {"--requirepass", "--masterauth"}) {
        args.push_back(opt);
        args.push_back(options_.password);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = dir_ + "/node-" + port + ".log";
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    const int rc = posix_spawn(&node.pid, server.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return failed("posix_spawn " + server + ": " + std::strerror(rc));
    nodes_.push_back(node);
  }
  // Every node answers PING (or one exited: its port was taken).
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (std::size_t i = 0; i < n; ++i) {
    while (true) {
      int status = 0;
      if (::waitpid(nodes_[i].pid, &status, WNOHANG) == nodes_[i].pid) {
        nodes_[i].dead = true;
        return failed("redis-server on port " + std::to_string(nodes_[i].port) +
                      " exited at start (see " + dir_ + ")");
      }
      if (command(i, {"PING"})) break;
      if (std::chrono::steady_clock::now() > until) {
        return failed("redis-server on port " + std::to_string(nodes_[i].port) +
                      " did not answer PING");
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  return Status::ok();
}

Status LocalCluster::assemble() {
  const std::size_t n = nodes_.size();
  std::vector<std::string> ids(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto id = node_id(i);
    if (!id) return id.status();
    ids[i] = *id;
  }
  for (std::size_t m = 0; m < masters_; ++m) {
    const std::size_t first = m * kClusterSlots / masters_;
    const std::size_t last = (m + 1) * kClusterSlots / masters_ - 1;
    auto r = command(m, {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)});
    if (!r) return r.status();
    if (auto e = command(m, {"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(m + 1)}); !e) {
      return e.status();
    }
  }
  for (std::size_t i = 1; i < n; ++i) {
    auto r = command(i, {"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[0].port)});
    if (!r) return r.status();
  }
  const auto until = std::chrono::steady_clock::now() + options_.start_timeout;
  for (std::size_t i = 0; i < n; ++i) {
    while (true) {
      auto info = command(i, {"CLUSTER", "INFO"});
      if (info && info_field(*info, "cluster_known_nodes") == std::to_string(n)) break;
      if (std::chrono::steady_clock::now() > until) {
        return failed("node " + std::to_string(i) + " did not learn every node (MEET)");
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  for (std::size_t m = 0; m < masters_; ++m) {
    for (std::size_t j = 0; j < replicas_; ++j) {
      const std::size_t r = replica_index(m, j);
      while (true) {
        auto rep = command(r, {"CLUSTER", "REPLICATE", ids[m]});
        if (rep) break;
        if (std::chrono::steady_clock::now() > until) {
          return failed("CLUSTER REPLICATE on node " + std::to_string(r) + ": " +
                        rep.status().message());
        }
        std::this_thread::sleep_for(50ms);
      }
    }
  }
  return Status::ok();
}

Status LocalCluster::wait_ready(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    while (true) {
      bool ok = false;
      if (auto info = command(i, {"CLUSTER", "INFO"})) {
        ok = info_field(*info, "cluster_state") == "ok" &&
             info_field(*info, "cluster_slots_assigned") == std::to_string(kClusterSlots);
      }
      if (ok && i >= masters_) {
        auto repl = command(i, {"INFO", "replication"});
        ok = repl && info_field(*repl, "master_link_status") == "up";
      }
      if (ok) break;
      if (std::chrono::steady_clock::now() > until) {
        return failed("node " + std::to_string(i) + " (port " + std::to_string(nodes_[i].port) +
                      ") not ready (cluster_state:ok, 16384 slots, replica link up) after " +
                      std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  // Every master's view must agree on every master's first slot.
  for (std::size_t m = 0; m < masters_; ++m) {
    const auto slot = static_cast<std::uint16_t>(m * kClusterSlots / masters_);
    while (true) {
      auto owner = master_index_of_slot(slot);
      if (owner && *owner == m) break;
      if (std::chrono::steady_clock::now() > until) return failed("slot views do not agree");
      std::this_thread::sleep_for(50ms);
    }
  }
  return Status::ok();
}

LocalCluster::~LocalCluster() {
  for (auto& node : nodes_) {
    if (node.pid <= 0 || node.dead) continue;
    ::kill(node.pid, SIGCONT);
    ::kill(node.pid, SIGKILL);
    ::waitpid(node.pid, nullptr, 0);
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::vector<std::string> LocalCluster::seeds() const {
  std::vector<std::string> out;
  for (const auto& node : nodes_) out.push_back("127.0.0.1:" + std::to_string(node.port));
  return out;
}

Status LocalCluster::check_index(std::size_t i, bool must_run) const {
  if (i >= nodes_.size()) return invalid_argument("local cluster: no node " + std::to_string(i));
  if (must_run && (nodes_[i].dead || nodes_[i].stopped)) {
    return failed("node " + std::to_string(i) + " is not running");
  }
  return Status::ok();
}

Status LocalCluster::kill9(std::size_t i) {
  if (auto st = check_index(i, false); !st) return st;
  Node& node = nodes_[i];
  if (node.dead) return Status::ok();
  ::kill(node.pid, SIGKILL);
  ::waitpid(node.pid, nullptr, 0);
  node.dead = true;
  return Status::ok();
}

Status LocalCluster::stop(std::size_t i) {
  if (auto st = check_index(i, true); !st) return st;
  if (::kill(nodes_[i].pid, SIGSTOP) != 0) return failed(std::strerror(errno));
  nodes_[i].stopped = true;
  return Status::ok();
}

Status LocalCluster::cont(std::size_t i) {
  if (auto st = check_index(i, false); !st) return st;
  if (nodes_[i].dead) return failed("node " + std::to_string(i) + " is dead");
  if (::kill(nodes_[i].pid, SIGCONT) != 0) return failed(std::strerror(errno));
  nodes_[i].stopped = false;
  return Status::ok();
}

Status LocalCluster::client_pause(std::size_t i, std::chrono::milliseconds duration) {
  auto r = command(i, {"CLIENT", "PAUSE", std::to_string(duration.count())});
  return r ? Status::ok() : r.status();
}

Status LocalCluster::set_maxmemory(std::size_t i, std::uint64_t bytes) {
  auto r = command(i, {"CONFIG", "SET", "maxmemory", std::to_string(bytes)});
  return r ? Status::ok() : r.status();
}

Result<std::vector<std::string>> LocalCluster::command_list(std::size_t i,
                                                            const std::vector<std::string>& args) {
  if (auto st = check_index(i, true); !st) return st;
  const timeval tv{2, 0};
  std::unique_ptr<redisContext, ContextDeleter> ctx(
      redisConnectWithTimeout("127.0.0.1", nodes_[i].port, tv));
  if (!ctx || ctx->err) {
    return failed("connect to node " + std::to_string(i) + ": " +
                  (ctx ? ctx->errstr : "out of memory"));
  }
  redisSetTimeout(ctx.get(), tv);
  auto run = [&](const std::vector<std::string>& a) -> Result<std::vector<std::string>> {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& s : a) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    std::unique_ptr<redisReply, ReplyDeleter> reply(static_cast<redisReply*>(
        redisCommandArgv(ctx.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!reply) return failed("node " + std::to_string(i) + ": " + ctx->errstr);
    if (reply->type == REDIS_REPLY_ERROR) {
      return failed("node " + std::to_string(i) + " " + a[0] + ": " + text_of(reply.get()));
    }
    std::vector<std::string> out;
    if (reply->type == REDIS_REPLY_ARRAY) {
      for (std::size_t e = 0; e < reply->elements; ++e) out.push_back(text_of(reply->element[e]));
    } else {
      out.push_back(text_of(reply.get()));
    }
    return out;
  };
  if (!options_.password.empty()) {
    auto auth = run({"AUTH", options_.password});
    if (!auth) return failed("AUTH refused by node " + std::to_string(i));
  }
  return run(args);
}

Result<std::string> LocalCluster::command(std::size_t i, const std::vector<std::string>& args) {
  auto list = command_list(i, args);
  if (!list) return list.status();
  std::string out;
  for (std::size_t e = 0; e < list->size(); ++e) {
    if (e) out += "\n";
    out += (*list)[e];
  }
  return out;
}

Result<std::string> LocalCluster::node_id(std::size_t i) {
  return command(i, {"CLUSTER", "MYID"});
}

Result<std::size_t> LocalCluster::master_index_of_slot(std::uint16_t slot) {
  std::optional<std::size_t> agreed;
  bool asked = false;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].dead || nodes_[i].stopped) continue;
    auto nodes = command(i, {"CLUSTER", "NODES"});
    if (!nodes) continue;
    asked = true;
    // "<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges...>"
    std::optional<std::size_t> owner;
    std::istringstream in(*nodes);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::vector<std::string> f;
      std::string w;
      while (fields >> w) f.push_back(w);
      if (f.size() < 9 || f[2].find("master") == std::string::npos ||
          f[2].find("fail") != std::string::npos) {
        continue;
      }
      for (std::size_t k = 8; k < f.size(); ++k) {
        if (f[k].front() == '[') continue;  // a slot being migrated/imported
        const auto dash = f[k].find('-');
        const long first = std::stol(f[k].substr(0, dash));
        const long last = dash == std::string::npos ? first : std::stol(f[k].substr(dash + 1));
        if (slot >= first && slot <= last) {
          const auto colon = f[1].find(':');
          const int port = std::stoi(f[1].substr(colon + 1, f[1].find('@') - colon - 1));
          for (std::size_t j = 0; j < nodes_.size(); ++j) {
            if (nodes_[j].port == port) owner = j;
          }
        }
      }
    }
    if (!owner) return failed("node " + std::to_string(i) + " sees no master for the slot");
    if (agreed && *agreed != *owner) return failed("nodes disagree on the slot's master");
    agreed = owner;
  }
  if (!asked || !agreed) return failed("no live node answered CLUSTER NODES");
  return *agreed;
}

Status LocalCluster::wait_for_failover(std::size_t dead_master, std::chrono::milliseconds timeout) {
  if (auto st = check_index(dead_master, false); !st) return st;
  const auto slot = static_cast<std::uint16_t>(dead_master * kClusterSlots / masters_);
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto owner = master_index_of_slot(slot);
    bool ok = owner && *owner != dead_master && !nodes_[*owner].dead;
    for (std::size_t i = 0; ok && i < nodes_.size(); ++i) {
      if (nodes_[i].dead || nodes_[i].stopped) continue;
      auto info = command(i, {"CLUSTER", "INFO"});
      ok = info && info_field(*info, "cluster_state") == "ok";
    }
    if (ok) return Status::ok();
    if (std::chrono::steady_clock::now() > until) {
      return failed("no failover of node " + std::to_string(dead_master) + " within " +
                    std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(100ms);
  }
}

Status LocalCluster::move_keys(std::uint16_t slot, std::size_t from, std::size_t to,
                               std::size_t max_keys) {
  std::size_t moved = 0;
  while (moved < max_keys) {
    const std::size_t batch = std::min<std::size_t>(10, max_keys - moved);
    auto keys = command_list(
        from, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), std::to_string(batch)});
    if (!keys) return keys.status();
    if (keys->empty()) break;
    std::vector<std::string> args = {"MIGRATE", "127.0.0.1", std::to_string(nodes_[to].port),
                                     "",        "0",         "5000"};
    if (!options_.password.empty()) {
      args.push_back("AUTH");
      args.push_back(options_.password);
    }
    args.push_back("KEYS");
    args.insert(args.end(), keys->begin(), keys->end());
    if (auto r = command(from, args); !r) return r.status();
    moved += keys->size();
  }
  return Status::ok();
}

Status LocalCluster::migrate_slot_begin(std::uint16_t slot, std::size_t from, std::size_t to,
                                        std::size_t max_keys) {
  auto from_id = node_id(from);
  if (!from_id) return from_id.status();
  auto to_id = node_id(to);
  if (!to_id) return to_id.status();
  const std::string s = std::to_string(slot);
  if (auto r = command(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", *from_id}); !r) {
    return r.status();
  }
  if (auto r = command(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", *to_id}); !r) {
    return r.status();
  }
  return move_keys(slot, from, to, max_keys);
}

Status LocalCluster::migrate_slot_finish(std::uint16_t slot, std::size_t from, std::size_t to) {
  if (auto st = move_keys(slot, from, to, static_cast<std::size_t>(-1)); !st) return st;
  auto to_id = node_id(to);
  if (!to_id) return to_id.status();
  const std::string s = std::to_string(slot);
  if (auto r = command(to, {"CLUSTER", "SETSLOT", s, "NODE", *to_id}); !r) return r.status();
  if (auto r = command(from, {"CLUSTER", "SETSLOT", s, "NODE", *to_id}); !r) return r.status();
  for (std::size_t m = 0; m < nodes_.size(); ++m) {
    if (m == from || m == to || nodes_[m].dead || nodes_[m].stopped) continue;
    (void)command(m, {"CLUSTER", "SETSLOT", s, "NODE", *to_id});  // replicas may refuse
  }
  return Status::ok();
}

Status LocalCluster::migrate_slot(std::uint16_t slot, std::size_t from, std::size_t to) {
  if (auto st = migrate_slot_begin(slot, from, to, 0); !st) return st;
  return migrate_slot_finish(slot, from, to);
}

}  // namespace radixtier::shared
