// The CPU reference backend's entry point: the oracle for every test.
#pragma once
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit {

// Attention of every query token of `batch` over the paged cache (docs/architecture.md section 4),
// accumulated in double, parallel over (token, head).
// q: [num_tokens, num_heads, head_size] f32/f16/bf16 (last dim contiguous), CPU.
// out: same shape, f32/f16/bf16. params.lse, if defined: f32 [num_heads, num_tokens].
// The cache is dequantized on read (fp8 with params.k_scale/v_scale, nvfp4 with its block
// scales and the global scales in params.k_scale/v_scale); float caches ignore the scales.
// q may have more rows than query_start_loc[num_reqs] (padding): those rows get output 0 and
// LSE -inf. out may alias q. Every input is validated first (attnkit::Error).
void reference_attention(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                         const AttentionParams& params, const TensorView& out,
                         bool allow_query_longer_than_keys = false);

}  // namespace attnkit
