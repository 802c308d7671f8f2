#include "shared/endpoint.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace radixtier::shared::detail {

Result<Endpoint> parse_endpoint(std::string_view address) {
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return invalid_argument("redis cluster: '" + std::string(address) + "' is not host:port");
  }
  int port = 0;
  const auto digits = address.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc{} || ptr != digits.data() + digits.size() || port <= 0 || port > 65535) {
    return invalid_argument("redis cluster: bad port in '" + std::string(address) + "'");
  }
  std::string_view host = address.substr(0, colon);
  // "[v6]:port", as URLs write an IPv6 address: the brackets are not part of the host.
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find_first_of("[]") != std::string_view::npos) {
    return invalid_argument("redis cluster: unbalanced brackets in '" + std::string(address) +
                            "' (an IPv6 seed is [address]:port)");
  }
  if (host.empty()) {
    return invalid_argument("redis cluster: '" + std::string(address) + "' has no host");
  }
  return Endpoint{std::string(host), port};
}

namespace {

using DnsClock = std::chrono::steady_clock;
constexpr auto kDnsMaxAge = std::chrono::seconds(30);
constexpr std::size_t kMaxDnsLookups = 8;  // background lookups at once

struct DnsEntry {
  std::vector<SocketAddress> addresses;
  DnsClock::time_point at;
};

// Never destroyed: detached lookups may finish after main() returns.
struct DnsCache {
  std::mutex mu;
  std::map<std::string, DnsEntry> entries;  // by host
  std::set<std::string> in_flight;
};
DnsCache& dns_cache() {
  static auto* cache = new DnsCache;
  return *cache;
}

// getaddrinfo for `host` (port 0: the caller sets it); blocking.
Result<std::vector<SocketAddress>> lookup(const std::string& host, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (gai != 0 || found == nullptr) {
    return Status{ErrorCode::kTransferFailed,
                  "redis: cannot resolve " + host + ": " + gai_strerror(gai)};
  }
  std::vector<SocketAddress> out;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    SocketAddress a;
    std::memcpy(&a.addr, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    out.push_back(a);
  }
  freeaddrinfo(found);
  if (out.empty()) return Status{ErrorCode::kTransferFailed, "redis: no address for " + host};
  return out;
}

void set_port(std::vector<SocketAddress>& addresses, int port) {
  for (SocketAddress& a : addresses) {
    if (a.addr.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&a.addr)->sin_port = htons(static_cast<std::uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in6*>(&a.addr)->sin6_port = htons(static_cast<std::uint16_t>(port));
    }
  }
}

void store(const std::string& host, std::vector<SocketAddress> addresses) {
  DnsCache& cache = dns_cache();
  std::lock_guard lock(cache.mu);
  cache.entries[host] = DnsEntry{std::move(addresses), DnsClock::now()};
}

void lookup_in_background(const std::string& host) {
  DnsCache& cache = dns_cache();
  {
    std::lock_guard lock(cache.mu);
    if (cache.in_flight.count(host) || cache.in_flight.size() >= kMaxDnsLookups) return;
    cache.in_flight.insert(host);
  }
  std::thread([host] {
    auto found = lookup(host, 0);
    DnsCache& c = dns_cache();
    if (found) store(host, std::move(*found));
    std::lock_guard lock(c.mu);
    c.in_flight.erase(host);
  }).detach();
}

bool to_bytes(std::string_view host, Network& out) {
  const std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), out.bytes.data()) == 1) {
    out.family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, h.c_str(), out.bytes.data()) == 1) {
    out.family = AF_INET6;
    return true;
  }
  return false;
}

}  // namespace

Result<std::vector<SocketAddress>> resolve_cached(const Endpoint& endpoint) {
  if (auto numeric = lookup(endpoint.host, AI_NUMERICHOST)) {  // no DNS: at once
    set_port(*numeric, endpoint.port);
    return numeric;
  }
  std::vector<SocketAddress> cached;
  bool stale = true;
  {
    DnsCache& cache = dns_cache();
    std::lock_guard lock(cache.mu);
    auto it = cache.entries.find(endpoint.host);
    if (it != cache.entries.end()) {
      cached = it->second.addresses;
      stale = DnsClock::now() - it->second.at > kDnsMaxAge;
    }
  }
  if (stale) lookup_in_background(endpoint.host);
  if (cached.empty()) {
    return Status{ErrorCode::kTransferFailed,
                  "redis: resolving " + endpoint.host + " (in the background)"};
  }
  set_port(cached, endpoint.port);
  return cached;
}

Result<std::vector<SocketAddress>> resolve_now(const Endpoint& endpoint) {
  auto found = lookup(endpoint.host, 0);
  if (!found) return found;
  store(endpoint.host, *found);
  set_port(*found, endpoint.port);
  return found;
}

bool Network::contains(std::string_view numeric_host) const {
  Network other;
  if (!to_bytes(numeric_host, other) || other.family != family) return false;
  const int full = prefix / 8;
  if (std::memcmp(bytes.data(), other.bytes.data(), static_cast<std::size_t>(full)) != 0) {
    return false;
  }
  const int rest = prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xFF << (8 - rest));
  return (bytes[static_cast<std::size_t>(full)] & mask) ==
         (other.bytes[static_cast<std::size_t>(full)] & mask);
}

Result<Network> parse_network(std::string_view cidr) {
  const auto slash = cidr.find('/');
  Network n;
  if (!to_bytes(cidr.substr(0, slash), n)) {
    return invalid_argument("redis cluster: '" + std::string(cidr) +
                            "' is not an IP address or network (a.b.c.d/len, x::y/len)");
  }
  const int max = n.family == AF_INET ? 32 : 128;
  n.prefix = max;
  if (slash != std::string_view::npos) {
    const auto digits = cidr.substr(slash + 1);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n.prefix);
    if (digits.empty() || ec != std::errc{} || ptr != digits.data() + digits.size() ||
        n.prefix < 0 || n.prefix > max) {
      return invalid_argument("redis cluster: bad prefix length in '" + std::string(cidr) + "'");
    }
  }
  return n;
}

Result<std::vector<Network>> networks_of_host(const std::string& host, int prefix_v4,
                                              int prefix_v6) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (gai != 0 || found == nullptr) {
    return Status{ErrorCode::kTransferFailed,
                  "redis: cannot resolve " + host + ": " + gai_strerror(gai)};
  }
  std::vector<Network> out;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    Network n;
    n.family = ai->ai_family;
    if (ai->ai_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      std::memcpy(n.bytes.data(), &a->sin_addr, 4);
      n.prefix = prefix_v4;
    } else if (ai->ai_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      std::memcpy(n.bytes.data(), &a->sin6_addr, 16);
      n.prefix = prefix_v6;
    } else {
      continue;
    }
    out.push_back(n);
  }
  freeaddrinfo(found);
  return out;
}

}  // namespace radixtier::shared::detail
