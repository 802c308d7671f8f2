#include "sim/trace.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

namespace radixtier::sim {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Result<TraceRequest> parse_trace_line(std::string_view line, std::size_t line_no,
                                      std::uint32_t block_tokens) {
  auto error = [&](const std::string& what) {
    return invalid_argument("trace line " + std::to_string(line_no) + ": " + what);
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("expected end of input") != std::string::npos) {
      return error("unexpected text after the object (column " + std::to_string(e.byte) + ")");
    }
    return error("not valid JSON: " + what);
  }
  if (!j.is_object()) return error(std::string("expected an object ('{'), got ") + j.type_name());
  auto integer = [&](const std::string& what, const nlohmann::json& v) -> Result<std::uint64_t> {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_float())
      return error(what + ": expected an integer, got a fraction or exponent");
    return error(what + ": expected a non-negative integer, got " + v.dump());
  };
  TraceRequest r;
  for (const auto& [key, out] :
       {std::pair<const char*, std::uint64_t*>{"timestamp", &r.timestamp_ms},
        {"input_length", &r.input_length},
        {"output_length", &r.output_length}}) {
    auto it = j.find(key);
    if (it == j.end()) return error(std::string("missing \"") + key + "\"");
    if (it->is_array()) return error(std::string("\"") + key + "\" must be a number, not an array");
    auto v = integer(std::string("\"") + key + "\"", *it);
    if (!v) return v.status();
    *out = *v;
  }
  if (r.input_length == 0) return error("\"input_length\" must be at least 1 token");
  // Bounds far above any model's context, so lengths and times keep their meaning in the
  // simulator's arithmetic (a length near 2^64 wrapped its block count; a time beyond 2^53 ms
  // loses milliseconds in a double).
  if (r.input_length > kMaxTraceTokens || r.output_length > kMaxTraceTokens ||
      r.input_length + r.output_length > kMaxTraceTokens) {
    return error("\"input_length\" + \"output_length\" is " + std::to_string(r.input_length) +
                 " + " + std::to_string(r.output_length) + " tokens; a request holds at most " +
                 std::to_string(kMaxTraceTokens));
  }
  if (r.timestamp_ms > kMaxTraceTimestampMs) {
    return error("\"timestamp\" is " + std::to_string(r.timestamp_ms) + " ms, beyond 2^53 ms");
  }
  auto ids = j.find("hash_ids");
  if (ids == j.end()) return error("missing \"hash_ids\"");
  if (!ids->is_array()) return error("\"hash_ids\" must be an array");
  r.hash_ids.reserve(ids->size());
  for (std::size_t i = 0; i < ids->size(); ++i) {
    auto v = integer("\"hash_ids\"[" + std::to_string(i) + "]", (*ids)[i]);
    if (!v) return v.status();
    r.hash_ids.push_back(*v);
  }
  const std::uint64_t blocks = (r.input_length + block_tokens - 1) / block_tokens;
  if (r.hash_ids.size() != blocks)
    return error(std::to_string(r.hash_ids.size()) + " hash_ids for input_length " +
                 std::to_string(r.input_length) + " (" + std::to_string(blocks) + " blocks of " +
                 std::to_string(block_tokens) + " expected)");
  return r;
}

Result<std::vector<TraceRequest>> parse_trace(std::istream& in, std::uint32_t block_tokens) {
  std::vector<TraceRequest> out;
  std::string line;
  for (std::size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    auto r = parse_trace_line(line, line_no, block_tokens);
    if (!r) return r.status();
    // Arrival order: the replay submits requests in file order and measures the span from
    // the first line to the last (an unsorted trace ran as one idle instance).
    if (!out.empty() && r->timestamp_ms < out.back().timestamp_ms) {
      return invalid_argument("trace line " + std::to_string(line_no) + ": \"timestamp\" " +
                              std::to_string(r->timestamp_ms) + " is before the previous " +
                              "request's " + std::to_string(out.back().timestamp_ms) +
                              " (a trace lists requests in arrival order: sort it by timestamp)");
    }
    out.push_back(std::move(*r));
  }
  if (in.bad()) return invalid_argument("the trace could not be read (an I/O error)");
  if (out.empty()) return invalid_argument("the trace has no requests");
  return out;
}

Result<std::vector<TraceRequest>> load_trace(const std::string& path, std::uint32_t block_tokens) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return invalid_argument("trace file '" + path + "' is a directory");
  std::ifstream in(path);
  if (!in) return not_found("cannot open trace file '" + path + "'");
  auto trace = parse_trace(in, block_tokens);
  if (!trace)
    return Status(trace.status().code(), "trace file '" + path + "': " + trace.status().message());
  return trace;
}

Token trace_token(std::uint64_t hash_id, std::uint32_t position) {
  const std::uint64_t h = splitmix64(hash_id * 0x100000001B3ull ^ splitmix64(position));
  return static_cast<Token>(h % kTraceVocabulary);
}

std::vector<Token> synthesize_tokens(const TraceRequest& request, std::uint32_t block_tokens) {
  std::vector<Token> out;
  out.reserve(request.input_length);
  for (std::uint64_t i = 0; i < request.input_length; ++i) {
    const std::uint64_t block = i / block_tokens;
    if (block >= request.hash_ids.size()) break;  // malformed request: stop at its last id
    out.push_back(
        trace_token(request.hash_ids[block], static_cast<std::uint32_t>(i % block_tokens)));
  }
  return out;
}

HitCeiling infinite_cache_ceiling(std::span<const TraceRequest> requests,
                                  std::uint32_t block_tokens) {
  HitCeiling c;
  std::unordered_set<std::uint64_t> seen;
  for (const TraceRequest& r : requests) {
    c.input_tokens += r.input_length;
    for (std::size_t b = 0; b < r.hash_ids.size(); ++b) {
      if (!seen.contains(r.hash_ids[b])) break;
      c.hit_tokens += std::min<std::uint64_t>(block_tokens, r.input_length - b * block_tokens);
    }
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
  }
  return c;
}

}  // namespace radixtier::sim
