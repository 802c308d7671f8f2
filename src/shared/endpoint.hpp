// Endpoint: a parsed "host:port" (the last ':' splits; "[v6]:port" loses its brackets; port in
// [1, 65535]). Value type.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::shared::detail {

struct Endpoint {
  std::string host;
  int port = 0;
  std::string address() const { return host + ":" + std::to_string(port); }
};

Result<Endpoint> parse_endpoint(std::string_view address);

/// One address to connect to.
struct SocketAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

/// The addresses of `endpoint` without blocking: a numeric host at once; a name from a
/// process-wide cache that a background thread fills (a name not cached yet fails now with
/// "resolving" and is looked up meanwhile; a cached one older than 30 s is looked up again in
/// the background while the old answer serves). DNS never runs on a request path.
Result<std::vector<SocketAddress>> resolve_cached(const Endpoint& endpoint);
/// Blocking lookup that fills the cache (setup only: RedisCluster::connect's seeds).
Result<std::vector<SocketAddress>> resolve_now(const Endpoint& endpoint);

/// An IP network: "10.0.0.0/8", "fd00::/64", or one address ("127.0.0.1" = /32, "::1" = /128).
struct Network {
  int family = 0;  ///< AF_INET / AF_INET6
  std::array<std::uint8_t, 16> bytes{};
  int prefix = 0;
  /// True when `numeric_host` (an address as inet_ntop writes it) is inside.
  bool contains(std::string_view numeric_host) const;
};
Result<Network> parse_network(std::string_view cidr);
/// The network of `prefix_v4` / `prefix_v6` bits around each address `host` resolves to
/// (blocking DNS: call it at setup, never on a request path).
Result<std::vector<Network>> networks_of_host(const std::string& host, int prefix_v4,
                                              int prefix_v6);

}  // namespace radixtier::shared::detail
