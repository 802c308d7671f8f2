#include "radixtier/shared/redis_cluster.hpp"

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "radixtier/shared/key_slot.hpp"
#include "shared/circuit_breaker.hpp"
#include "shared/endpoint.hpp"
#include "shared/redis_connection.hpp"
#include "shared/slot_map.hpp"

namespace radixtier::shared {

const char* to_string(BreakerStateView state) {
  switch (state) {
    case BreakerStateView::kClosed:
      return "closed";
    case BreakerStateView::kOpen:
      return "open";
    case BreakerStateView::kHalfOpen:
      return "half-open";
  }
  return "unknown";
}

namespace {

using detail::BreakerTransition;
using detail::CircuitBreaker;
using detail::Credentials;
using detail::DataReply;
using detail::Endpoint;
using detail::RedisConnection;
using detail::ReplyPtr;
using detail::SlotMap;

enum class Role : std::uint8_t { kProbe = 0, kFetch = 1, kPublish = 2 };

// In a group's expected replies: the pipelined AUTH of a fresh connection (ASKING is -1).
constexpr std::ptrdiff_t kAuthReply = -2;

struct Connection {
  std::timed_mutex mu;
  RedisConnection conn;
  bool ever_opened = false;  // guarded by mu
};

struct Shard {
  Shard(Endpoint ep, const RedisClusterConfig& cfg)
      : endpoint(std::move(ep)), breaker(cfg.breaker_failures, cfg.breaker_cooldown) {}
  const Endpoint endpoint;
  std::array<Connection, 3> conns;
  CircuitBreaker breaker;
};

struct Counters {
  std::atomic<std::uint64_t> calls{0}, found{0}, missing{0}, failed{0}, moved{0}, ask{0},
      timeouts{0}, reconnects{0}, connect_errors{0}, opens{0}, closes{0}, bytes_read{0},
      bytes_written{0}, refreshes{0};
};

// One key of a call on its way: where it goes when a redirect named a node.
struct Task {
  std::size_t index = 0;
  std::string redirect;  // "" = the slot map's master
  bool asking = false;
  std::uint32_t hops = 0;
};

// What one operation sends and how it reads a reply.
struct Op {
  Role role;
  std::string_view command;
  std::function<std::string_view(std::size_t)> key;
  std::function<std::string_view(std::size_t)> value;  // SET only
  std::function<std::size_t(std::size_t)> cost;        // bytes toward max_inflight_bytes
  std::function<KeyState(std::size_t, DataReply&)> accept;
  /// GET only: where item i's bulk value is received (the caller's string, capacity reused).
  std::function<std::string*(std::size_t)> bulk_target;
};

bool starts_with(const DataReply& r, std::string_view prefix) {
  return std::string_view(r.text).substr(0, prefix.size()) == prefix;
}

// "MOVED 3999 127.0.0.1:6381" -> 3999 (-1 when malformed)
int redirect_slot(const DataReply& r) {
  std::string_view text(r.text);
  const auto first = text.find(' ');
  if (first == std::string_view::npos) return -1;
  int slot = -1;
  auto [ptr, ec] = std::from_chars(text.data() + first + 1, text.data() + text.size(), slot);
  if (ec != std::errc{} || slot < 0 || slot >= kClusterSlots) return -1;
  return slot;
}

// "MOVED 3999 127.0.0.1:6381" -> "127.0.0.1:6381"
std::string redirect_target(const DataReply& r) {
  std::string_view text(r.text);
  const auto last_space = text.rfind(' ');
  if (last_space == std::string_view::npos) return {};
  return std::string(text.substr(last_space + 1));
}

}  // namespace

struct RedisCluster::Impl {
  explicit Impl(RedisClusterConfig c) : cfg(std::move(c)), creds{cfg.user, cfg.password} {}

  RedisClusterConfig cfg;
  Credentials creds;
  Counters counters;

  mutable std::mutex shards_mu;
  std::map<std::string, std::unique_ptr<Shard>> shards;  // never erased: stable references

  mutable std::mutex map_mu;
  std::shared_ptr<const SlotMap> map;

  std::mutex refresh_mu;
  Clock::time_point last_refresh{};

  Shard* shard(const std::string& address) {
    std::lock_guard lock(shards_mu);
    auto it = shards.find(address);
    if (it != shards.end()) return it->second.get();
    auto ep = detail::parse_endpoint(address);
    if (!ep) return nullptr;
    auto [pos, _] = shards.emplace(address, std::make_unique<Shard>(std::move(*ep), cfg));
    return pos->second.get();
  }

