// The FlashAttention-style impl: validates a forward call and launches the varlen kernel.
#pragma once
#include <cstddef>

#include "attnkit/backend.h"
#include "flash_attn/generation.h"

namespace attnkit::flash_attn {

class FlashAttnImpl final : public AttentionImpl {
 public:
  explicit FlashAttnImpl(const AttentionConfig& cfg);
  ~FlashAttnImpl() override;
  // Device memory for split-KV partials, owned by the caller (an engine allocates it once,
  // sized by workspace_bytes for its largest batch, so CUDA-graph replays reuse it): a forward
  // whose metadata splits the keys needs workspace_bytes_for(metadata) bytes of it, else it is
  // an Error before any launch (the impl never allocates). The first split launch after
  // set_workspace zeroes the buffer's counters on its stream (varlen_workspace_init; inside a
  // capture the memset joins the graph, which is harmless). Impls on one stream may share it.
  void set_workspace(void* device_ptr, size_t bytes) override;
  // The workspace any batch of up to max_tokens tokens can need (kMaxSplits splits).
  size_t max_workspace_bytes(int64_t max_tokens) const;
  size_t workspace_bytes(int64_t max_tokens) const override { return max_workspace_bytes(max_tokens); }
  size_t workspace_bytes_for(const BackendMetadata& metadata) const override;
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
  bool workspace_ready_ = false;  // its counters were zeroed (varlen_workspace_init)
};

}  // namespace attnkit::flash_attn
