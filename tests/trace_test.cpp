// Mooncake trace parsing, token synthesis and the infinite-cache ceiling.
#include "sim/trace.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace radixtier::sim {
namespace {

constexpr const char* kInline =
    R"({"timestamp": 0, "input_length": 1200, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 5, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 3]}

{"timestamp": 9, "input_length": 512, "output_length": 1, "hash_ids": [7]}
{ "hash_ids" : [0, 1, 2, 4], "output_length":2, "input_length" : 1600, "timestamp" : 12 }
)";

TEST(Trace, ParsesFlatObjectsInAnyKeyOrder) {
  std::istringstream in(kInline);
  auto reqs = parse_trace(in);
  ASSERT_TRUE(reqs.is_ok()) << reqs.status().to_string();
  ASSERT_EQ(reqs->size(), 4u);
  EXPECT_EQ((*reqs)[1].timestamp_ms, 5u);
  EXPECT_EQ((*reqs)[1].input_length, 1100u);
  EXPECT_EQ((*reqs)[1].output_length, 4u);
  EXPECT_EQ((*reqs)[1].hash_ids, (std::vector<std::uint64_t>{0, 1, 3}));
  EXPECT_EQ((*reqs)[3].timestamp_ms, 12u);
  EXPECT_EQ((*reqs)[3].hash_ids.size(), 4u);
}

TEST(Trace, MalformedLinesNameTheLine) {
  std::istringstream in(
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 0, \"input_length\": 10 \"output_length\": 1, \"hash_ids\": [1]}\n");
  auto reqs = parse_trace(in);
  ASSERT_FALSE(reqs.is_ok());
  EXPECT_EQ(reqs.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(reqs.status().message().find("line 2"), std::string::npos) << reqs.status().message();
  auto check = [](std::string_view line, std::string_view what) {
    auto r = parse_trace_line(line, 7);
    ASSERT_FALSE(r.is_ok()) << line;
    EXPECT_NE(r.status().message().find("line 7"), std::string::npos);
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  check(R"({"timestamp": 0, "input_length": 10, "output_length": 1})", "hash_ids");
  check(R"({"timestamp": 0, "input_length": 1030, "output_length": 1, "hash_ids": [1]})",
        "3 blocks");
  check(R"({"timestamp": 0.5, "input_length": 10, "output_length": 1, "hash_ids": [1]})",
        "integer");
  check(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1,]})",
        "not valid JSON");
  check(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, -2]})",
        "hash_ids\"[1]");
  check(R"({"timestamp": "0", "input_length": 10, "output_length": 1, "hash_ids": [1]})",
        "non-negative integer");
  check(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]} x)",
        "after the object");
  check(R"(["timestamp"])", "'{'");
  check(R"({"timestamp" 0})", "':'");
  check(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": 3})", "array");
  // Lengths and times the replay's arithmetic cannot hold (a length near 2^64 wrapped its
  // block count to 0 and aborted in a reserve; a huge output aborted in a bad_alloc).
  check(R"({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []})",
        "at least 1 token");
  check(R"({"timestamp": 0, "input_length": 18446744073709551615, "output_length": 1,
            "hash_ids": []})",
        "at most 268435456");
  check(R"({"timestamp": 0, "input_length": 100, "output_length": 18446744073709551615,
            "hash_ids": [1]})",
        "at most 268435456");
  check(R"({"timestamp": 18446744073709551615, "input_length": 10, "output_length": 1,
            "hash_ids": [1]})",
        "2^53");
}

TEST(Trace, RefusesTracesOutOfArrivalOrderAndEmptyOnes) {
  std::istringstream in(
      "{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 4, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n");
  auto reqs = parse_trace(in);
  ASSERT_FALSE(reqs.is_ok());
  EXPECT_EQ(reqs.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(reqs.status().message().find("line 3: \"timestamp\" 4 is before"), std::string::npos)
      << reqs.status().message();
  std::istringstream blank("\n  \n");
  EXPECT_EQ(parse_trace(blank).status().code(), ErrorCode::kInvalidArgument);
  const auto dir = std::filesystem::temp_directory_path();
  auto d = load_trace(dir.string());
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("is a directory"), std::string::npos);
}

TEST(Trace, TokensAreDeterministicPerBlockAndPosition) {
  std::istringstream in(kInline);
  auto reqs = parse_trace(in).value();
  const auto t0 = synthesize_tokens(reqs[0]);
  const auto t1 = synthesize_tokens(reqs[1]);
  const auto t3 = synthesize_tokens(reqs[3]);
  ASSERT_EQ(t0.size(), 1200u);
  ASSERT_EQ(t1.size(), 1100u);
  // Equal blocks 0 and 1 give equal tokens; block 2 vs 3 differ.
  EXPECT_TRUE(std::equal(t0.begin(), t0.begin() + 1024, t1.begin()));
  EXPECT_FALSE(std::equal(t0.begin() + 1024, t0.begin() + 1100, t1.begin() + 1024));
  // A partial last block is a prefix of the same block in full.
  EXPECT_TRUE(std::equal(t0.begin(), t0.end(), t3.begin()));
  for (Token t : t3) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<Token>(kTraceVocabulary));
  }
  EXPECT_EQ(trace_token(42, 7), trace_token(42, 7));
  EXPECT_NE(synthesize_tokens(reqs[2]), std::vector<Token>(t0.begin(), t0.begin() + 512));
}

TEST(Trace, InfiniteCacheCeilingCountsLeadingSeenBlocks) {
  std::istringstream in(kInline);
  auto reqs = parse_trace(in).value();
  const HitCeiling c = infinite_cache_ceiling(reqs);
  // r1 hits blocks 0,1 (1024); r2 nothing; r3 hits 0,1,2 (1536): 2560 of 4412.
  EXPECT_EQ(c.input_tokens, 1200u + 1100u + 512u + 1600u);
  EXPECT_EQ(c.hit_tokens, 1024u + 1536u);
  EXPECT_NEAR(c.ratio(), 2560.0 / 4412.0, 1e-12);
}

TEST(Trace, MooncakeFileCeilingIsSixtyFivePercentWhenPresent) {
  std::filesystem::path path;
  if (const char* env = std::getenv("RADIXTIER_TRACE")) {
    path = env;
  } else {
    path = std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "shared" / "traces" /
           "mooncake_synthetic_trace.jsonl";
  }
  if (!std::filesystem::exists(path)) return;  // the file is optional; the inline data ran
  auto reqs = load_trace(path.string());
  ASSERT_TRUE(reqs.is_ok()) << reqs.status().to_string();
  EXPECT_EQ(reqs->size(), 3993u);
  const HitCeiling c = infinite_cache_ceiling(*reqs);
  EXPECT_NEAR(c.ratio() * 100.0, 65.1, 0.2);
  EXPECT_NEAR(double(c.input_tokens) / double(reqs->size()), 15'325, 1);
}

TEST(Trace, MissingFileIsNotFound) {
  EXPECT_EQ(load_trace("/nonexistent/trace.jsonl").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace radixtier::sim
