// Shared by the FlashAttention-style backend's host tests (flash_attn_host_test.cpp,
// flash_attn_engine_test.cpp): a configuration of 32 / 8 heads, block 16, on a device of
// compute capability cc (0: the CPU).
#pragma once
#include "attnkit/backend.h"

namespace attnkit::flash_attn {

inline AttentionConfig config(int cc, int head_size = 128, DType cache = DType::bf16) {
  AttentionConfig c;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = head_size;
  c.dtype = DType::bf16;
  c.cache_dtype = cache;
  c.block_size = 16;
  c.device = cc == 0 ? DeviceSpec::Cpu() : DeviceSpec::Cuda(cc / 10, cc % 10);
  return c;
}

}  // namespace attnkit::flash_attn
