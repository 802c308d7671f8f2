// ModelExecutor: the Executor that runs the tiny hybrid model (model/tiny_model.hpp) with its
// K/V in HostArenas' GPU KV pool and its snapshots in HostArenas' GPU snapshot slots, so the
// bytes the cache moves are the model's real bytes.
#pragma once

#include <chrono>
#include <unordered_map>
#include <vector>

#include "model/tiny_model.hpp"
#include "radixtier/scheduler/executor.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier::sched {

struct ModelExecutorOptions {
  /// 0: forward() returns the measured wall-clock seconds. > 0: it returns
  /// tokens x this (a deterministic clock, for reproducible arrival-time scheduling).
  double seconds_per_token = 0.0;
};

class ModelExecutor final : public Executor {
 public:
  /// Both must outlive the executor; the arenas' page and snapshot bytes must match the
  /// model's (forward() rejects a mismatch).
  ModelExecutor(const model::TinyHybridModel& model, HostArenas& memory,
                ModelExecutorOptions options = {});

  std::size_t state_bytes() const override { return model_.state_bytes(); }
  Status begin(RequestId request, std::optional<GpuSlotId> restore_from) override;
  Result<double> forward(RequestId request, std::span<const Token> tokens, std::size_t pos,
                         std::span<const GpuPageId> page_table) override;
  /// The tiny model runs token by token: it can capture after any token.
  std::size_t capture_granularity() const override { return 1; }
  Result<double> forward_capturing(RequestId request, std::span<const Token> tokens,
                                   std::size_t pos, std::span<const GpuPageId> page_table,
                                   std::span<const StateCapture> captures) override;
  std::span<const float> last_logits(RequestId request) const override;
  Result<Token> next_token(RequestId request) override;
  Status save_snapshot(RequestId request, GpuSlotId slot) override;
  Status checkpoint(RequestId request) override;
  Status save_checkpoint(RequestId request, GpuSlotId slot) override;
  void end(RequestId request) override { live_.erase(request); }

  std::size_t live_requests() const { return live_.size(); }

 private:
  struct Live {
    std::vector<std::byte> state;       ///< the request's own live recurrent state
    std::vector<std::byte> checkpoint;  ///< empty until checkpoint()
    std::vector<float> logits;          ///< empty until the first forward()
  };

  Result<Live*> find(RequestId request, const char* what);
  Status check_slot(GpuSlotId slot, const char* what) const;

  const model::TinyHybridModel& model_;
  HostArenas& memory_;
  ModelExecutorOptions options_;
  std::unordered_map<RequestId, Live> live_;
};

}  // namespace radixtier::sched