  std::shared_ptr<const SlotMap> slot_map() const {
    std::lock_guard lock(map_mu);
    return map;
  }

  void count_breaker(BreakerTransition t) {
    if (t == BreakerTransition::kOpened) ++counters.opens;
    if (t == BreakerTransition::kClosed) ++counters.closes;
  }

  // Asks CLUSTER SLOTS of the known masters whose breakers are closed, then of the others,
  // then of the seeds, each by min(deadline, now + connect_timeout).
  Status refresh(Deadline deadline) {
    std::vector<std::string> candidates;
    std::vector<std::string> later;
    if (auto current = slot_map()) {
      for (const auto& m : current->masters()) {
        Shard* s = shard(m);
        (s && s->breaker.state() == detail::BreakerState::kClosed ? candidates : later)
            .push_back(m);
      }
    }
    candidates.insert(candidates.end(), later.begin(), later.end());
    for (const auto& seed : cfg.seeds) {
      if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
        candidates.push_back(seed);
      }
    }
    Status last{ErrorCode::kTransferFailed, "redis: no node to ask CLUSTER SLOTS"};
    for (const auto& address : candidates) {
      const auto now = Clock::now();
      if (now >= deadline) {
        return {ErrorCode::kTransferFailed, "redis: deadline passed refreshing the slot map"};
      }
      auto ep = detail::parse_endpoint(address);
      if (!ep) continue;
      const Deadline until = std::min(deadline, now + cfg.connect_timeout);
      RedisConnection conn;
      if (auto st = conn.connect(*ep, creds, until); !st) {
        last = st;
        continue;
      }
      auto reply = conn.command({"CLUSTER", "SLOTS"}, until);
      if (!reply) {
        last = reply.status();
        continue;
      }
      auto parsed = SlotMap::parse(reply->get(), ep->host);
      if (!parsed) {
        last = parsed.status();
        continue;
      }
      if (parsed->assigned() == 0) {
        last = Status{ErrorCode::kTransferFailed, "redis: " + address + " serves no slot"};
        continue;
      }
      auto fresh = std::make_shared<const SlotMap>(std::move(*parsed));
      for (const auto& m : fresh->masters()) shard(m);
      {
        std::lock_guard lock(map_mu);
        map = std::move(fresh);
      }
      ++counters.refreshes;
      return Status::ok();
    }
    return last;
  }

  // MOVED replies are the newest word on their slots (a node's CLUSTER SLOTS may lag):
  // applied on top of the map, after any refresh.
  void apply_moved(const std::vector<std::pair<std::uint16_t, std::string>>& moved) {
    if (moved.empty()) return;
    for (const auto& [slot, address] : moved) shard(address);
    std::lock_guard lock(map_mu);
    if (!map) return;
    SlotMap patched = *map;
    for (const auto& [slot, address] : moved) patched = patched.with_owner(slot, address);
    map = std::make_shared<const SlotMap>(std::move(patched));
  }

