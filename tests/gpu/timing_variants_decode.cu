#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

std::vector<Variant> decode_variants_bf16_hd128(bool fp8) {
  if (fp8)
    return {
        {"fp8 16 rows, 4 warps on N, 64 keys, 3 stages", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 3, 2>>},
        {"fp8 16 rows, 4 warps on N, 128 keys, 2 stages", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 128, 2, 1>>},
        {"fp8 16 rows, 4 warps on N, 64 keys, 5 stages", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 5, 1>>},
    };
  return {
      {"16 rows, 4 warps on N, 64 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 3, 2>>},
      {"16 rows, 4 warps on N, 128 keys, 2 stages", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 128, 2, 1>>},
      {"16 rows, 4 warps on N, 64 keys, 4 stages", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 4, 1>>},
      {"16 rows, 8 warps on N, 128 keys, 3 stages", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 8, 128, 3, 1>>},
      {"16 rows, 2 warps on N, 32 keys, 4 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 2, 32, 4, 3>>},
  };
}

}  // namespace attnkit::test
