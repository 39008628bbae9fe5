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
  std::string reason;   // why this backend: the caller's choice, its preference, or the registry's order
  std::vector<Refusal> refused;
};

// Picks the first backend of the registry that can serve cfg and claims it
// (AttentionBackend::preference), else the first that can serve it. With `preferred`, picks it or
// throws Error listing every reason it cannot serve cfg. With no backend able, throws Error
// listing every backend's reasons.
// Throws Error for a malformed cfg (AttentionConfig::validate) or an unknown preferred name.
Selection select_backend(const AttentionConfig& cfg,
                         std::optional<std::string_view> preferred = std::nullopt);

// Every registered backend that cannot serve cfg, with its reasons, in registry order (never
// throws for a refusal; for reports such as the CLI's when no backend can serve).
std::vector<Refusal> refusals(const AttentionConfig& cfg);

}  // namespace attnkit
