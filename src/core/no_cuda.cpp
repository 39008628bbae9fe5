// A build without CUDA: the GPU entry points exist and say why they cannot run.
#ifndef ATTNKIT_WITH_CUDA
#include "attnkit/error.h"
#include "core/cuda_dispatch.h"

namespace attnkit::cuda {

[[noreturn]] static void no_cuda(const char* where) {
  throw Error(where, "device = cuda", "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

void write_kv(const TensorView&, const TensorView&, const PagedKV&, const TensorView&,
              const KVScales&, void*) {
  no_cuda("write_kv");
}

void merge_states(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                  const TensorView&, const TensorView&, void*) {
  no_cuda("merge_states");
}

}  // namespace attnkit::cuda
#endif
