// Mooncake-format traces: one flat JSON object per line,
//   {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [id, ...]}
// one hash id per 512-token block (equal ids mean equal blocks; the last block may be
// partial). Tokens are synthesized deterministically from (hash id, position in block), so
// equal blocks give equal tokens and different blocks differ.
#pragma once

#include <cstdint>
#include <istream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"

namespace radixtier::sim {

inline constexpr std::uint32_t kTraceBlockTokens = 512;
inline constexpr std::uint32_t kTraceVocabulary = 151'936;  ///< Qwen3 vocabulary size
/// A request's prompt and output together, at most (far above any context a model has).
inline constexpr std::uint64_t kMaxTraceTokens = std::uint64_t{1} << 28;
/// A timestamp (ms), at most: exact as a double.
inline constexpr std::uint64_t kMaxTraceTimestampMs = std::uint64_t{1} << 53;

struct TraceRequest {
  std::uint64_t timestamp_ms = 0;
  std::uint64_t input_length = 0;
  std::uint64_t output_length = 0;
  std::vector<std::uint64_t> hash_ids;
};

/// Parses one line (nlohmann-json); errors name `line_no` (1-based) and what is wrong. Unknown
/// keys are ignored; the four keys above are required non-negative integers (hash_ids: an
/// array of them) and hash_ids must hold exactly ceil(input_length / block_tokens) ids.
Result<TraceRequest> parse_trace_line(std::string_view line, std::size_t line_no,
                                      std::uint32_t block_tokens = kTraceBlockTokens);
/// Parses every non-blank line; stops at the first error.
Result<std::vector<TraceRequest>> parse_trace(std::istream& in,
                                              std::uint32_t block_tokens = kTraceBlockTokens);
Result<std::vector<TraceRequest>> load_trace(const std::string& path,
                                             std::uint32_t block_tokens = kTraceBlockTokens);

/// The token at `position` of the block with `hash_id`: in [0, kTraceVocabulary).
Token trace_token(std::uint64_t hash_id, std::uint32_t position);
/// The request's input_length prompt tokens.
std::vector<Token> synthesize_tokens(const TraceRequest& request,
                                     std::uint32_t block_tokens = kTraceBlockTokens);

struct HitCeiling {
  std::uint64_t hit_tokens = 0;
  std::uint64_t input_tokens = 0;
  double ratio() const {
    return input_tokens == 0 ? 0.0
                             : static_cast<double>(hit_tokens) / static_cast<double>(input_tokens);
  }
};

/// An infinite prefix cache at block granularity: a request hits the leading blocks whose
/// ids any earlier request had (a partial last block counts its own tokens).
HitCeiling infinite_cache_ceiling(std::span<const TraceRequest> requests,
                                  std::uint32_t block_tokens = kTraceBlockTokens);

}  // namespace radixtier::sim
