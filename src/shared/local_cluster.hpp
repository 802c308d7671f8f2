// LocalCluster: a real Redis Cluster of redis-server processes on loopback ports, in a fresh
// temp dir, for the tests, the benchmark and demos (internal: never installed).
//
// Layout: nodes [0, masters) are the masters, master m owning an equal share of the 16384
// slots; node masters + m * replicas_per_master + j is replica j of master m. The cluster is
// assembled with CLUSTER ADDSLOTSRANGE / SET-CONFIG-EPOCH / MEET / REPLICATE (redis-cli
// --cluster create refuses fewer than 3 masters, and picks replicas' masters itself);
// start() returns once every node says cluster_state:ok with all slots assigned and every
// replica's link to its master is up.
//
// Lifecycle of a node: running --stop()--> stopped (SIGSTOP) --cont()--> running;
// running/stopped --kill9()--> dead (reaped). The destructor SIGCONTs and SIGKILLs every
// node it started, reaps them and removes the temp dir.
// Not thread-safe (one test thread drives it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::shared {

struct LocalClusterOptions {
  std::string password;  ///< --requirepass / --masterauth when set
  std::chrono::milliseconds node_timeout{1000};
  std::chrono::milliseconds start_timeout{30000};
};

/// The full path of `program` on PATH, or an error saying how to install it.
Result<std::string> find_redis_program(std::string_view program);

class LocalCluster {
 public:
  static Result<std::unique_ptr<LocalCluster>> start(std::size_t masters = 3,
                                                     std::size_t replicas_per_master = 0,
                                                     LocalClusterOptions options = {});
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  std::size_t size() const { return nodes_.size(); }
  std::size_t masters() const { return masters_; }
  int port(std::size_t i) const { return nodes_[i].port; }
  /// "127.0.0.1:port" of every node.
  std::vector<std::string> seeds() const;
  const std::string& dir() const { return dir_; }
  /// The node index of replica j of master m (the initial layout).
  std::size_t replica_index(std::size_t master, std::size_t j = 0) const {
    return masters_ + master * replicas_ + j;
  }

  // Faults.
  Status kill9(std::size_t i);
  Status stop(std::size_t i);
  Status cont(std::size_t i);
  Status client_pause(std::size_t i, std::chrono::milliseconds duration);
  Status set_maxmemory(std::size_t i, std::uint64_t bytes);

  /// Runs one command on node i (AUTH first when a password is set); the reply as text
  /// (arrays one element a line); an error reply is an error.
  Result<std::string> command(std::size_t i, const std::vector<std::string>& args);
  /// The same, an array reply's elements.
  Result<std::vector<std::string>> command_list(std::size_t i,
                                                const std::vector<std::string>& args);
  Result<std::string> node_id(std::size_t i);
  /// The index of the node that serves `slot` as master, as every live node agrees.
  Result<std::size_t> master_index_of_slot(std::uint16_t slot);
  /// Waits until the slots of `dead_master` are served by another live node, all live
  /// nodes agreeing, and every live node says cluster_state:ok.
  Status wait_for_failover(std::size_t dead_master, std::chrono::milliseconds timeout);

  /// A live reshard of `slot` from master `from` to master `to`, step by step:
  /// begin: SETSLOT IMPORTING on `to`, MIGRATING on `from`, then MIGRATE at most `max_keys`
  /// keys (the slot is half-migrated: its moved keys answer ASK at `from`);
  /// finish: MIGRATE the rest, SETSLOT NODE on `to`, `from` and every other live master
  /// (then `from` answers MOVED). migrate_slot() does both.
  Status migrate_slot_begin(std::uint16_t slot, std::size_t from, std::size_t to,
                            std::size_t max_keys);
  Status migrate_slot_finish(std::uint16_t slot, std::size_t from, std::size_t to);
  Status migrate_slot(std::uint16_t slot, std::size_t from, std::size_t to);

 private:
  struct Node {
    int port = 0;
    pid_t pid = -1;
    bool dead = false;
    bool stopped = false;
  };
  LocalCluster() = default;
  Status spawn_all(const std::string& server, int base_port);
  Status assemble();
  Status wait_ready(std::chrono::milliseconds timeout);
  Status move_keys(std::uint16_t slot, std::size_t from, std::size_t to, std::size_t max_keys);
  Status check_index(std::size_t i, bool must_run) const;

  std::string dir_;
  LocalClusterOptions options_;
  std::size_t masters_ = 0;
  std::size_t replicas_ = 0;
  std::vector<Node> nodes_;
};

}  // namespace radixtier::shared
