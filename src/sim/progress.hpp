// ProgressMeter: progress of a long run (`radixtier report`, `radixtier sim`) on a stream,
// normally stderr.
//
//   on a terminal   one status line redrawn in place, at most every 0.2 s:
//                     report: scenarios x caches  7/18 runs (39%), 1.4/s, 8 s left
//   otherwise       one line per phase, when it ends (logs stay readable):
//                     report: scenarios x caches  18/18 runs in 12.6 s (1.4/s)
//
// note() prints a line of output above the status line (the status line is redrawn after
// it), so per-run log lines and the meter share the terminal. Not thread-safe: one thread
// drives a run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace radixtier::sim {

class ProgressMeter {
 public:
  /// `terminal`: redraw in place (use stream_is_terminal(out)).
  ProgressMeter(std::FILE* out, bool terminal);
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  static bool stream_is_terminal(std::FILE* out);

  /// Starts a phase of `total` steps counted in `unit` ("runs", "requests"); ends the
  /// previous one.
  void phase(std::string name, std::size_t total, std::string unit);
  /// `done` steps of the current phase are finished.
  void update(std::size_t done);
  /// A line of ordinary output (it ends with no newline).
  void note(const std::string& line);
  /// Ends the current phase: the final status line on a terminal, the phase line otherwise.
  void finish();

  /// "NAME  DONE/TOTAL UNIT (P%), R/s, T left" (rate and time left once measurable).
  static std::string status_line(const std::string& name, std::size_t done, std::size_t total,
                                 const std::string& unit, double elapsed_s);
  /// "NAME  DONE/TOTAL UNIT in S s (R/s)".
  static std::string summary_line(const std::string& name, std::size_t done, std::size_t total,
                                  const std::string& unit, double elapsed_s);

 private:
  using Clock = std::chrono::steady_clock;
  double elapsed() const;
  void draw();
  void clear();

  std::FILE* out_;
  bool terminal_;
  bool active_ = false;
  std::string name_, unit_;
  std::size_t done_ = 0, total_ = 0;
  std::size_t drawn_width_ = 0;
  Clock::time_point start_, last_draw_;
};

}  // namespace radixtier::sim
