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
#include <random>

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
using detail::SetupLimits;
using detail::SlotMap;

enum class Role : std::uint8_t { kProbe = 0, kFetch = 1, kPublish = 2 };

// In a group's expected replies, besides task positions (>= 0): ASKING's +OK, the pipelined
// AUTH of a fresh connection, and the ECHO that ends each batch of commands.
constexpr std::ptrdiff_t kAskingReply = -1;
constexpr std::ptrdiff_t kAuthReply = -2;
constexpr std::ptrdiff_t kEchoReply = -3;

// Former masters (not in the slot map) kept with their breakers, at most; CLUSTER SLOTS
// asked of this many known masters per refresh, at most (then the seeds).
constexpr std::size_t kMaxFormerShards = 32;
constexpr std::size_t kMaxRefreshMasters = 8;
// A CLUSTER SLOTS reply: 16384 single-slot ranges with two replicas and Redis 7's metadata
// take about 4 MiB; anything past these bounds is refused.
constexpr SetupLimits kSlotsLimits{std::size_t{16} << 20, std::size_t{1} << 20, 4};

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
      bytes_written{0}, refreshes{0}, protocol_errors{0}, internal_errors{0};
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
  /// Longest bulk a command's reply may carry (0: none, EXISTS and SET get none).
  std::size_t max_bulk = 0;
};

bool starts_with(const DataReply& r, std::string_view prefix) {
  return std::string_view(r.text).substr(0, prefix.size()) == prefix;
}

// "MOVED 3999 127.0.0.1:6381" -> 3999 (-1 when malformed)
int redirect_slot(const DataReply& r) {
  std::string_view text(r.text);
  const auto first = text.find(' ');
  const auto last = text.rfind(' ');
  if (first == std::string_view::npos || last == first) return -1;
  int slot = -1;
  auto [ptr, ec] = std::from_chars(text.data() + first + 1, text.data() + last, slot);
  if (ec != std::errc{} || ptr != text.data() + last || slot < 0 || slot >= kClusterSlots) {
    return -1;
  }
  return slot;
}

// "MOVED 3999 127.0.0.1:6381" -> "127.0.0.1:6381"; "MOVED 3999 :6381" (unknown-endpoint)
// -> the host of the node that replied; "" when it names no usable endpoint.
std::string redirect_target(const DataReply& r, const std::string& replied_host) {
  std::string_view text(r.text);
  const auto last_space = text.rfind(' ');
  if (last_space == std::string_view::npos) return {};
  std::string target(text.substr(last_space + 1));
  if (!target.empty() && target.front() == ':') target = replied_host + target;
  if (!detail::parse_endpoint(target)) return {};
  return target;
}

}  // namespace

struct RedisCluster::Impl {
  explicit Impl(RedisClusterConfig c) : cfg(std::move(c)), creds{cfg.user, cfg.password} {
    std::random_device rd;
    nonce_base = "rt" + std::to_string(rd()) + "." + std::to_string(rd()) + ".";
  }

  RedisClusterConfig cfg;
  Credentials creds;
  Counters counters;
  std::vector<detail::Network> auth_networks;  // where AUTH may go
  std::string nonce_base;                      // ECHO sentinels: nonce_base + a sequence
  std::atomic<std::uint64_t> nonce_seq{0};

  mutable std::mutex shards_mu;
  // Held by shared_ptr: a call keeps the shards it routes to while the table is trimmed.
  std::map<std::string, std::shared_ptr<Shard>> shards;

  mutable std::mutex map_mu;
  std::shared_ptr<const SlotMap> map;

  std::mutex refresh_mu;
  Clock::time_point last_refresh{};

  std::shared_ptr<Shard> shard(const std::string& address) {
    std::lock_guard lock(shards_mu);
    auto it = shards.find(address);
    if (it != shards.end()) return it->second;
    auto ep = detail::parse_endpoint(address);
    if (!ep) return nullptr;
    auto [pos, _] = shards.emplace(address, std::make_shared<Shard>(std::move(*ep), cfg));
    return pos->second;
  }

