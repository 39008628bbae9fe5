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
  if (t.q.device == Device::CUDA && !plans_.get() && builder_->device_buffer_bytes() > 0) {
    plans_ = CudaMemory(builder_->device_buffer_bytes());  // (the builder's plans' device copies)
    builder_->set_device_buffer(plans_.get(), plans_.bytes());
  }
  const auto metadata = builder_->build(md);
  if (t.q.device == Device::CUDA) {
    const size_t need = impl_->workspace_bytes_for(*metadata);
    if (need > workspace_.bytes()) {
      cuda_stream_synchronize(stream);  // (the old buffer may still be read)
      workspace_ = CudaMemory(need);
      impl_->set_workspace(workspace_.get(), workspace_.bytes());
    }
  }
  impl_->forward(t.q, t.k, t.v, t.kv_cache, *metadata, p, t.out, stream);
}

}  // namespace attnkit::cli
