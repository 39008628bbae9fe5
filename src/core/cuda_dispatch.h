// Entry points of the CUDA implementations, called by the device-agnostic public functions
// when their tensors live on the GPU. Defined in src/cuda/*.cu; in a build without CUDA,
// src/core/no_cuda.cpp defines them to throw.
#pragma once
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"

namespace attnkit::cuda {

void write_kv(const TensorView& key, const TensorView& value, const PagedKV& cache,
              const TensorView& slot_mapping, const KVScales& scales, void* stream);

void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse_out,
                  void* stream);

}  // namespace attnkit::cuda
