// The subcommands of the `radixtier` tool. A command file registers itself at static
// initialisation, so adding one (src/cli/sim_command.cpp, report_command.cpp, ...) never
// touches main.cpp:
//
//   static radixtier::cli::CommandRegistrar kSim{"sim", "replay a workload in the simulator",
//                                                &run_sim};
//
// The function gets the arguments after the subcommand name (argv[0] is the name itself).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace radixtier::cli {

using CommandFn = int (*)(int argc, char** argv);

struct Command {
  std::string name;
  std::string help;  ///< one line
  CommandFn run;
};

/// Every registered command, in registration order (main sorts them by name for --help).
inline std::vector<Command>& commands() {
  static std::vector<Command> registry;
  return registry;
}

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandFn run) {
    commands().push_back(Command{std::move(name), std::move(help), run});
  }
};

}  // namespace radixtier::cli
