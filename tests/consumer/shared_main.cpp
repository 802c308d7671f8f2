// An engine's view of the shared component: only the installed headers of radixtier::shared.
// Routes keys as the Redis Cluster spec does, validates a config (the password masked), and
// gets a clean error from a seed where nothing listens (no server needed).
#include <cstdio>
#include <string>

#include "radixtier/shared/key_slot.hpp"
#include "radixtier/shared/redis_cluster.hpp"

int main() {
  using namespace radixtier::shared;
  if (key_slot("123456789") != 0x31C3 % kClusterSlots) return std::fprintf(stderr, "slot\n"), 1;
  if (key_slot("{user1000}.following") != key_slot("{user1000}.followers")) return 1;
  RedisClusterConfig config;
  config.seeds = {"127.0.0.1:1"};
  config.password = "consumer-secret";
  if (!config.validate()) return std::fprintf(stderr, "validate\n"), 1;
  if (config.describe().find("consumer-secret") != std::string::npos) return 1;
  auto client = RedisCluster::connect(config);
  if (client.is_ok()) return std::fprintf(stderr, "connected to nothing\n"), 1;
  if (client.status().to_string().find("consumer-secret") != std::string::npos) return 1;
  std::printf("shared consumer ok: %s\n", client.status().to_string().c_str());
  return 0;
}
