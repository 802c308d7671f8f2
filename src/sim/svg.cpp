// Minimal SVG charts (see svg.hpp).
#include "sim/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace radixtier::sim::svg {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#7f7f7f", "#2ca02c",
                                   "#ff7f0e", "#9467bd", "#8c564b", "#17becf"};
constexpr int kLeft = 78, kRight = 160, kTop = 36, kBottom = 64;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') {
      o += "&lt;";
    } else if (c == '>') {
      o += "&gt;";
    } else if (c == '&') {
      o += "&amp;";
    } else {
      o += c;
    }
  }
  return o;
}

std::string fmt(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

/// Maps values to pixels on the y axis and draws its ticks.
struct YAxis {
  double lo = 0, hi = 1;
  bool log = false;
  int top = 0, bottom = 0;

  YAxis(const Chart& c, const std::vector<Series>& series) : log(c.log_y) {
    top = kTop;
    bottom = c.height - kBottom;
    double mx = 0, mn = 1e300;
    for (const auto& s : series) {
      for (double v : s.values) {
        mx = std::max(mx, v);
        if (v > 0) mn = std::min(mn, v);
      }
    }
    if (mx <= 0) mx = 1;
    if (log) {
      if (mn > mx) mn = mx;
      lo = std::pow(10.0, std::floor(std::log10(mn)));
      hi = std::pow(10.0, std::ceil(std::log10(mx)));
      if (hi <= lo) hi = lo * 10;
    } else {
      const double step = nice_step(mx / 5);
      hi = std::ceil(mx / step) * step;
      lo = 0;
    }
  }
  static double nice_step(double raw) {
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
      if (m * p >= raw) return m * p;
    }
    return 10 * p;
  }
  double y(double v) const {
    double f = 0;
    if (log) {
      f = v <= lo ? 0 : (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    } else {
      f = (v - lo) / (hi - lo);
    }
    f = std::clamp(f, 0.0, 1.0);
    return bottom - f * (bottom - top);
  }
  void draw(std::ostringstream& o, int x0, int x1) const {
    std::vector<double> ticks;
    if (log) {
      for (double t = lo; t <= hi * 1.0001; t *= 10) ticks.push_back(t);
    } else {
      const double step = nice_step(hi / 5);
      for (double t = 0; t <= hi * 1.0001; t += step) ticks.push_back(t);
    }
    for (double t : ticks) {
      const double yy = y(t);
      o << "<line x1='" << x0 << "' y1='" << yy << "' x2='" << x1 << "' y2='" << yy
        << "' stroke='#e0e0e0'/>\n";
      o << "<text x='" << x0 - 6 << "' y='" << yy + 4 << "' text-anchor='end'>" << fmt(t)
        << "</text>\n";
    }
  }
};

void frame(std::ostringstream& o, const Chart& c) {
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << c.width << "' height='" << c.height
    << "' font-family='sans-serif' font-size='11'>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='" << c.width / 2 << "' y='20' text-anchor='middle' font-size='14'>" << esc(c.title)
    << "</text>\n"
    << "<text x='" << (kLeft + c.width - kRight) / 2 << "' y='" << c.height - 12
    << "' text-anchor='middle'>" << esc(c.x_label) << "</text>\n"
    << "<text transform='translate(16," << c.height / 2 << ") rotate(-90)' text-anchor='middle'>"
    << esc(c.y_label) << "</text>\n";
}

void legend(std::ostringstream& o, const Chart& c, const std::vector<Series>& series, bool lines) {
  const int x = c.width - kRight + 14;
  for (std::size_t i = 0; i < series.size(); ++i) {
    const int y = kTop + 8 + static_cast<int>(i) * 18;
    const char* color = kColors[i % 8];
    if (lines) {
      o << "<line x1='" << x << "' y1='" << y << "' x2='" << x + 18 << "' y2='" << y << "' stroke='"
        << color << "' stroke-width='2'" << (series[i].dashed ? " stroke-dasharray='5,3'" : "")
        << "/>\n";
    } else {
      o << "<rect x='" << x << "' y='" << y - 6 << "' width='14' height='10' fill='" << color
        << "'/>\n";
    }
    o << "<text x='" << x + 24 << "' y='" << y + 4 << "'>" << esc(series[i].name) << "</text>\n";
  }
}

void axes(std::ostringstream& o, const Chart& c) {
  const int bottom = c.height - kBottom, right = c.width - kRight;
  o << "<line x1='" << kLeft << "' y1='" << kTop << "' x2='" << kLeft << "' y2='" << bottom
    << "' stroke='black'/>\n<line x1='" << kLeft << "' y1='" << bottom << "' x2='" << right
    << "' y2='" << bottom << "' stroke='black'/>\n";
}

}  // namespace

