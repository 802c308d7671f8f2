// Seed addresses: host:port, and an IPv6 address in brackets as URLs write it.
#include "shared/endpoint.hpp"

#include <gtest/gtest.h>

namespace radixtier::shared::detail {
namespace {

TEST(Endpoint, ParsesHostPortAndBracketedIpv6) {
  auto plain = parse_endpoint("10.0.0.7:7000");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->host, "10.0.0.7");
  EXPECT_EQ(plain->port, 7000);
  auto bare_v6 = parse_endpoint("::1:6379");  // the last colon splits, as Redis writes it
  ASSERT_TRUE(bare_v6);
  EXPECT_EQ(bare_v6->host, "::1");
  // Bracketed, the host is the address alone (it was resolved as the name "[::1]", never
  // connecting).
  auto bracketed = parse_endpoint("[::1]:38200");
  ASSERT_TRUE(bracketed);
  EXPECT_EQ(bracketed->host, "::1");
  EXPECT_EQ(bracketed->port, 38200);
  for (const char* bad :
       {"[::1:6379", "::1]:6379", "[]:6379", "host", ":6379", "host:0", "host:65536", "host:12x"}) {
    auto r = parse_endpoint(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace radixtier::shared::detail
