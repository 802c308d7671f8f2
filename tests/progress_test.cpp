// ProgressMeter: the status and phase lines, and one line per phase off a terminal.
#include "sim/progress.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace radixtier::sim {
namespace {

TEST(Progress, StatusLineHasDoneTotalRateAndTimeLeft) {
  EXPECT_EQ(ProgressMeter::status_line("report: trace", 3, 12, "runs", 6.0),
            "report: trace  3/12 runs (25%), 0.50/s, 18 s left");
  EXPECT_EQ(ProgressMeter::status_line("sim trace/node", 2000, 23608, "requests", 10.0),
            "sim trace/node  2000/23608 requests (8%), 200/s, 1 min 48 s left");
  EXPECT_EQ(ProgressMeter::status_line("p", 0, 5, "runs", 1.0), "p  0/5 runs (0%)");
  EXPECT_EQ(ProgressMeter::status_line("p", 1, 1000, "runs", 30.0),
            "p  1/1000 runs (0%), 0.03/s, 8 h 19 min left");
}

TEST(Progress, SummaryLine) {
  EXPECT_EQ(ProgressMeter::summary_line("report: policies", 108, 108, "runs", 54.0),
            "report: policies  108/108 runs in 54.0 s (2.00/s)");
}

TEST(Progress, OffATerminalOneLinePerPhaseAndNotesPassThrough) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressMeter m(f, /*terminal=*/false);
    m.phase("a", 3, "runs");
    for (std::size_t i = 1; i <= 3; ++i) m.update(i);
    m.note("a run finished");
    m.phase("b", 2, "runs");  // ends "a"
    m.update(2);
  }  // the destructor ends "b"
  std::rewind(f);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f) != nullptr) text += buf;
  std::fclose(f);
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.rfind("a run finished\na  3/3 runs in ", 0), 0u) << text;
  EXPECT_NE(text.find("\nb  2/2 runs in "), std::string::npos) << text;
}

TEST(Progress, OnATerminalTheStatusLineIsRedrawnInPlace) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressMeter m(f, /*terminal=*/true);
    m.phase("a", 2, "runs");
    m.note("line");
    m.update(2);
  }
  std::rewind(f);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f) != nullptr) text += buf;
  std::fclose(f);
  EXPECT_NE(text.find("a  0/2 runs (0%)"), std::string::npos) << text;
  EXPECT_NE(text.find("\rline\n"), std::string::npos) << text;
  EXPECT_NE(text.find("a  2/2 runs in "), std::string::npos) << text;
}

}  // namespace
}  // namespace radixtier::sim
