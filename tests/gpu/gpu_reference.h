// A plain fp32 GPU attention reference for chosen (token, head) rows: one CTA per row, no
// tiling, no tensor cores, written apart from the kernels under test (it shares none of their
// code). It lets the GPU tests check shapes too large for the CPU reference; the tests check
// it against the CPU reference on small shapes first.
#pragma once
#include <cstdint>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit::test {

struct RefRow {
  int32_t token, head, req;
};

struct GpuBatch {  // device arrays
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* seqused_k = nullptr;
  const int32_t* block_table = nullptr;
  int max_blocks_per_req = 0;
};

// q: CUDA [num_tokens, num_heads, head_size] bf16/f16; cache: CUDA; params: tensors on CUDA
// (lse ignored). Returns out [rows, head_size] and lse [rows] (natural log) in fp32.
// max_keys bounds the visible keys of any row (shared memory holds one logit per key).
void gpu_reference_rows(const TensorView& q, const PagedKV& cache, const GpuBatch& batch,
                        const AttentionParams& params, const std::vector<RefRow>& rows,
                        int max_keys, std::vector<float>& out, std::vector<float>& lse);

}  // namespace attnkit::test
