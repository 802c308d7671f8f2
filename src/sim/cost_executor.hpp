// CostExecutor: the Executor a simulation plugs into the reference Scheduler. It computes
// nothing and holds no bytes: forward() returns the modeled seconds of the chunk, the
// snapshot/checkpoint calls only check their arguments, next_token() synthesizes a token.
//
//   prefill chunk [pos, pos + n), n > 1 or the request still in its prompt:
//       prefill_seconds(hw, pos, pos + n)          (workloads.md: a n + (b/2)(L1^2 - L0^2))
//   decode token (one token after the prompt):
//       decode_step_s / decode_batch               (a batched decode step of decode_batch
//                                                   requests costs decode_step_s; the
//                                                   scheduler's virtual clock runs requests one
//                                                   after another, so each pays its share)
//   captures (forward_capturing): at 64-token sub-chunks, as a chunked GDN kernel keeps its
//       states (FLA_CHUNK_SIZE); free on the clock, as save_snapshot() is: a device copy of
//       one state (Qwen3-Next's 77 MB at 4.8 TB/s: 16 us) next to seconds of prefill
//   next token after position p with previous token t:  synth_token(t, p)  (deterministic,
//       so a scenario can precompute what a turn's output will be: continuation())
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "radixtier/scheduler/executor.hpp"
#include "sim/cost_model.hpp"

namespace radixtier::sim {

struct CostExecutorOptions {
  /// Seconds of one batched decode step (this project's assumption: 25 ms, 40 tokens/s per
  /// stream, for both hardware presets; workloads.md publishes no decode speed).
  double decode_step_s = 0.025;
  /// Requests sharing one decode step (the scheduler's max_running).
  std::size_t decode_batch = 1;
  /// GPU snapshot slots (ids checked against it); 0: unchecked.
  std::uint32_t gpu_slots = 0;
};

class CostExecutor final : public sched::Executor {
 public:
  CostExecutor(const HardwarePreset& hw, std::size_t state_bytes, CostExecutorOptions options = {});

  std::size_t state_bytes() const override { return state_bytes_; }
  Status begin(sched::RequestId request, std::optional<GpuSlotId> restore_from) override;
  Result<double> forward(sched::RequestId request, std::span<const Token> tokens, std::size_t pos,
                         std::span<const GpuPageId> page_table) override;
  /// FLA's chunk size: a chunked GDN kernel computes the state at every 64-token sub-chunk.
  static constexpr std::size_t kCaptureGranularity = 64;
  std::size_t capture_granularity() const override { return kCaptureGranularity; }
  Result<double> forward_capturing(sched::RequestId request, std::span<const Token> tokens,
                                   std::size_t pos, std::span<const GpuPageId> page_table,
                                   std::span<const sched::StateCapture> captures) override;
  std::span<const float> last_logits(sched::RequestId) const override { return {}; }
  Result<Token> next_token(sched::RequestId request) override;
  Status save_snapshot(sched::RequestId request, GpuSlotId slot) override;
  Status checkpoint(sched::RequestId request) override;
  Status save_checkpoint(sched::RequestId request, GpuSlotId slot) override;
  void end(sched::RequestId request) override { live_.erase(request); }
  /// reload_seconds() of the copies waited for: a wait inside alloc_pages starts from the
  /// submission (the cache submits and waits at once), so the whole copy is on the clock.
  double copy_wait_seconds(std::uint64_t copies, std::uint64_t bytes) const override {
    return reload_seconds(hw_, copies, bytes);
  }
  /// disk_write_seconds() of the store writes waited for (one I/O cost per wait), for the
  /// same reason.
  double store_wait_seconds(std::uint64_t waits, std::uint64_t bytes) const override {
    return disk_write_seconds(hw_, waits, bytes);
  }

  /// Tokens are drawn from [0, kVocabulary) (Qwen3's vocabulary size).
  static constexpr std::uint32_t kVocabulary = 151'936;
  /// The token the executor emits after position `pos` - 1 held `prev` (pos = tokens so far).
  static Token synth_token(Token prev, std::size_t pos);
  /// `prompt` followed by the `n` tokens the executor will generate for it.
  static std::vector<Token> continuation(std::vector<Token> prompt, std::size_t n);

  /// Modeled seconds of every forward() so far, split by kind.
  double prefill_seconds_total() const { return prefill_s_; }
  double decode_seconds_total() const { return decode_s_; }
  std::size_t live_requests() const { return live_.size(); }
  /// States captured inside forwards so far.
  std::uint64_t captures() const { return captures_; }

 private:
  struct Live {
    std::size_t pos = 0;    ///< tokens whose K/V exist (the live state's position)
    Token last = 0;         ///< last token forwarded
    bool any = false;       ///< forward() ran at least once
    bool decoding = false;  ///< next_token() was asked: later forwards are output tokens
    bool checkpoint = false;
  };
  Result<Live*> find(sched::RequestId request, const char* what);
  Status check_slot(GpuSlotId slot, const char* what) const;

  HardwarePreset hw_;
  std::size_t state_bytes_;
  CostExecutorOptions options_;
  std::unordered_map<sched::RequestId, Live> live_;
  double prefill_s_ = 0, decode_s_ = 0;
  std::uint64_t captures_ = 0;
};

}  // namespace radixtier::sim
