// The one place the CLI runs attention on a serving step's tensors, so a backend chosen by the
// selector can replace the CPU reference here without touching the simulation or the printing.
#pragma once
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit::cli {

struct StepTensors {
  TensorView q;       // [num_tokens, num_heads, head_size]
  TensorView k, v;    // the new tokens' [num_tokens, num_kv_heads, head_size], already cached
  PagedKV cache;      // holds every request's K/V including this step's
  TensorView out;     // [num_tokens, num_heads, head_size]
};

// Runs attention for one step (today: the CPU reference over the paged cache).
void run_step_attention(const StepTensors& t, const CommonAttentionMetadata& md,
                        const AttentionParams& params);

}  // namespace attnkit::cli
