// Minimal SVG charts for the simulator report: grouped bars and lines, no dependencies.
#pragma once

#include <string>
#include <vector>

namespace radixtier::sim::svg {

struct Series {
  std::string name;
  std::vector<double> values;  ///< one per category (bars) or per x (lines)
  bool dashed = false;
};

struct Chart {
  std::string title, x_label, y_label;
  bool log_y = false;  ///< values <= 0 are drawn at the axis floor
  int width = 760, height = 380;
};

/// Grouped bars: one group per category, one bar per series.
std::string bar_chart(const Chart& chart, const std::vector<std::string>& categories,
                      const std::vector<Series>& series);

/// Lines over categorical x positions (evenly spaced, labelled by `x_labels`).
std::string line_chart(const Chart& chart, const std::vector<std::string>& x_labels,
                       const std::vector<Series>& series);

}  // namespace radixtier::sim::svg
