// ProgressMeter (see progress.hpp).
#include "sim/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace radixtier::sim {

namespace {

constexpr double kRedrawS = 0.2;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

/// 9 s, 4 min 05 s, 2 h 07 min.
std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(std::llround(s));
  char buf[64];
  if (t < 60) {
    std::snprintf(buf, sizeof buf, "%lld s", t);
  } else if (t < 3600) {
    std::snprintf(buf, sizeof buf, "%lld min %02lld s", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", t / 3600, t % 3600 / 60);
  }
  return buf;
}

std::string rate(std::size_t done, double elapsed_s) {
  const double r = static_cast<double>(done) / elapsed_s;
  return format(r >= 100 ? "%.0f/s" : r >= 10 ? "%.1f/s" : "%.2f/s", r);
}

}  // namespace

ProgressMeter::ProgressMeter(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}

ProgressMeter::~ProgressMeter() {
  finish();
}

bool ProgressMeter::stream_is_terminal(std::FILE* out) {
  return out != nullptr && isatty(fileno(out)) != 0;
}

std::string ProgressMeter::status_line(const std::string& name, std::size_t done, std::size_t total,
                                       const std::string& unit, double elapsed_s) {
  std::string s = name + "  " + std::to_string(done) + "/" + std::to_string(total) + " " + unit;
  if (total > 0) {
    s += " (" + std::to_string(std::min<std::size_t>(done, total) * 100 / total) + "%)";
  }
  if (done > 0 && elapsed_s > 0) {
    s += ", " + rate(done, elapsed_s);
    if (total >= done) {
      const double left = elapsed_s / static_cast<double>(done) * static_cast<double>(total - done);
      s += ", " + duration(left) + " left";
    }
  }
  return s;
}

std::string ProgressMeter::summary_line(const std::string& name, std::size_t done,
                                        std::size_t total, const std::string& unit,
                                        double elapsed_s) {
  std::string s = name + "  " + std::to_string(done) + "/" + std::to_string(total) + " " + unit +
                  " in " + format("%.1f", elapsed_s) + " s";
  if (done > 0 && elapsed_s > 0) s += " (" + rate(done, elapsed_s) + ")";
  return s;
}

void ProgressMeter::phase(std::string name, std::size_t total, std::string unit) {
  finish();
  name_ = std::move(name);
  unit_ = std::move(unit);
  total_ = total;
  done_ = 0;
  active_ = true;
  start_ = Clock::now();
  last_draw_ = start_;
  if (terminal_) draw();
}

void ProgressMeter::update(std::size_t done) {
  if (!active_) return;
  done_ = done;
  if (!terminal_) return;
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_draw_).count() < kRedrawS) return;
  last_draw_ = now;
  draw();
}

void ProgressMeter::note(const std::string& line) {
  clear();
  std::fprintf(out_, "%s\n", line.c_str());
  if (active_ && terminal_) draw();
  std::fflush(out_);
}

void ProgressMeter::finish() {
  if (!active_) return;
  active_ = false;
  const std::string line = summary_line(name_, done_, total_, unit_, elapsed());
  clear();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

double ProgressMeter::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void ProgressMeter::draw() {
  const std::string line = status_line(name_, done_, total_, unit_, elapsed());
  clear();
  std::fprintf(out_, "%s", line.c_str());
  std::fflush(out_);
  drawn_width_ = line.size();
}

void ProgressMeter::clear() {
  if (!terminal_ || drawn_width_ == 0) return;
  std::fprintf(out_, "\r%*s\r", static_cast<int>(drawn_width_), "");
  drawn_width_ = 0;
}

}  // namespace radixtier::sim
