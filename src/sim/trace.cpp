#include "sim/trace.hpp"

#include <cctype>
#include <fstream>
#include <unordered_set>

namespace radixtier::sim {

namespace {

// A cursor over one line of flat JSON: an object of string keys whose values are unsigned
// integers or arrays of them. Errors carry the line number and the column.
class LineParser {
 public:
  LineParser(std::string_view s, std::size_t line_no) : s_(s), line_(line_no) {}

  Status error(const std::string& what) const {
    return invalid_argument("trace line " + std::to_string(line_) + ", column " +
                            std::to_string(pos_ + 1) + ": " + what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool at_end() {
    skip_ws();
    return pos_ == s_.size();
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  Result<std::string> string() {
    if (!eat('"')) return error("expected '\"'");
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\') return error("escapes are not supported in keys");
      out.push_back(s_[pos_++]);
    }
    if (pos_ == s_.size()) return error("unterminated string");
    ++pos_;
    return out;
  }
  Result<std::uint64_t> number() {
    skip_ws();
    const std::size_t start = pos_;
    std::uint64_t v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      const std::uint64_t digit = static_cast<std::uint64_t>(s_[pos_] - '0');
      if (v > (UINT64_MAX - digit) / 10) return error("number too large");
      v = v * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return error("expected a non-negative integer");
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      return error("expected an integer, got a fraction or exponent");
    return v;
  }
  Result<std::vector<std::uint64_t>> array() {
    if (!eat('[')) return error("expected '['");
    std::vector<std::uint64_t> out;
    if (eat(']')) return out;
    for (;;) {
      auto v = number();
      if (!v) return v.status();
      out.push_back(*v);
      if (eat(']')) return out;
      if (!eat(',')) return error("expected ',' or ']' in array");
    }
  }

 private:
  std::string_view s_;
  std::size_t line_;
  std::size_t pos_ = 0;
};

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Result<TraceRequest> parse_trace_line(std::string_view line, std::size_t line_no,
                                      std::uint32_t block_tokens) {
  LineParser p(line, line_no);
  TraceRequest r;
  bool have_ts = false, have_in = false, have_out = false, have_ids = false;
  if (!p.eat('{')) return p.error("expected '{'");
  if (!p.eat('}')) {
    for (;;) {
      auto key = p.string();
      if (!key) return key.status();
      if (!p.eat(':')) return p.error("expected ':' after key \"" + *key + "\"");
      if (p.peek('[')) {
        auto values = p.array();
        if (!values) return values.status();
        if (*key == "hash_ids") {
          r.hash_ids = std::move(*values);
          have_ids = true;
        } else if (*key == "timestamp" || *key == "input_length" || *key == "output_length") {
          return p.error("\"" + *key + "\" must be a number, not an array");
        }
      } else {
        auto v = p.number();
        if (!v) return v.status();
        if (*key == "timestamp") {
          r.timestamp_ms = *v, have_ts = true;
        } else if (*key == "input_length") {
          r.input_length = *v, have_in = true;
        } else if (*key == "output_length") {
          r.output_length = *v, have_out = true;
        } else if (*key == "hash_ids") {
          return p.error("\"hash_ids\" must be an array");
        }
      }
      if (p.eat('}')) break;
      if (!p.eat(',')) return p.error("expected ',' or '}' after a value");
    }
  }
  if (!p.at_end()) return p.error("unexpected text after the object");
  if (!have_ts) return p.error("missing \"timestamp\"");
  if (!have_in) return p.error("missing \"input_length\"");
  if (!have_out) return p.error("missing \"output_length\"");
  if (!have_ids) return p.error("missing \"hash_ids\"");
  const std::uint64_t blocks = (r.input_length + block_tokens - 1) / block_tokens;
  if (r.hash_ids.size() != blocks)
    return p.error(std::to_string(r.hash_ids.size()) + " hash_ids for input_length " +
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
    out.push_back(std::move(*r));
  }
  return out;
}

Result<std::vector<TraceRequest>> load_trace(const std::string& path, std::uint32_t block_tokens) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open trace file '" + path + "'");
  return parse_trace(in, block_tokens);
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
