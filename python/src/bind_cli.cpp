// The CLI's commands inside the extension: `python -m attnkit demo` runs the same code as
// `attnkit demo`. The command files of src/cli/ register themselves into this table when the
// extension loads (the CLI's main.cpp, which owns the table in the executable, is not compiled
// here).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/error.h"
#include "cli/commands.h"

namespace attnkit::cli {
std::vector<Command>& command_table() {
  static std::vector<Command> table;
  return table;
}
}  // namespace attnkit::cli

namespace attnkit::py {

namespace nb = nanobind;

namespace {

std::vector<std::pair<std::string, std::string>> commands() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : cli::command_table()) out.emplace_back(c.name, c.summary);
  return out;
}

// Runs `attnkit <args...>` in-process and returns its exit code; errors print as the CLI's do.
int run_cli(const std::vector<std::string>& args) {
  ATTNKIT_REQUIRE(!args.empty(), "run_cli", "args", "[]", "must start with a command name");
  for (const auto& c : cli::command_table()) {
    if (c.name != args[0]) continue;
    std::vector<std::string> owned = args;  // commands take mutable argv
    std::vector<char*> argv;
    for (auto& a : owned) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = 1;
    {
      nb::gil_scoped_release release;  // a long demo must not hold up other Python threads
      try {
        rc = c.run(static_cast<int>(owned.size()), argv.data());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "attnkit %s: error: %s\n", args[0].c_str(), e.what());
        rc = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
    }
    return rc;
  }
  std::string known;
  for (const auto& c : cli::command_table()) known += (known.empty() ? "" : ", ") + c.name;
  fail("run_cli", "command", args[0], "must be one of: " + known);
}

}  // namespace

void register_cli(nb::module_& m) {
  m.def("cli_commands", &commands, "The CLI's commands as (name, summary) pairs.");
  m.def("run_cli", &run_cli, nb::arg("args"),
        "Runs an attnkit CLI command in-process (args[0] is the command); returns its exit code.");
}

}  // namespace attnkit::py
