// The CLI's command table: each command lives in its own file and registers itself here, so
// adding a command never edits main.cpp.
#pragma once
#include <string>
#include <vector>

namespace attnkit::cli {

struct Command {
  std::string name;
  std::string summary;
  int (*run)(int argc, char** argv);  // argv[0] is the command name; returns the exit code
};

std::vector<Command>& command_table();

struct RegisterCommand {
  RegisterCommand(std::string name, std::string summary, int (*run)(int, char**)) {
    command_table().push_back({std::move(name), std::move(summary), run});
  }
};

}  // namespace attnkit::cli
