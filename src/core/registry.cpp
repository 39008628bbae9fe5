// The registry: every backend attnkit has, in the selector's order of preference (the GPU
// backends first, fastest first; the CPU reference last).
#include "attnkit/backend.h"
#include "attnkit/error.h"
#include "core/backend_registry.h"

namespace attnkit {

const std::vector<const AttentionBackend*>& backends() {
  static const std::vector<const AttentionBackend*> all = {
      &flash_attn_backend(), &flashinfer_backend(), &reference_backend()};
  return all;
}

const AttentionBackend& backend(std::string_view name) {
  std::string known;
  for (const AttentionBackend* b : backends()) {
    if (b->name() == name) return *b;
    known += known.empty() ? "" : ", ";
    known += b->name();
  }
  fail("backend", "name", name, "must name a registered backend: " + known);
}

}  // namespace attnkit
