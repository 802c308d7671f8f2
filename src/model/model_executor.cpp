// ModelExecutor: the tiny model behind the Executor interface.
#include "model/model_executor.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace radixtier::sched {

ModelExecutor::ModelExecutor(const model::TinyHybridModel& model, HostArenas& memory,
                             ModelExecutorOptions options)
    : model_(model), memory_(memory), options_(options) {}

Result<ModelExecutor::Live*> ModelExecutor::find(RequestId request, const char* what) {
  auto it = live_.find(request);
  if (it == live_.end()) {
    return not_found(std::string(what) + ": request " + std::to_string(request) +
                     " has no live state (begin() first)");
  }
  return &it->second;
}

Status ModelExecutor::check_slot(GpuSlotId slot, const char* what) const {
  if (!slot.valid() || slot.value() >= memory_.gpu_slots()) {
    return invalid_argument(std::string(what) + ": snapshot slot out of range");
  }
  if (memory_.snapshot_bytes() != model_.state_bytes()) {
    return invalid_argument(std::string(what) + ": the arenas' snapshot bytes (" +
                            std::to_string(memory_.snapshot_bytes()) +
                            ") differ from the model's state bytes (" +
                            std::to_string(model_.state_bytes()) + ")");
  }
  return Status::ok();
}

Status ModelExecutor::begin(RequestId request, std::optional<GpuSlotId> restore_from) {
  if (live_.contains(request)) {
    return invalid_argument("begin: request " + std::to_string(request) + " already has a state");
  }
  if (restore_from) {
    if (Status s = check_slot(*restore_from, "begin"); !s) return s;
  }
  Live live;
  live.state.resize(model_.state_bytes());
  if (restore_from) {
    // Rule 6: copy the cached snapshot into the request's own state; never run on the slot.
    const auto snap = memory_.gpu_snapshot(*restore_from);
    std::memcpy(live.state.data(), snap.data(), live.state.size());
  } else {
    model_.reset_state(live.state);
  }
  live_.emplace(request, std::move(live));
  return Status::ok();
}

Result<double> ModelExecutor::forward(RequestId request, std::span<const Token> tokens,
                                      std::size_t pos, std::span<const GpuPageId> page_table) {
  return forward_capturing(request, tokens, pos, page_table, {});
}

Result<double> ModelExecutor::forward_capturing(RequestId request, std::span<const Token> tokens,
                                                std::size_t pos,
                                                std::span<const GpuPageId> page_table,
                                                std::span<const StateCapture> captures) {
  auto live = find(request, "forward");
  if (!live) return live.status();
  Live& l = **live;
  if (Status s = check_captures(captures, pos, tokens.size(), capture_granularity()); !s) return s;
  std::vector<model::TinyHybridModel::Capture> into;
  into.reserve(captures.size());
  for (const StateCapture& c : captures) {
    if (Status s = check_slot(c.slot, "forward_capturing"); !s) return s;
    into.push_back({c.position - pos, memory_.gpu_snapshot(c.slot)});
  }
  std::vector<float> logits(model_.vocab());
  const auto t0 = std::chrono::steady_clock::now();
  if (Status s = model_.forward(tokens, pos, page_table, memory_, l.state, logits, into); !s) {
    return s;
  }
  const auto t1 = std::chrono::steady_clock::now();
  l.logits = std::move(logits);
  if (options_.seconds_per_token > 0) {
    return options_.seconds_per_token * static_cast<double>(tokens.size());
  }
  return std::chrono::duration<double>(t1 - t0).count();
}

std::span<const float> ModelExecutor::last_logits(RequestId request) const {
  auto it = live_.find(request);
  if (it == live_.end()) return {};
  return it->second.logits;
}

Result<Token> ModelExecutor::next_token(RequestId request) {
  auto live = find(request, "next_token");
  if (!live) return live.status();
  if ((*live)->logits.empty()) {
    return Status(ErrorCode::kFailedPrecondition, "next_token: no forward() yet");
  }
  return model_.greedy((*live)->logits);
}

Status ModelExecutor::save_snapshot(RequestId request, GpuSlotId slot) {
  auto live = find(request, "save_snapshot");
  if (!live) return live.status();
  if (Status s = check_slot(slot, "save_snapshot"); !s) return s;
  const auto& state = (*live)->state;
  std::memcpy(memory_.gpu_snapshot(slot).data(), state.data(), state.size());
  return Status::ok();
}

Status ModelExecutor::checkpoint(RequestId request) {
  auto live = find(request, "checkpoint");
  if (!live) return live.status();
  (*live)->checkpoint = (*live)->state;
  return Status::ok();
}

Status ModelExecutor::save_checkpoint(RequestId request, GpuSlotId slot) {
  auto live = find(request, "save_checkpoint");
  if (!live) return live.status();
  if (Status s = check_slot(slot, "save_checkpoint"); !s) return s;
  const auto& cp = (*live)->checkpoint;
  if (cp.empty()) {
    return Status(ErrorCode::kFailedPrecondition, "save_checkpoint: no checkpoint() taken");
  }
  std::memcpy(memory_.gpu_snapshot(slot).data(), cp.data(), cp.size());
  return Status::ok();
}

}  // namespace radixtier::sched
