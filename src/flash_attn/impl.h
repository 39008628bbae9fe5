// The FlashAttention-style impl: validates a forward call and launches the varlen kernel.
#pragma once
#include <cstddef>

#include "attnkit/backend.h"
#include "flash_attn/generation.h"

namespace attnkit::flash_attn {

class FlashAttnImpl final : public AttentionImpl {
 public:
  explicit FlashAttnImpl(const AttentionConfig& cfg);
  // Device memory for split-KV partials, owned by the caller (an engine allocates it once,
  // sized for its largest batch, so CUDA-graph replays reuse it). A launch whose metadata
  // asks for more bytes than given throws.
  void set_workspace(void* device_ptr, size_t bytes);
  Generation generation() const { return generation_; }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& kv_cache, const BackendMetadata& metadata,
               const AttentionParams& params, const TensorView& out,
               void* stream = nullptr) override;

 private:
  AttentionConfig cfg_;
  Generation generation_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace attnkit::flash_attn
