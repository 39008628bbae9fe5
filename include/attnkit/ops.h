// Free functions over partial attention results.
#pragma once
#include "attnkit/tensor.h"

namespace attnkit {

// Merges two partial results over disjoint key sets (docs/architecture.md section 5):
// lse = logaddexp(lse_a, lse_b); out = out_a*exp(lse_a-lse) + out_b*exp(lse_b-lse).
// out_*: [num_tokens, num_heads, head_size] (f32/f16/bf16, may differ); lse_*: f32
// [num_heads, num_tokens] natural log. An LSE of -inf, +inf or NaN is an empty side; both
// empty gives out = 0, lse = -inf; a side with weight 0 contributes exactly 0 (NaN ignored).
// lse_out may be undefined. `out` may alias out_a or out_b. CPU or CUDA (stream = cudaStream_t).
void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse_out,
                  void* stream = nullptr);

// The scalar rule every merge implementation follows, for one (token, head): returns the
// merged lse and writes weights wa, wb such that out = wa*out_a + wb*out_b.
// merge_weights(lse_a, lse_b, &wa, &wb) and merge_value(a, wa, b, wb) live in detail/merge_rule.h.

}  // namespace attnkit

#include "attnkit/detail/merge_rule.h"
