// `radixtier <command> [args]`: one CLI11 subcommand per command registered in commands.hpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"radixtier: prefix caching for hybrid (attention + Gated DeltaNet) models",
               "radixtier"};
  app.require_subcommand(1);
  auto cmds = radixtier::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, radixtier::cli::CommandRun>> runs;
  for (const auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs.emplace_back(sub, c.setup(*sub));
  }
  // `radixtier help` is `radixtier --help`.
  char help_flag[] = "--help";
  if (argc == 2 && std::strcmp(argv[1], "help") == 0) argv[1] = help_flag;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help: 0; every usage error: 2, the message and a pointer to --help on stderr.
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const std::bad_alloc&) {
      // A run larger than this machine's memory: a message and a status, not an abort.
      std::fprintf(stderr,
                   "radixtier %s: out of memory (the run is larger than this machine's "
                   "memory: give it smaller budgets or fewer instances)\n",
                   sub->get_name().c_str());
      return 1;
    }
  }
  return 2;
}
