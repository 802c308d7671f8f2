// CostExecutor: modeled seconds instead of compute (see cost_executor.hpp).
#include "sim/cost_executor.hpp"

#include <string>

namespace radixtier::sim {

namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

CostExecutor::CostExecutor(const HardwarePreset& hw, std::size_t state_bytes,
                           CostExecutorOptions options)
    : hw_(hw), state_bytes_(state_bytes), options_(options) {
  if (options_.decode_batch == 0) options_.decode_batch = 1;
}

Token CostExecutor::synth_token(Token prev, std::size_t pos) {
  const std::uint64_t h =
      splitmix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(prev)) << 40 ^ pos);
  return static_cast<Token>(h % kVocabulary);
}

std::vector<Token> CostExecutor::continuation(std::vector<Token> prompt, std::size_t n) {
  prompt.reserve(prompt.size() + n);
  for (std::size_t i = 0; i < n && !prompt.empty(); ++i) {
    prompt.push_back(synth_token(prompt.back(), prompt.size()));
  }
  return prompt;
}

Result<CostExecutor::Live*> CostExecutor::find(sched::RequestId request, const char* what) {
  auto it = live_.find(request);
  if (it == live_.end()) {
    return not_found(std::string(what) + ": request " + std::to_string(request) +
                     " has no live state (begin() first)");
  }
  return &it->second;
}

Status CostExecutor::check_slot(GpuSlotId slot, const char* what) const {
  if (!slot.valid() || (options_.gpu_slots != 0 && slot.value() >= options_.gpu_slots)) {
    return invalid_argument(std::string(what) + ": snapshot slot out of range");
  }
  return Status::ok();
}

Status CostExecutor::begin(sched::RequestId request, std::optional<GpuSlotId> restore_from) {
  if (live_.contains(request)) {
    return invalid_argument("begin: request " + std::to_string(request) + " already has a state");
  }
  if (restore_from) {
    if (Status s = check_slot(*restore_from, "begin"); !s) return s;
  }
  live_.emplace(request, Live{});
  return Status::ok();
}

Result<double> CostExecutor::forward(sched::RequestId request, std::span<const Token> tokens,
                                     std::size_t pos, std::span<const GpuPageId> page_table) {
  return forward_capturing(request, tokens, pos, page_table, {});
}

Result<double> CostExecutor::forward_capturing(sched::RequestId request,
                                               std::span<const Token> tokens, std::size_t pos,
                                               std::span<const GpuPageId> page_table,
                                               std::span<const sched::StateCapture> captures) {
  auto live = find(request, "forward");
  if (!live) return live.status();
  Live& l = **live;
  if (tokens.empty()) return invalid_argument("forward: no tokens");
  if (Status s = sched::check_captures(captures, pos, tokens.size(), kCaptureGranularity); !s) {
    return s;
  }
  if (!captures.empty() && l.decoding) return invalid_argument("forward: a capture in decode");
  for (const sched::StateCapture& c : captures) {
    if (Status s = check_slot(c.slot, "forward_capturing"); !s) return s;
  }
  if (l.any && pos != l.pos) {
    return invalid_argument("forward: position " + std::to_string(pos) +
                            " does not continue the live state at " + std::to_string(l.pos));
  }
  if (page_table.empty()) return invalid_argument("forward: empty page table");
  double secs = 0;
  if (l.decoding) {
    secs = options_.decode_step_s / static_cast<double>(options_.decode_batch) *
           static_cast<double>(tokens.size());
    decode_s_ += secs;
  } else {
    secs = prefill_seconds(hw_, static_cast<double>(pos), static_cast<double>(pos + tokens.size()));
    prefill_s_ += secs;
  }
  l.pos = pos + tokens.size();
  l.last = tokens.back();
  l.any = true;
  captures_ += captures.size();
  return secs;
}

Result<Token> CostExecutor::next_token(sched::RequestId request) {
  auto live = find(request, "next_token");
  if (!live) return live.status();
  Live& l = **live;
  if (!l.any) return Status(ErrorCode::kFailedPrecondition, "next_token: no forward() yet");
  l.decoding = true;  // every later forward() runs output tokens
  return synth_token(l.last, l.pos);
}

Status CostExecutor::save_snapshot(sched::RequestId request, GpuSlotId slot) {
  if (auto live = find(request, "save_snapshot"); !live) return live.status();
  return check_slot(slot, "save_snapshot");
}

Status CostExecutor::checkpoint(sched::RequestId request) {
  auto live = find(request, "checkpoint");
  if (!live) return live.status();
  (**live).checkpoint = true;
  return Status::ok();
}

Status CostExecutor::save_checkpoint(sched::RequestId request, GpuSlotId slot) {
  auto live = find(request, "save_checkpoint");
  if (!live) return live.status();
  if (!(**live).checkpoint) {
    return Status(ErrorCode::kFailedPrecondition, "save_checkpoint: no checkpoint taken");
  }
  return check_slot(slot, "save_checkpoint");
}

}  // namespace radixtier::sim
