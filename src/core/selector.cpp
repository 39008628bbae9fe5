// The selector: the first backend of the registry whose rules the configuration passes and
// that claims it (a backend's preference), else the first whose rules it passes (the registry
// is in preference order); every refusal keeps all its reasons.
#include "attnkit/selector.h"

#include "attnkit/error.h"

namespace attnkit {

namespace {

constexpr std::string_view kWhere = "select_backend";

std::string join_reasons(const std::vector<std::string>& reasons) {
  std::string s;
  for (const auto& r : reasons) s += (s.empty() ? "" : "; ") + r;
  return s;
}

}  // namespace

std::vector<Refusal> refusals(const AttentionConfig& cfg) {
  cfg.validate(kWhere);
  std::vector<Refusal> out;
  for (const AttentionBackend* b : backends()) {
    auto why = b->check(cfg);
    if (!why.empty()) out.push_back({std::string(b->name()), std::move(why)});
  }
  return out;
}

Selection select_backend(const AttentionConfig& cfg, std::optional<std::string_view> preferred) {
  cfg.validate(kWhere);
  const AttentionBackend* want = preferred ? &backend(*preferred) : nullptr;
  Selection sel;
  const AttentionBackend* chosen = nullptr;
  const AttentionBackend* claimed = nullptr;  // the first server with a preference for cfg
  std::string claim;
  for (const AttentionBackend* b : backends()) {
    auto why = b->check(cfg);
    if (!why.empty()) {
      if (b == want)
        throw Error(std::string(kWhere), "preferred backend = " + std::string(b->name()),
                    "it cannot serve " + cfg.describe() + ": " + join_reasons(why));
      sel.refused.push_back({std::string(b->name()), std::move(why)});
    } else if (!want || b == want) {
      if (!chosen) chosen = b;
      if (!want && !claimed && !(claim = b->preference(cfg)).empty()) claimed = b;
    }
  }
  if (want) sel.reason = "the caller's preferred backend";
  else if (claimed) sel.reason = claim;
  else if (chosen) sel.reason = "the first backend in the registry's order that serves it";
  if (claimed) chosen = claimed;
  if (!chosen) {
    std::string all;
    for (const auto& r : sel.refused) all += (all.empty() ? "" : " | ") + r.backend + ": " + join_reasons(r.reasons);
    throw Error(std::string(kWhere), "configuration = " + cfg.describe(), "no backend can serve it: " + all);
  }
  sel.backend = std::string(chosen->name());
  sel.variant = chosen->variant(cfg);
  return sel;
}

}  // namespace attnkit