  // Drops former masters past kMaxFormerShards (a MOVED storm naming new addresses must
  // not grow the table without bound).
  void trim_shards() {
    const auto current = slot_map();
    std::lock_guard lock(shards_mu);
    std::size_t former = 0;
    for (auto it = shards.begin(); it != shards.end();) {
      const bool in_map =
          current && std::binary_search(sorted_masters.begin(), sorted_masters.end(), it->first);
      if (!in_map && ++former > kMaxFormerShards) {
        it = shards.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::vector<std::string> sorted_masters;  // guarded by shards_mu: the map's, sorted

  void set_map(std::shared_ptr<const SlotMap> fresh) {
    std::vector<std::string> sorted = fresh->masters();
    std::sort(sorted.begin(), sorted.end());
    {
      std::lock_guard lock(map_mu);
      map = std::move(fresh);
    }
    {
      std::lock_guard lock(shards_mu);
      sorted_masters = std::move(sorted);
    }
    trim_shards();
  }

  std::shared_ptr<const SlotMap> slot_map() const {
    std::lock_guard lock(map_mu);
    return map;
  }

  void count_breaker(BreakerTransition t) {
    if (t == BreakerTransition::kOpened) ++counters.opens;
    if (t == BreakerTransition::kClosed) ++counters.closes;
  }

  // Asks CLUSTER SLOTS of up to kMaxRefreshMasters known masters whose breakers are closed,
  // then of the seeds, then of the other masters (same cap), each by min(deadline, now +
  // connect_timeout); a reply is bounded in bytes, elements and depth (kSlotsLimits).
  Status refresh(Deadline deadline) {
    std::vector<std::string> candidates;
    std::vector<std::string> later;
    if (auto current = slot_map()) {
      for (const auto& m : current->masters()) {
        if (candidates.size() >= kMaxRefreshMasters && later.size() >= kMaxRefreshMasters) break;
        auto s = shard(m);
        auto& into = s && s->breaker.state() == detail::BreakerState::kClosed ? candidates : later;
        if (into.size() < kMaxRefreshMasters) into.push_back(m);
      }
    }
    for (const auto& seed : cfg.seeds) {
      if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
        candidates.push_back(seed);
      }
    }
    candidates.insert(candidates.end(), later.begin(), later.end());
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
      if (auto st =
              conn.connect(*ep, creds, until, RedisConnection::AuthMode::kWait, &auth_networks);
          !st) {
        last = st;
        continue;
      }
      auto reply = conn.command({"CLUSTER", "SLOTS"}, until, kSlotsLimits);
      if (!reply) {
        last = reply.status();
        continue;
      }
      auto parsed = SlotMap::parse(*reply, ep->host);
      if (!parsed) {
        last = parsed.status();
        continue;
      }
      if (parsed->assigned() == 0) {
        last = Status{ErrorCode::kTransferFailed, "redis: " + address + " serves no slot"};
        continue;
      }
      set_map(std::make_shared<const SlotMap>(std::move(*parsed)));
      ++counters.refreshes;
      return Status::ok();
    }
    return last;
  }

  // MOVED replies are the newest word on their slots (a node's CLUSTER SLOTS may lag):
  // applied on top of the map, after any refresh, one copy per pass.
  void apply_moved(const std::vector<std::pair<std::uint16_t, std::string>>& moved) {
    if (moved.empty()) return;
    auto current = slot_map();
    if (!current) return;
    set_map(std::make_shared<const SlotMap>(current->with_owners(moved)));
  }

  void maybe_refresh(Deadline deadline) {
    std::unique_lock lock(refresh_mu, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another call is refreshing
    const auto now = Clock::now();
    if (now - last_refresh < cfg.slot_refresh_interval || now >= deadline) return;
    last_refresh = now;
    (void)refresh(deadline);
  }

  // Runs `op` over items [0, n): states[i] ends kFound / kMissing / kFailed. Never throws:
  // anything thrown inside (std::bad_alloc) fails the keys not yet answered and closes every
  // connection the pass held.
  void execute(const Op& op, std::size_t n, Deadline deadline, std::vector<KeyState>& states);
  // EXISTS over `keys` sent as `role` (a lookup's probe, or the check before a write).
  std::vector<KeyState> exists(Role role, std::span<const std::string> keys, Deadline deadline);
};

void RedisCluster::Impl::execute(const Op& op, std::size_t n, Deadline deadline,
                                 std::vector<KeyState>& states) {
  ++counters.calls;
  states.assign(n, KeyState::kFailed);
  std::deque<Task> queue;
  for (std::size_t i = 0; i < n; ++i) queue.push_back(Task{i, {}, false, 0});
  const auto role = static_cast<std::size_t>(op.role);

  // One shard's part of a pass: its tasks go out through a window of max_inflight_bytes
  // (a command is sent when the bytes of those sent and not yet answered leave room). Each
  // batch of commands written together ends with ECHO <nonce>: what the batch's replies say
  // is taken (committed) only when the reply after them is that nonce, so a reply the server
  // sent unasked (an extra, a stale one, one too few) shifts the nonce and the batch fails
  // instead of being matched to the wrong command.
  struct Group {
    std::shared_ptr<Shard> shard;
    Connection* c = nullptr;
    std::vector<Task> tasks;
    std::size_t sent = 0;               // tasks[0, sent) are written or queued
    std::size_t inflight = 0;           // their bytes not answered yet
    std::deque<std::ptrdiff_t> expect;  // per reply owed: task position or k...Reply
    std::deque<std::string> nonces;     // per ECHO owed
    std::vector<std::pair<std::size_t, KeyState>> answered;    // not committed yet
    std::vector<Task> redirected;                              // not committed yet
    std::vector<std::pair<std::uint16_t, std::string>> moved;  // not committed yet
    std::unique_lock<std::timed_mutex> lock;
    bool lock_pending = false;  // another call holds the connection: tried again meanwhile
    Deadline connect_until{};   // while connecting
    bool active = false;
    bool failed = false;  // connection error or timeout (a breaker failure)
  };

  // A pass routes every queued task; redirects (MOVED / ASK) queue them for the next pass.
  while (!queue.empty()) {
    bool want_refresh = false;
    std::vector<std::pair<std::uint16_t, std::string>> moved_slots;
    const auto start = Clock::now();
    if (start >= deadline) break;
    std::map<std::string, Group> groups;  // address order: the lock order
    try {
      const auto current = slot_map();
      for (auto& task : queue) {
        const std::string* target = &task.redirect;
        if (target->empty()) {
          target = current ? current->master_of(key_slot(op.key(task.index))) : nullptr;
        }
        if (target == nullptr || target->empty()) {  // unassigned slot: kFailed, ask again
          want_refresh = true;
          continue;
        }
        groups[*target].tasks.push_back(std::move(task));
      }
      queue.clear();

      auto fill = [&](Group& g) {
        bool any = false;
        while (g.sent < g.tasks.size()) {
          const Task& task = g.tasks[g.sent];
          const std::size_t cost = op.cost(task.index);
          if (g.inflight != 0 && g.inflight + cost > cfg.max_inflight_bytes) break;
          if (task.asking) {
            g.c->conn.append({"ASKING"});
            g.expect.push_back(kAskingReply);
          }
          // A command with a value (SET) carries it; EXISTS, on either role's connections,
          // carries the key alone (a publisher checks before it writes).
          if (op.value) {
            g.c->conn.append({op.command, op.key(task.index), op.value(task.index)});
          } else {
            g.c->conn.append({op.command, op.key(task.index)});
          }
          g.expect.push_back(static_cast<std::ptrdiff_t>(g.sent));
          g.inflight += cost;
          ++g.sent;
          any = true;
        }
        if (any) {
          g.nonces.push_back(nonce_base + std::to_string(nonce_seq++));
          g.c->conn.append({"ECHO", g.nonces.back()});  // short: copied, not referenced
          g.expect.push_back(kEchoReply);
        }
      };

      // A connection that could not be opened: its keys fail now (a breaker failure unless
      // the node was outside the cluster's networks: it was never asked).
      auto connect_failed = [&](Group& g, const Status& st) {
        ++counters.connect_errors;
        if (st.code() != ErrorCode::kFailedPrecondition) {
          count_breaker(g.shard->breaker.on_failure(Clock::now()));
        }
        want_refresh = true;
        g.c->conn.close();
        g.tasks.clear();
        g.expect.clear();
        g.active = false;
      };
      // The connection's lock is held: open it (without waiting) or send at once.
      auto prepare = [&](Group& g) {
        // An idle connection with bytes waiting (or closed by the server) has replies nobody
        // asked for: they must not meet this call's commands.
        if (g.c->conn.is_open() && g.c->conn.idle_input_pending()) {
          ++counters.protocol_errors;
          g.c->conn.close();
        }
        if (!g.c->conn.is_open()) {
          // Every shard connects at once: a black-holed one holds back only its own keys.
          if (auto st = g.c->conn.start_connect(g.shard->endpoint); !st) {
            connect_failed(g, st);
            return;
          }
          g.connect_until = std::min(deadline, Clock::now() + cfg.connect_timeout);
          g.active = true;
          return;
        }
        fill(g);
        g.active = !g.expect.empty();
      };
      // A connect that completed: AUTH goes first in the pipeline (a shard slow to answer it,
      // stopped or paused, holds back only its own keys), then the commands.
      auto connected = [&](Group& g) {
        if (auto st = g.c->conn.finish_connect(creds, &auth_networks); !st) {
          connect_failed(g, st);
          return;
        }
        if (g.c->ever_opened) ++counters.reconnects;
        g.c->ever_opened = true;
        if (!creds.password.empty()) g.expect.push_back(kAuthReply);
        fill(g);
        g.active = !g.expect.empty();
      };

      for (auto& [address, g] : groups) {
        g.shard = shard(address);
        if (g.shard == nullptr || !g.shard->breaker.allow(start)) {
          want_refresh = true;  // an open breaker: maybe a failover; no shard: a bad address
          g.tasks.clear();
          continue;
        }
        g.c = &g.shard->conns[static_cast<std::size_t>(role)];
        // Never waited for here: a connection another call holds is tried again while the
        // free shards' I/O runs, so waiting for one shard spends no other shard's time.
        g.lock = std::unique_lock(g.c->mu, std::try_to_lock);
        if (!g.lock.owns_lock()) {
          g.lock_pending = true;
          continue;
        }
        prepare(g);
      }

      auto fail_group = [&](Group& g) {
        g.c->conn.close();
        g.active = false;
        g.failed = true;
      };
      // false: the connection is unusable (AUTH refused, a sentinel that did not match).
      auto handle = [&](Group& g, DataReply& reply) {
        const std::ptrdiff_t pos = g.expect.front();
        g.expect.pop_front();
        if (pos == kAuthReply) return reply.type == DataReply::Type::kStatus;
        if (pos == kAskingReply) return true;  // its error shows on the command after it
        if (pos == kEchoReply) {
          const bool match = reply.type == DataReply::Type::kBulk && !reply.in_target &&
                             reply.text == g.nonces.front();
          g.nonces.pop_front();
          if (!match) return false;
          for (const auto& [index, state] : g.answered) states[index] = state;
          for (Task& t : g.redirected) queue.push_back(std::move(t));
          for (auto& m : g.moved) moved_slots.push_back(std::move(m));
          g.answered.clear();
          g.redirected.clear();
          g.moved.clear();
          return true;
        }
        Task& task = g.tasks[static_cast<std::size_t>(pos)];
        g.inflight -= std::min(g.inflight, op.cost(task.index));
        if (reply.type == DataReply::Type::kError) {
          const bool moved = starts_with(reply, "MOVED ");
          const bool ask = starts_with(reply, "ASK ");
          if (moved || ask) {
            (moved ? counters.moved : counters.ask)++;
            std::string target = redirect_target(reply, g.shard->endpoint.host);
            const int slot = redirect_slot(reply);
            if (target.empty() || slot != key_slot(op.key(task.index))) {
              want_refresh = true;  // a redirect naming nothing usable: ask the map again
              return true;
            }
            if (moved) {
              want_refresh = true;
              g.moved.emplace_back(static_cast<std::uint16_t>(slot), target);
            }
            if (task.hops < cfg.max_redirects) {
              g.redirected.push_back(Task{task.index, std::move(target), ask, task.hops + 1});
            }
          }
          return true;  // any other error: kFailed (the shard answered)
        }
        g.answered.emplace_back(task.index, op.accept(task.index, reply));
        return true;
      };

      // Write and read all shards at once until every reply is in or the deadline passes.
      std::vector<pollfd> fds;
      std::vector<Group*> polled;
      DataReply reply;
      while (true) {
        const auto now = Clock::now();
        if (now >= deadline) break;
        fds.clear();
        polled.clear();
        Deadline wake = deadline;
        bool pending_locks = false;
        for (auto& [_, g] : groups) {
          if (g.lock_pending) {
            if (g.lock.try_lock()) {
              g.lock_pending = false;
              prepare(g);
            } else {
              pending_locks = true;
              continue;
            }
          }
          if (g.active && g.c->conn.connecting() && now >= g.connect_until) {
            connect_failed(g, Status{ErrorCode::kTransferFailed, "redis: connect timed out"});
          }
          if (!g.active) continue;
          short events = POLLIN;
          if (g.c->conn.connecting()) {
            events = POLLOUT;
            wake = std::min(wake, g.connect_until);
          } else if (g.c->conn.want_write()) {
            events |= POLLOUT;
          }
          fds.push_back(pollfd{g.c->conn.fd(), events, 0});
          polled.push_back(&g);
        }
        if (polled.empty() && !pending_locks) break;
        if (pending_locks) wake = std::min(wake, now + std::chrono::milliseconds(1));
        auto left = wake - Clock::now();
        if (left < Clock::duration::zero()) left = Clock::duration::zero();
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        const int ready = ppoll(fds.data(), fds.size(), &ts, nullptr);
        if (ready < 0 && errno != EINTR) break;
        if (ready <= 0) continue;
        for (std::size_t i = 0; i < polled.size(); ++i) {
          Group& g = *polled[i];
          const short rev = fds[i].revents;
          if (rev == 0) continue;
          if (g.c->conn.connecting()) {
            connected(g);
            continue;
          }
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
            bool protocol = false;
            while (!g.expect.empty()) {
              const std::ptrdiff_t next = g.expect.front();
              std::string* target = nullptr;
              std::size_t max_bulk = 0;
              if (next >= 0) {
                const std::size_t index = g.tasks[static_cast<std::size_t>(next)].index;
                if (op.bulk_target) target = op.bulk_target(index);
                max_bulk = op.max_bulk;
              } else if (next == kEchoReply) {
                max_bulk = g.nonces.front().size();
              }
              auto more = g.c->conn.next_data_reply(reply, target, max_bulk);
              if (!more) {
                st = more.status();
                protocol = true;
                break;
              }
              if (!*more) break;
              if (!handle(g, reply)) {
                st = Status{ErrorCode::kFailedPrecondition, "redis: AUTH or ECHO failed"};
                protocol = true;
                break;
              }
            }
            if (protocol) ++counters.protocol_errors;
            if (!st) {
              fail_group(g);
              continue;
            }
            fill(g);  // the window has room again
            if (g.expect.empty() && g.sent == g.tasks.size() && !g.c->conn.want_write()) {
              g.active = false;
              // Bytes past the last reply owed: the server sent what nobody asked for.
              if (g.c->conn.has_unparsed()) {
                ++counters.protocol_errors;
                g.c->conn.close();
              }
              // Done with this shard (its replies are committed at the sentinel): its
              // connection goes back now. Two calls that each hold one shard and try for the
              // other's connection would otherwise both wait out their deadlines.
              count_breaker(g.shard->breaker.on_success());
              g.lock.unlock();
            }
          }
        }
      }
      // Shards still owing replies missed the deadline: close (late replies die with it).
      for (auto& [_, g] : groups) {
        // A connection never locked: its keys fail (it was busy, not broken).
        if (g.c == nullptr || !g.lock.owns_lock()) continue;
        // Never left half-receiving into a caller's string (it may be gone after this call).
        if (g.c->conn.mid_bulk() && !g.active) g.c->conn.close();
        if (g.tasks.empty()) continue;
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
    } catch (...) {
      // Whatever was half done on a connection this pass held cannot be trusted.
      ++counters.internal_errors;
      for (auto& [_, g] : groups) {
        if (g.c != nullptr && g.lock.owns_lock()) g.c->conn.close();
      }
      queue.clear();
    }
    groups.clear();  // unlock every connection before a refresh
    try {
      if (want_refresh) maybe_refresh(deadline);
      apply_moved(moved_slots);
    } catch (...) {
      ++counters.internal_errors;
    }
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
  // The seeds' names are looked up here, blocking (setup); on a request path a connection
  // takes addresses from the cache only (resolve_cached).
  for (const auto& seed : config.seeds) (void)detail::resolve_now(*detail::parse_endpoint(seed));
  // Where AUTH may go, resolved once here (never on a request path).
  for (const auto& network : config.auth_networks) {
    impl->auth_networks.push_back(*detail::parse_network(network));  // validated above
  }
  if (config.auth_networks.empty() && !config.password.empty()) {
    for (const auto& seed : config.seeds) {
      auto nets = detail::networks_of_host(detail::parse_endpoint(seed)->host, 24, 64);
      if (!nets) continue;  // a seed that does not resolve adds no network
      impl->auth_networks.insert(impl->auth_networks.end(), nets->begin(), nets->end());
    }
  }
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

namespace {

// A call's answer when something was thrown where nothing should be: every key failed.
template <typename Fn>
void guarded(Counters& counters, std::vector<KeyState>& states, std::size_t n, Fn&& fn) {
  try {
    fn();
  } catch (...) {
    ++counters.internal_errors;
    states.assign(n, KeyState::kFailed);
  }
}

}  // namespace

std::vector<KeyState> RedisCluster::Impl::exists(Role role, std::span<const std::string> keys,
                                                 Deadline deadline) {
  Op op{role,
        "EXISTS",
        [&](std::size_t i) { return std::string_view(keys[i]); },
        nullptr,
        [&](std::size_t i) { return keys[i].size() + 16; },
        [](std::size_t, DataReply& r) {
          if (r.type != DataReply::Type::kInteger) return KeyState::kFailed;
          return r.integer > 0 ? KeyState::kFound : KeyState::kMissing;
        },
        nullptr,
        0};
  std::vector<KeyState> states;
  guarded(counters, states, keys.size(), [&] { execute(op, keys.size(), deadline, states); });
  return states;
}

std::vector<KeyState> RedisCluster::exists(std::span<const std::string> keys, Deadline deadline) {
  return impl_->exists(Role::kProbe, keys, deadline);
}

std::vector<KeyState> RedisCluster::exists_before_write(std::span<const std::string> keys,
                                                        Deadline deadline) {
  return impl_->exists(Role::kPublish, keys, deadline);
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
  get_into(keys, deadline, replies, GetBounds{});
}

void RedisCluster::get_into(std::span<const std::string> keys, Deadline deadline,
                            std::vector<GetReply>& replies, std::size_t expected_value_bytes) {
  get_into(keys, deadline, replies, GetBounds{SIZE_MAX, expected_value_bytes});
}

void RedisCluster::get_into(std::span<const std::string> keys, Deadline deadline,
                            std::vector<GetReply>& replies, const GetBounds& bounds) {
  const std::size_t expected = bounds.expected_value_bytes != 0 ? bounds.expected_value_bytes
                                                                : impl_->cfg.expected_value_bytes;
  std::vector<KeyState> states;
  guarded(impl_->counters, states, keys.size(), [&] {
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
          [&](std::size_t i) { return &replies[i].value; },
          std::min(bounds.max_value_bytes, impl_->cfg.max_value_bytes)};
    impl_->execute(op, keys.size(), deadline, states);
  });
  replies.resize(std::min(replies.size(), keys.size()));
  for (std::size_t i = 0; i < replies.size(); ++i) {
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
        nullptr,
        0};
  std::vector<KeyState> states;
  guarded(impl_->counters, states, items.size(),
          [&] { impl_->execute(op, items.size(), deadline, states); });
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
  s.protocol_errors = c.protocol_errors;
  s.internal_errors = c.internal_errors;
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
