#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

std::vector<Variant> decode_variants_bf16_hd128(bool fp8) {
  if (fp8)
    return {
        {"fp8 16 rows, 4 warps on N, 64 keys, 3 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 3, 3>>},
        {"fp8 16 rows, 4 warps on N, 128 keys, 3 stages, 1/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 128, 3, 1>>},
        {"fp8 16 rows, 4 warps on N, 128 keys, 2 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 128, 2, 2>>},
    };
  return {
      {"16 rows, 4 warps on N, 64 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 3, 2>>},
      {"16 rows, 8 warps on N, 128 keys, 3 stages", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 8, 128, 3, 1>>},
  };
}

}  // namespace attnkit::test
