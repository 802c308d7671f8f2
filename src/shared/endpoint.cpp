#include "shared/endpoint.hpp"

#include <charconv>

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
  return Endpoint{std::string(address.substr(0, colon)), port};
}

}  // namespace radixtier::shared::detail
