#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

std::vector<Variant> prefill_variants_bf16_hd128() {
  return {
      {"MF2 x 4 warps, 128x64, 2 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 2, 4, 1, 64, 2, 2>>},
      {"MF2 x 8 warps, 256x64, 2 stages", &launch_varlen<VarlenTraits<E, 128, false, 2, 8, 1, 64, 2, 1>>},
  };
}

}  // namespace attnkit::test
