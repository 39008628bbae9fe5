// Per-call attention parameters (docs/architecture.md section 4).
#pragma once
#include "attnkit/tensor.h"

namespace attnkit {

struct AttentionParams {
  float scale = 0.f;        // 0 -> 1/sqrt(head_size)
  bool causal = true;       // bottom-right aligned
  int window_left = -1;     // -1 = unbounded
  int window_right = -1;    // -1 = unbounded
  float softcap = 0.f;      // > 0 enables s = c * tanh(s / c)
  TensorView alibi_slopes;  // f32 [num_heads] or [num_reqs, num_heads] (per request), optional
  TensorView sinks;         // f32 [num_heads], optional (logit per head, no value)
  TensorView k_scale, v_scale;  // fp8/nvfp4 dequant scales, f32 [1] or [num_kv_heads]
  TensorView lse;           // f32 [num_heads, num_tokens] output (natural log), optional

  float resolved_scale(int head_size) const;
  // The ALiBi slope of request `req` and query head `head` (host memory; 0 without slopes).
  float alibi_slope(int req, int head) const;
  // Validates ranges and tensor shapes (num_heads / num_kv_heads / num_tokens / device):
  // num_heads % num_kv_heads == 0, scale finite, softcap finite and >= 0, windows >= -1,
  // every defined tensor f32, contiguous, on `device`, with the shape given above (per-request
  // ALiBi slopes: the callers that know num_reqs check dim 0). Tensor values (e.g. scales > 0)
  // are not read here: they may live on the GPU.
  void validate(std::string_view where, int num_heads, int num_kv_heads, int64_t num_tokens,
                Device device) const;
};

}  // namespace attnkit
