// `radixtier <command> [args]`: dispatches to the commands registered in commands.hpp.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "commands.hpp"

namespace {

void usage(std::FILE* out) {
  auto cmds = radixtier::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::fprintf(out,
               "usage: radixtier <command> [args]   (radixtier <command> --help)\n\ncommands:\n");
  for (const auto& c : cmds) std::fprintf(out, "  %-10s %s\n", c.name.c_str(), c.help.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : radixtier::cli::commands()) {
    if (c.name == argv[1]) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "radixtier: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
