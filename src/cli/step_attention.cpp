#include "cli/step_attention.h"

namespace attnkit::cli {

StepAttention::StepAttention(const AttentionConfig& cfg, std::optional<std::string_view> preferred)
    : selection_(select_backend(cfg, preferred)) {
  const AttentionBackend& b = backend(selection_.backend);
  builder_ = b.make_builder(cfg);
  impl_ = b.make_impl(cfg);
}

void StepAttention::run(const StepTensors& t, const CommonAttentionMetadata& md,
                        const AttentionParams& params, void* stream) {
  AttentionParams p = params;
  p.causal = md.causal;
  const auto metadata = builder_->build(md);
  impl_->forward(t.q, t.k, t.v, t.kv_cache, *metadata, p, t.out, stream);
}

}  // namespace attnkit::cli
