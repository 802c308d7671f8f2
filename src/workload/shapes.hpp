// Workload shapes shared by the demo (tiny model, real bytes) and the simulator (cost model,
// full scale): deterministic token streams and the agent harness's request pattern, so both
// play the same scenario at their own scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier::workload {

/// splitmix64 finaliser: a deterministic, well-mixed 64-bit hash.
std::uint64_t mix(std::uint64_t x);

/// `a` followed by `b`.
std::vector<Token> cat(std::vector<Token> a, const std::vector<Token>& b);

/// n deterministic tokens of stream `seed`.
using TokenStream = std::function<std::vector<Token>(std::uint64_t seed, std::size_t n)>;

struct LabeledRequest {
  std::string label;
  std::vector<Token> prompt;
  std::size_t output = 0;
  double arrival_s = 0;
  bool side = false;  ///< a side request (agent harness): a scenario may run it at a lower priority
};

/// The agent harness of workloads.md: each turn sends the conversation 2-3 times with
/// different tails; from the second turn a side request replays a shorter exact prefix of an
/// earlier, longer prompt; the next turn diverges 44-148 tokens before the previous end and
/// then grows.
struct AgentShape {
  std::size_t system_tokens = 0;         ///< first stream of the conversation
  std::size_t first_message_tokens = 0;  ///< second stream
  int turns = 0;
  double turn_interval_s = 0;
  std::size_t tail_tokens = 0;       ///< tail of a turn's first send
  std::size_t tail_step_tokens = 0;  ///< each further send's tail is this much longer
  std::size_t send_output = 0;
  std::size_t side_output = 0;
  std::size_t diverge_min = 44, diverge_max = 148;
  std::size_t grow_min = 0, grow_max = 0;  ///< tokens the conversation grows per turn
  std::uint64_t seed = 1000;
};

std::vector<LabeledRequest> agent_requests(const AgentShape& shape, const TokenStream& synth);

}  // namespace radixtier::workload