  void maybe_refresh(Deadline deadline) {
    std::unique_lock lock(refresh_mu, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another call is refreshing
    const auto now = Clock::now();
    if (now - last_refresh < cfg.slot_refresh_interval || now >= deadline) return;
    last_refresh = now;
    (void)refresh(deadline);
  }

  // Runs `op` over items [0, n): states[i] ends kFound / kMissing / kFailed.
  void execute(const Op& op, std::size_t n, Deadline deadline, std::vector<KeyState>& states);
};

void RedisCluster::Impl::execute(const Op& op, std::size_t n, Deadline deadline,
                                 std::vector<KeyState>& states) {
  ++counters.calls;
  states.assign(n, KeyState::kFailed);
  std::deque<Task> queue;
  for (std::size_t i = 0; i < n; ++i) queue.push_back(Task{i, {}, false, 0});
  const auto role = static_cast<std::size_t>(op.role);

  // One shard's part of a pass: its tasks go out through a window of max_inflight_bytes
  // (a command is sent when the bytes of those sent and not yet answered leave room).
  struct Group {
    Shard* shard = nullptr;
    Connection* c = nullptr;
    std::vector<Task> tasks;
    std::size_t sent = 0;               // tasks[0, sent) are written or queued
    std::size_t inflight = 0;           // their bytes not answered yet
    std::deque<std::ptrdiff_t> expect;  // per reply owed: task position, -1 for ASKING
    std::unique_lock<std::timed_mutex> lock;
    bool active = false;
    bool failed = false;  // connection error or timeout (a breaker failure)
  };

  // A pass routes every queued task; redirects (MOVED / ASK) queue them for the next pass.
  while (!queue.empty()) {
    bool want_refresh = false;
    std::vector<std::pair<std::uint16_t, std::string>> moved_slots;
    const auto start = Clock::now();
    if (start >= deadline) break;
    const auto current = slot_map();
    std::map<std::string, Group> groups;  // address order: the lock order
    for (auto& task : queue) {
      const std::string* target = &task.redirect;
      if (target->empty()) {
        target = current ? current->master_of(key_slot(op.key(task.index))) : nullptr;
      }
      if (target == nullptr || target->empty()) continue;  // unassigned slot: kFailed
      groups[*target].tasks.push_back(std::move(task));
    }
    queue.clear();

    auto fill = [&](Group& g) {
      while (g.sent < g.tasks.size()) {
        const Task& task = g.tasks[g.sent];
        const std::size_t cost = op.cost(task.index);
        if (g.inflight != 0 && g.inflight + cost > cfg.max_inflight_bytes) break;
        if (task.asking) {
          g.c->conn.append({"ASKING"});
          g.expect.push_back(-1);
        }
        if (op.role == Role::kPublish) {
          g.c->conn.append({op.command, op.key(task.index), op.value(task.index)});
        } else {
          g.c->conn.append({op.command, op.key(task.index)});
        }
        g.expect.push_back(static_cast<std::ptrdiff_t>(g.sent));
        g.inflight += cost;
        ++g.sent;
      }
    };

    for (auto& [address, g] : groups) {
      g.shard = shard(address);
      if (g.shard == nullptr || !g.shard->breaker.allow(start)) {
        if (g.shard != nullptr) want_refresh = true;  // an open breaker: maybe a failover
        g.tasks.clear();
        continue;
      }
      g.c = &g.shard->conns[role];
      g.lock = std::unique_lock(g.c->mu, std::defer_lock);
      if (!g.lock.try_lock_until(deadline)) {
        g.tasks.clear();
        continue;
      }
      if (!g.c->conn.is_open()) {
        const Deadline until = std::min(deadline, Clock::now() + cfg.connect_timeout);
        // AUTH goes first in the pipeline: a shard slow to answer it (stopped, paused)
        // holds back only its own keys, not the other shards' writes.
        if (auto st = g.c->conn.connect(g.shard->endpoint, creds, until,
                                        RedisConnection::AuthMode::kPipelined);
            !st) {
          ++counters.connect_errors;
          count_breaker(g.shard->breaker.on_failure(Clock::now()));
          want_refresh = true;
          g.tasks.clear();
          continue;
        }
        if (g.c->ever_opened) ++counters.reconnects;
        g.c->ever_opened = true;
        if (!creds.password.empty()) g.expect.push_back(kAuthReply);
      }
      fill(g);
      g.active = !g.expect.empty();
    }

    auto fail_group = [&](Group& g) {
      g.c->conn.close();
      g.active = false;
      g.failed = true;
    };
    // false: the connection is unusable (AUTH refused).
    auto handle = [&](Group& g, DataReply& reply) {
      const std::ptrdiff_t pos = g.expect.front();
      g.expect.pop_front();
      if (pos == kAuthReply) return reply.type == DataReply::Type::kStatus;
      if (pos < 0) return true;  // ASKING's +OK (an error shows on the command after it)
      Task& task = g.tasks[static_cast<std::size_t>(pos)];
      g.inflight -= std::min(g.inflight, op.cost(task.index));
      if (reply.type == DataReply::Type::kError) {
        const bool moved = starts_with(reply, "MOVED ");
        const bool ask = starts_with(reply, "ASK ");
        if (moved || ask) {
          (moved ? counters.moved : counters.ask)++;
          if (moved) want_refresh = true;
          std::string target = redirect_target(reply);
          const int slot = redirect_slot(reply);
          if (moved && slot >= 0 && !target.empty()) {
            moved_slots.emplace_back(static_cast<std::uint16_t>(slot), target);
          }
          if (!target.empty() && task.hops < cfg.max_redirects) {
            queue.push_back(Task{task.index, std::move(target), ask, task.hops + 1});
          }
        }
        return true;  // any other error: kFailed (the shard answered)
      }
      states[task.index] = op.accept(task.index, reply);
      return true;
    };

    // Write and read all shards at once until every reply is in or the deadline passes.
    std::vector<pollfd> fds;
    std::vector<Group*> polled;
    DataReply reply;
    while (true) {
      fds.clear();
      polled.clear();
      for (auto& [_, g] : groups) {
        if (!g.active) continue;
        short events = POLLIN;
        if (g.c->conn.want_write()) events |= POLLOUT;
        fds.push_back(pollfd{g.c->conn.fd(), events, 0});
        polled.push_back(&g);
      }
      if (polled.empty()) break;
      auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) break;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      const int ready = ppoll(fds.data(), fds.size(), &ts, nullptr);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      for (std::size_t i = 0; i < polled.size(); ++i) {
        Group& g = *polled[i];
        const short rev = fds[i].revents;
        if (rev == 0) continue;
        std::size_t io_bytes = 0;
        if (rev & POLLOUT) {
          auto st = g.c->conn.write_some(io_bytes);
          counters.bytes_written += io_bytes;
          if (!st) {
            fail_group(g);
            continue;
          }
        }
        if (rev & (POLLIN | POLLHUP | POLLERR)) {
          io_bytes = 0;
          auto st = g.c->conn.read_some(io_bytes);
          counters.bytes_read += io_bytes;
          // Replies already complete are still good even when the read then failed.
          while (!g.expect.empty()) {
            std::string* target = nullptr;
            if (op.bulk_target && g.expect.front() >= 0) {
              target = op.bulk_target(g.tasks[static_cast<std::size_t>(g.expect.front())].index);
            }
            auto more = g.c->conn.next_data_reply(reply, target);
            if (!more) {
              st = more.status();
              break;
            }
            if (!*more) break;
            if (!handle(g, reply)) {
              st = Status{ErrorCode::kFailedPrecondition, "redis: AUTH refused"};
              ++counters.connect_errors;
              break;
            }
          }
          if (!st) {
            fail_group(g);
            continue;
          }
          fill(g);  // the window has room again
          if (g.expect.empty() && g.sent == g.tasks.size() && !g.c->conn.want_write()) {
            g.active = false;
          }
        }
      }
    }
    // Shards still owing replies missed the deadline: close (late replies die with it).
    for (auto& [_, g] : groups) {
      // Never left half-receiving into a caller's string (it may be gone after this call).
      if (g.c != nullptr && g.c->conn.mid_bulk() && !g.active) g.c->conn.close();
      if (g.c == nullptr || g.tasks.empty()) continue;
      if (g.active) {
        ++counters.timeouts;
        fail_group(g);
      }
      if (g.failed) {
        count_breaker(g.shard->breaker.on_failure(Clock::now()));
        want_refresh = true;
      } else {
        count_breaker(g.shard->breaker.on_success());
      }
    }
    groups.clear();  // unlock every connection before a refresh
    if (want_refresh) maybe_refresh(deadline);
    apply_moved(moved_slots);
  }
  for (KeyState s : states) {
    if (s == KeyState::kFound) ++counters.found;
    if (s == KeyState::kMissing) ++counters.missing;
    if (s == KeyState::kFailed) ++counters.failed;
  }
}

