// A build without CUDA: the GPU entry points exist and say why they cannot run.
#ifndef ATTNKIT_WITH_CUDA
#include "attnkit/error.h"
#include "core/cuda_dispatch.h"
#include "flash_attn/varlen_launch.h"

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

namespace attnkit::flash_attn {

size_t varlen_workspace_bytes(int64_t, int, int, int) { return 0; }

void run_varlen_attention(const VarlenArgs&) {
  throw Error("flash_attn varlen attention", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

}  // namespace attnkit::flash_attn
#endif
