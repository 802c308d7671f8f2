#include "workload/shapes.hpp"

namespace radixtier::workload {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<Token> cat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<LabeledRequest> agent_requests(const AgentShape& s, const TokenStream& synth) {
  std::vector<LabeledRequest> out;
  std::uint64_t seed = s.seed;
  std::vector<Token> conv =
      cat(synth(seed, s.system_tokens), synth(seed + 1, s.first_message_tokens));
  seed += 2;
  std::vector<std::vector<Token>> earlier;
  for (int turn = 0; turn < s.turns; ++turn) {
    const double at = s.turn_interval_s * turn;
    const std::string name = "turn " + std::to_string(turn + 1);
    const int sends = turn % 2 == 0 ? 3 : 2;
    for (int k = 0; k < sends; ++k) {
      auto p = cat(conv, synth(seed++, s.tail_tokens + s.tail_step_tokens * std::size_t(k)));
      out.push_back({name + " send " + std::to_string(k + 1), p, s.send_output, at});
      earlier.push_back(std::move(p));
    }
    if (turn > 0) {  // a side request: an exact prefix of an earlier, longer prompt
      const auto& src = earlier[mix(seed) % (earlier.size() - std::size_t(sends))];
      const std::size_t len = src.size() / 2 + mix(seed + 1) % (src.size() / 2);
      out.push_back(
          {name + " side", {src.begin(), src.begin() + len}, s.side_output, at + 1.0, true});
      ++seed;
    }
    const std::size_t diverge = s.diverge_min + mix(seed++) % (s.diverge_max - s.diverge_min + 1);
    conv.resize(conv.size() - diverge);
    const std::size_t grow = s.grow_min + mix(seed) % (s.grow_max - s.grow_min + 1);
    conv = cat(std::move(conv), synth(seed++, grow));
  }
  return out;
}

}  // namespace radixtier::workload
