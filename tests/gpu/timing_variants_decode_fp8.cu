#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

// fp8 e4m3 cache with a bf16 Q. The dispatch's DecodeTraits is the bulk one with 3 stages at
// 3 CTAs per SM.
std::vector<Variant> decode_variants_fp8_hd128() {
  return {
      {"fp8 cp.async, 64 keys, 3 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 3, 3, false>>},
      {"fp8 bulk rows, 64 keys, 3 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 3, 3, true>>},
      {"fp8 bulk rows, 64 keys, 5 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 5, 2, true>>},
      {"fp8 bulk rows, 128 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 128, 3, 2, true>>},
  };
}

}  // namespace attnkit::test