RedisCluster::RedisCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisCluster::~RedisCluster() = default;

Result<std::unique_ptr<RedisCluster>> RedisCluster::connect(const RedisClusterConfig& config) {
  if (auto st = config.validate(); !st) return st;
  auto impl = std::make_unique<Impl>(config);
  // The seeds only: connect() asks each in turn, each by connect_timeout (times two: the
  // connect, then CLUSTER SLOTS).
  const Deadline deadline =
      Clock::now() + config.connect_timeout * 2 * static_cast<int>(config.seeds.size());
  if (auto st = impl->refresh(deadline); !st) {
    return Status{st.code(), "redis cluster: no seed gave a slot map: " + st.message()};
  }
  impl->last_refresh = Clock::now();
  return std::unique_ptr<RedisCluster>(new RedisCluster(std::move(impl)));
}

std::vector<KeyState> RedisCluster::exists(std::span<const std::string> keys, Deadline deadline) {
  Op op{Role::kProbe,
        "EXISTS",
        [&](std::size_t i) { return std::string_view(keys[i]); },
        nullptr,
        [&](std::size_t i) { return keys[i].size() + 16; },
        [](std::size_t, DataReply& r) {
          if (r.type != DataReply::Type::kInteger) return KeyState::kFailed;
          return r.integer > 0 ? KeyState::kFound : KeyState::kMissing;
        },
        nullptr};
  std::vector<KeyState> states;
  impl_->execute(op, keys.size(), deadline, states);
  return states;
}

