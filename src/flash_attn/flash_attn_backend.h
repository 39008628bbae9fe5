// The FlashAttention-style backend: one varlen paged kernel for the whole mixed batch.
#pragma once
#include "attnkit/backend.h"

namespace attnkit::flash_attn {

class FlashAttnBackend final : public AttentionBackend {
 public:
  std::string_view name() const override { return "flash_attn"; }
  Capabilities capabilities() const override;
  // Capabilities and device, plus: a 16-bit cache has the model dtype, and some kernel
  // generation serves the configuration.
  std::vector<std::string> check(const AttentionConfig& cfg) const override;
  std::string variant(const AttentionConfig& cfg) const override;  // the generation and why
  // Single-token decode batches replay one graph per batch size; mixed batches re-plan.
  CudagraphSupport cudagraph_support(const AttentionConfig&) const override {
    return CudagraphSupport::UNIFORM_SINGLE_TOKEN_DECODE;
  }
  std::unique_ptr<MetadataBuilder> make_builder(const AttentionConfig& cfg) const override;
  std::unique_ptr<AttentionImpl> make_impl(const AttentionConfig& cfg) const override;
};

// Throws Error listing every reason unless the backend can serve cfg.
void require_servable(const AttentionConfig& cfg, std::string_view where);

}  // namespace attnkit::flash_attn
