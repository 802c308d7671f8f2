// Endpoint: a parsed "host:port" (the last ':' splits; port in [1, 65535]). Value type.
#pragma once

#include <string>
#include <string_view>

#include "radixtier/status.hpp"

namespace radixtier::shared::detail {

struct Endpoint {
  std::string host;
  int port = 0;
  std::string address() const { return host + ":" + std::to_string(port); }
};

Result<Endpoint> parse_endpoint(std::string_view address);

}  // namespace radixtier::shared::detail
