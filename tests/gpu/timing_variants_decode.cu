#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

// bf16 cache (fp8: timing_variants_decode_fp8.cu). The dispatch's DecodeTraits is the bulk one
// with 3 stages at 2 CTAs per SM.
std::vector<Variant> decode_variants_bf16_hd128() {
  return {
      {"cp.async, 64 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 3, 2, false>>},
      {"bulk rows, 64 keys, 3 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 3, 2, true>>},
      {"bulk rows, 64 keys, 2 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, false, 1, 1, 4, 64, 2, 3, true>>},
  };
}

}  // namespace attnkit::test
