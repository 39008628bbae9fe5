// The selector: which backend serves a configuration, and why every other one cannot.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backend.h"

namespace attnkit {

struct Refusal {
  std::string backend;
  std::vector<std::string> reasons;  // every rule that failed, in words
};

struct Selection {
  std::string backend;  // the chosen backend's name
  std::string variant;  // the kernel generation / path it will use, with why
  std::vector<Refusal> refused;
};

// Picks the first backend of the registry that can serve cfg. With `preferred`, picks it or
// throws Error listing every reason it cannot serve cfg. With no backend able, throws Error
// listing every backend's reasons.
Selection select_backend(const AttentionConfig& cfg,
                         std::optional<std::string_view> preferred = std::nullopt);

}  // namespace attnkit
