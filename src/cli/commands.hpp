// The subcommands of the `radixtier` tool, on CLI11. A command file registers itself at static
// initialisation, so adding one (src/cli/sim_command.cpp, report_command.cpp, ...) never
// touches main.cpp:
//
//   static radixtier::cli::CommandRegistrar kSim{"sim", "replay a workload in the simulator",
//                                                &setup_sim};
//
// main() gives each command its CLI11 subcommand; the setup function declares the options
// there (so every subcommand has the same --help, validation and error messages) and returns
// the function that runs once the command line has parsed.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::cli {

using CommandRun = std::function<int()>;
using CommandSetup = CommandRun (*)(CLI::App& sub);

struct Command {
  std::string name;
  std::string help;  ///< one line
  CommandSetup setup;
};

/// Every registered command, in registration order (main sorts them by name for --help).
inline std::vector<Command>& commands() {
  static std::vector<Command> registry;
  return registry;
}

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandSetup setup) {
    commands().push_back(Command{std::move(name), std::move(help), setup});
  }
};

/// A CLI11 check that accepts what `parse` (text -> Result<T>) accepts and fails with its
/// message otherwise.
template <class Parse>
CLI::Validator parsed_by(Parse parse, std::string description) {
  return CLI::Validator(
      [parse](std::string& text) {
        auto r = parse(text);
        return r.is_ok() ? std::string() : r.status().message();
      },
      std::move(description));
}

namespace detail {

/// `text` as a finite number >= 0; nothing when it is not one.
inline std::optional<double> finite_non_negative(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= 0 && std::isfinite(v))) return std::nullopt;
  return v;
}

/// `text` as a count (digits only, within 64 bits); nothing when it is not one.
inline std::optional<unsigned long long> count_of(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0) return std::nullopt;
  return v;
}

inline std::string shown(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace detail

/// A CLI11 check for a finite number >= 0.
inline CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& text) {
        return detail::finite_non_negative(text) ? std::string()
                                                 : "'" + text + "' is not a finite number >= 0";
      },
      ">=0");
}

/// A CLI11 check for a finite number in [0, max].
inline CLI::Validator number_up_to(double max) {
  return CLI::Validator(
      [max](std::string& text) {
        const auto v = detail::finite_non_negative(text);
        if (!v) return "'" + text + "' is not a finite number >= 0";
        return *v <= max ? std::string() : "'" + text + "' is more than " + detail::shown(max);
      },
      "[0, " + detail::shown(max) + "]");
}

/// A CLI11 check for a count (digits only) of at least `min`.
inline CLI::Validator count_at_least(unsigned long long min) {
  return CLI::Validator(
      [min](std::string& text) {
        const auto v = detail::count_of(text);
        if (!v) return "'" + text + "' is not a count";
        return *v >= min ? std::string() : "'" + text + "' is less than " + std::to_string(min);
      },
      min == 0 ? "COUNT" : "COUNT>=" + std::to_string(min));
}

/// A CLI11 check for a count (digits only) in [min, max].
inline CLI::Validator count_in(unsigned long long min, unsigned long long max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        const auto v = detail::count_of(text);
        return v && *v >= min && *v <= max ? std::string()
                                           : "'" + text + "' is not in [" + std::to_string(min) +
                                                 ", " + std::to_string(max) + "]";
      },
      "COUNT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

}  // namespace radixtier::cli
