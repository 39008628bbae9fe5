// The attnkit command: dispatches `attnkit <command> [flags]` to the registered commands.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "attnkit/error.h"
#include "cli/commands.h"

namespace attnkit::cli {
std::vector<Command>& command_table() {
  static std::vector<Command> table;
  return table;
}
}  // namespace attnkit::cli

static void usage(FILE* f) {
  auto& table = attnkit::cli::command_table();
  std::sort(table.begin(), table.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(f, "usage: attnkit <command> [flags]   (attnkit <command> --help for its flags)\n\ncommands:\n");
  for (auto& c : table) std::fprintf(f, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : attnkit::cli::command_table()) {
    if (c.name != argv[1]) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const attnkit::Error& e) {
      std::fprintf(stderr, "attnkit %s: error: %s\n", argv[1], e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attnkit %s: error: %s\n", argv[1], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "attnkit: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
