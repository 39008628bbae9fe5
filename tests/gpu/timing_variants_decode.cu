#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

// bf16 cache (fp8: timing_variants_decode_fp8.cu). The first is the dispatch's DecodeTraits.
std::vector<Variant> decode_variants_bf16_hd128() {
  return {
      {"16 rows, 4 warps on N, 64 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 3, 2>>},
      {"16 rows, 4 warps on N, 64 keys, 2 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 2, 3>>},
  };
}

}  // namespace attnkit::test
