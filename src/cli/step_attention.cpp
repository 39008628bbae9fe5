#include "cli/step_attention.h"

#include "attnkit/reference.h"

namespace attnkit::cli {

void run_step_attention(const StepTensors& t, const CommonAttentionMetadata& md,
                        const AttentionParams& params) {
  AttentionParams p = params;
  p.causal = md.causal;
  reference_attention(t.q, t.cache, md.batch(), p, t.out);
}

}  // namespace attnkit::cli
