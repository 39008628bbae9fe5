// The split-KV workspace size (host code in every build: the builder and the CPU tests size
// workspaces without CUDA).
#include "cuda/split_workspace.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {

size_t varlen_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits) {
  return cuda::split_workspace_bytes(num_tokens, num_heads, head_size, num_splits);
}

}  // namespace attnkit::flash_attn
