// Reads one row (one cache slot, one KV head) of the K or V side of a paged cache as floats,
// dequantizing on the way (docs/architecture.md section 2): the reference's only access to the cache.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"

namespace attnkit::reference {

class KVRowReader {
 public:
  // `scale`: the side's dequant scale (params.k_scale / v_scale): f32 [1] or [num_kv_heads]
  // for fp8, the global scale f32 [1] for nvfp4; undefined means 1. Ignored for float caches
  // (engines pass 1.0 there). The caller has validated `scale` (validate_kv_scale).
  KVRowReader(const PagedKV& cache, const PagedKVSide& side, const TensorView& scale);

  // Writes the head_size dequantized values of row (slot, kv_head) to out.
  void read(int64_t slot, int kv_head, float* out) const;

 private:
  PagedKVSide side_;
  DType dtype_;
  int block_size_, head_size_;
  std::vector<float> head_scale_;     // per KV head (per-tensor scales repeated)
  std::array<float, 256> fp8_code_{};  // fp8 code -> unscaled value
  std::vector<float> f16_code_;        // f16 bits -> value (f16 caches only)
};

// Checks a dequant scale tensor against the cache: f32 on the CPU, shape [1] or
// [num_kv_heads] (nvfp4: [1]), every value finite and > 0. Throws Error naming `name`.
void validate_kv_scale(const char* where, const char* name, const TensorView& scale,
                       const PagedKV& cache);

}  // namespace attnkit::reference
