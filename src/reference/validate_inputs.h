// Every check reference_attention makes before it touches memory (docs/architecture.md section 8).
#pragma once
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit::reference {

inline constexpr const char* kWhere = "reference_attention";

// Throws Error naming the first offending value: q/out shapes, dtypes and devices, the cache
// description, heads divisibility, the batch (BatchView::validate), the params
// (AttentionParams::validate) and the dequant scales against the cache dtype.
void validate_inputs(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                     const AttentionParams& params, const TensorView& out,
                     bool allow_query_longer_than_keys);

}  // namespace attnkit::reference