std::string bar_chart(const Chart& c, const std::vector<std::string>& categories,
                      const std::vector<Series>& series) {
  std::ostringstream o;
  frame(o, c);
  const YAxis ya(c, series);
  const int right = c.width - kRight, bottom = c.height - kBottom;
  ya.draw(o, kLeft, right);
  const double group =
      static_cast<double>(right - kLeft) / std::max<std::size_t>(1, categories.size());
  const double bar = group * 0.8 / std::max<std::size_t>(1, series.size());
  for (std::size_t k = 0; k < categories.size(); ++k) {
    const double gx = kLeft + group * static_cast<double>(k) + group * 0.1;
    for (std::size_t i = 0; i < series.size(); ++i) {
      const double v = k < series[i].values.size() ? series[i].values[k] : 0;
      const double yy = ya.y(v);
      o << "<rect x='" << gx + bar * static_cast<double>(i) << "' y='" << yy << "' width='"
        << bar * 0.92 << "' height='" << bottom - yy << "' fill='" << kColors[i % 8] << "'><title>"
        << esc(series[i].name) << " " << esc(categories[k]) << ": " << fmt(v)
        << "</title></rect>\n";
    }
    const double cx = kLeft + group * (static_cast<double>(k) + 0.5);
    o << "<text x='" << cx << "' y='" << bottom + 14 << "' text-anchor='middle'>"
      << esc(categories[k]) << "</text>\n";
  }
  axes(o, c);
  legend(o, c, series, false);
  o << "</svg>\n";
  return o.str();
}

std::string line_chart(const Chart& c, const std::vector<std::string>& x_labels,
                       const std::vector<Series>& series) {
  std::ostringstream o;
  frame(o, c);
  const YAxis ya(c, series);
  const int right = c.width - kRight, bottom = c.height - kBottom;
  ya.draw(o, kLeft, right);
  const std::size_t n = std::max<std::size_t>(1, x_labels.size());
  auto x = [&](std::size_t i) {
    return n == 1 ? (kLeft + right) / 2.0
                  : kLeft + 30 + (right - kLeft - 60) * static_cast<double>(i) / double(n - 1);
  };
  for (std::size_t i = 0; i < x_labels.size(); ++i) {
    o << "<text x='" << x(i) << "' y='" << bottom + 14 << "' text-anchor='middle'>"
      << esc(x_labels[i]) << "</text>\n";
  }
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* color = kColors[s % 8];
    o << "<polyline fill='none' stroke='" << color << "' stroke-width='2'"
      << (series[s].dashed ? " stroke-dasharray='5,3'" : "") << " points='";
    for (std::size_t i = 0; i < series[s].values.size() && i < n; ++i) {
      o << x(i) << "," << ya.y(series[s].values[i]) << " ";
    }
    o << "'/>\n";
    for (std::size_t i = 0; i < series[s].values.size() && i < n; ++i) {
      o << "<circle cx='" << x(i) << "' cy='" << ya.y(series[s].values[i]) << "' r='3' fill='"
        << color << "'><title>" << esc(series[s].name) << ": " << fmt(series[s].values[i])
        << "</title></circle>\n";
    }
  }
  axes(o, c);
  legend(o, c, series, true);
  o << "</svg>\n";
  return o.str();
}

}  // namespace radixtier::sim::svg
