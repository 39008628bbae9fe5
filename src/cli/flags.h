// Flags shared by the commands that describe an attention configuration (select, shape).
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "attnkit/backend.h"

namespace attnkit::cli {

// A bad command line: the message names the flag. Commands exit with kExitUsage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;  // no backend / the preferred one cannot serve
inline constexpr int kExitUsage = 2;

struct ConfigFlags {
  AttentionConfig cfg;
  std::optional<std::string> backend;  // --backend NAME
  std::optional<int64_t> num_blocks;   // --num-blocks N
  float softcap = 0.f;                 // --softcap X (> 0)
  int sliding_window = 0;              // --sliding-window N (> 0)
  bool help = false;
};

struct FlagRequirements {
  bool device = false;      // --device must be given
  bool backend = false;     // --backend must be given
  bool num_blocks = false;  // --num-blocks is accepted (and then required)
};

// Parses argv[1..argc) (argv[0] is the command). Throws UsageError naming the flag for an
// unknown flag, a missing or malformed value, or a missing required flag. With --help,
// returns with help = true and nothing else checked.
ConfigFlags parse_config_flags(int argc, char** argv, FlagRequirements need);

// The help text of those flags (one per line, indented).
std::string config_flags_help(FlagRequirements need);

}  // namespace attnkit::cli
