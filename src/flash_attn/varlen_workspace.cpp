// Host code of the varlen seam in every build (the builder, the Python package and the CPU tests
// use it without CUDA): the split-KV workspace size and the contiguous K/V view.
#include <string>

#include "attnkit/error.h"
#include "cuda/split_workspace.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {

size_t varlen_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits) {
  return cuda::split_workspace_bytes(num_tokens, num_heads, head_size, num_splits);
}

PagedKV contiguous_kv_view(const TensorView& k, const TensorView& v) {
  constexpr std::string_view where = "flash_attn contiguous K/V";
  k.require_ndim(where, "k", 3);
  v.require_shape(where, "v", {k.shape[0], k.shape[1], k.shape[2]});
  ATTNKIT_REQUIRE(v.dtype == k.dtype, where, "v.dtype", dtype_name(v.dtype),
                  "must equal k.dtype = " + std::string(dtype_name(k.dtype)));
  k.require_last_dim_contiguous(where, "k");
  v.require_last_dim_contiguous(where, "v");
  PagedKV kv;
  kv.dtype = k.dtype;
  kv.device = k.device;
  kv.device_index = k.device_index;
  kv.num_blocks = k.shape[0];
  kv.block_size = 16;  // (cuda::KvPages::kContiguousPageKeys)
  kv.num_kv_heads = static_cast<int>(k.shape[1]);
  kv.head_size = static_cast<int>(k.shape[2]);
  for (auto [side, t] : {std::pair{&kv.k, &k}, {&kv.v, &v}}) {
    side->base = t->data;
    side->stride_block = t->strides[0];  // block b starts at row b ...
    side->stride_slot = t->strides[0];   // ... and its slots are the rows after it
    side->stride_head = t->strides[1];
  }
  return kv;
}

}  // namespace attnkit::flash_attn
