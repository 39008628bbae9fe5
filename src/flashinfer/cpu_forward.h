// The FlashInfer-style backend's CPU path: a planned batch part run on the reference's row math
// (src/reference/attend_row.h) the way the GPU kernels will run it. Every work item of the plan
// attends its tile's packed rows over its KV chunk [kv_begin, kv_end), reading the cache through
// the page table (request r's pages are indices + indptr[r]); an unsplit tile writes out / lse
// directly, a split tile writes one partial per chunk and the merge map (merge_indptr) combines
// them per packed row. So the result depends on the plan being right: a chunk left out or a
// wrong merge map shows up against the reference.
#pragma once
#include <string_view>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"
#include "flashinfer/page_table.h"
#include "flashinfer/plan.h"

namespace attnkit::flashinfer {

// q [>= plan.num_tokens, num_heads, head_size] (CPU, f32/f16/bf16; rows past the plan's tokens
// are padding: output 0, LSE -inf), out the same shape; params.lse, if defined, f32
// [num_heads, q.size(0)] natural log. `batch` is what `plan` was planned from: its kv_lens must
// be the page table's and params' causal / windows must be the ones it was planned with.
// cache.block_size must be the plan's page size, every page id < cache.num_blocks. Error on
// any violation, before anything is written.
// The checks both paths make: the plan, the page table and the call describe the same batch
// (requests, kv_lens, causal / windows, heads, head size, page size, tokens) and every page id
// lies in the cache. Error naming the first disagreement.
void check_planned_call(const TensorView& q, const PagedKV& cache, const PageTable& pages, const PlanBuffers& plan,
                        const PlanBatch& batch, const AttentionParams& params, std::string_view where);

void run_plan_on_cpu(const TensorView& q, const PagedKV& cache, const PageTable& pages,
                     const PlanBuffers& plan, const PlanBatch& batch,
                     const AttentionParams& params, const TensorView& out);

}  // namespace attnkit::flashinfer
