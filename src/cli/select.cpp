// `attnkit select`: which backend serves a configuration, and why every other one cannot.
#include <cstdio>
#include <string>

#include "attnkit/error.h"
#include "attnkit/selector.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace attnkit::cli {

namespace {

constexpr FlagRequirements kNeed{.device = true, .backend = false, .num_blocks = false};

void print_refusals(const std::vector<Refusal>& refused) {
  if (refused.empty()) return;
  std::printf("refused:\n");
  for (const auto& r : refused) {
    std::printf("  %s:\n", r.backend.c_str());
    for (const auto& why : r.reasons) std::printf("    - %s\n", why.c_str());
  }
}

int run_select(int argc, char** argv) {
  ConfigFlags f;
  try {
    f = parse_config_flags(argc, argv, kNeed);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "attnkit select: %s\n", e.what());
    return kExitUsage;
  }
  if (f.help) {
    std::printf(
        "usage: attnkit select --heads N --head-size N --device D [flags]\n\n"
        "Prints the backend that serves the configuration, the kernel generation or path it\n"
        "uses and why, and every refused backend with all its reasons.\n"
        "Exit status: 0 a backend is chosen; 1 none can serve (or the --backend one cannot);\n"
        "2 bad flags.\n\nflags:\n%s",
        config_flags_help(kNeed).c_str());
    return kExitOk;
  }
  const AttentionConfig& cfg = f.cfg;
  std::printf("configuration: %s\n", cfg.describe().c_str());
  if (f.backend) {
    const auto why = backend(*f.backend).check(cfg);
    if (!why.empty()) {
      std::printf("preferred backend %s cannot serve this configuration:\n", f.backend->c_str());
      for (const auto& w : why) std::printf("  - %s\n", w.c_str());
      return kExitRefused;
    }
  }
  try {
    const Selection sel = select_backend(cfg, f.backend);
    std::printf("chosen: %s%s\n", sel.backend.c_str(), f.backend ? " (preferred)" : "");
    std::printf("why: %s\n", sel.reason.c_str());
    std::printf("variant: %s\n", sel.variant.c_str());
    print_refusals(sel.refused);
    return kExitOk;
  } catch (const Error&) {
    std::printf("no backend can serve this configuration\n");
    print_refusals(refusals(cfg));
    return kExitRefused;
  }
}

const RegisterCommand kRegister("select", "choose the attention backend for a configuration, with reasons",
                                run_select);

}  // namespace

}  // namespace attnkit::cli