std::vector<GetReply> RedisCluster::get(std::span<const std::string> keys, Deadline deadline) {
  return get(keys, deadline, 0);
}

std::vector<GetReply> RedisCluster::get(std::span<const std::string> keys, Deadline deadline,
                                        std::size_t expected_value_bytes) {
  std::vector<GetReply> replies;
  get_into(keys, deadline, replies, expected_value_bytes);
  return replies;
}

void RedisCluster::get_into(std::span<const std::string> keys, Deadline deadline,
                            std::vector<GetReply>& replies) {
  get_into(keys, deadline, replies, 0);
}

void RedisCluster::get_into(std::span<const std::string> keys, Deadline deadline,
                            std::vector<GetReply>& replies, std::size_t expected_value_bytes) {
  const std::size_t expected =
      expected_value_bytes != 0 ? expected_value_bytes : impl_->cfg.expected_value_bytes;
  replies.resize(keys.size());
  Op op{Role::kFetch,
        "GET",
        [&](std::size_t i) { return std::string_view(keys[i]); },
        nullptr,
        [&](std::size_t) { return expected; },
        [&](std::size_t i, DataReply& r) {
          if (r.type == DataReply::Type::kNil) return KeyState::kMissing;
          if (r.type != DataReply::Type::kBulk) return KeyState::kFailed;
          if (!r.in_target) replies[i].value = std::move(r.text);
          return KeyState::kFound;
        },
        [&](std::size_t i) { return &replies[i].value; }};
  std::vector<KeyState> states;
  impl_->execute(op, keys.size(), deadline, states);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    replies[i].state = states[i];
    if (states[i] != KeyState::kFound) replies[i].value.clear();  // capacity kept
  }
}

std::vector<KeyState> RedisCluster::set(std::span<const SetItem> items, Deadline deadline) {
  Op op{Role::kPublish,
        "SET",
        [&](std::size_t i) { return items[i].key; },
        [&](std::size_t i) { return items[i].value; },
        [&](std::size_t i) { return items[i].value.size(); },
        [](std::size_t, DataReply& r) {
          return r.type == DataReply::Type::kStatus ? KeyState::kFound : KeyState::kFailed;
        },
        nullptr};
  std::vector<KeyState> states;
  impl_->execute(op, items.size(), deadline, states);
  return states;
}

RedisClusterStats RedisCluster::stats() const {
  const Counters& c = impl_->counters;
  RedisClusterStats s;
  s.calls = c.calls;
  s.keys_found = c.found;
  s.keys_missing = c.missing;
  s.keys_failed = c.failed;
  s.moved = c.moved;
  s.ask = c.ask;
  s.timeouts = c.timeouts;
  s.reconnects = c.reconnects;
  s.connect_errors = c.connect_errors;
  s.breaker_opens = c.opens;
  s.breaker_closes = c.closes;
  s.bytes_read = c.bytes_read;
  s.bytes_written = c.bytes_written;
  s.slot_map_refreshes = c.refreshes;
  return s;
}

std::vector<ShardInfo> RedisCluster::shards() const {
  const auto current = impl_->slot_map();
  std::vector<ShardInfo> out;
  std::lock_guard lock(impl_->shards_mu);
  for (const auto& [address, shard] : impl_->shards) {
    ShardInfo info;
    info.address = address;
    switch (shard->breaker.state()) {
      case detail::BreakerState::kClosed:
        info.breaker = BreakerStateView::kClosed;
        break;
      case detail::BreakerState::kOpen:
        info.breaker = BreakerStateView::kOpen;
        break;
      case detail::BreakerState::kHalfOpen:
        info.breaker = BreakerStateView::kHalfOpen;
        break;
    }
    if (current) {
      const auto& m = current->masters();
      info.in_slot_map = std::find(m.begin(), m.end(), address) != m.end();
    }
    out.push_back(std::move(info));
  }
  return out;
}

Status RedisCluster::refresh_slot_map(Deadline deadline) {
  std::lock_guard lock(impl_->refresh_mu);
  impl_->last_refresh = Clock::now();
  return impl_->refresh(deadline);
}

std::string RedisCluster::describe() const {
  return "RedisCluster{" + impl_->cfg.describe() + "}";
}

}  // namespace radixtier::shared
