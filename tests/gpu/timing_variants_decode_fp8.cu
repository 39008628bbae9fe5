#include "flash_attn/varlen_kernel.cuh"
#include "timing_variants.h"

namespace attnkit::test {

using namespace attnkit::flash_attn;
using E = __nv_bfloat16;

// fp8 e4m3 cache with a bf16 Q. The first is the dispatch's DecodeTraits.
std::vector<Variant> decode_variants_fp8_hd128() {
  return {
      {"fp8 16 rows, 4 warps on N, 64 keys, 3 stages, 3/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 3, 3>>},
      {"fp8 16 rows, 4 warps on N, 64 keys, 5 stages, 2/SM", &launch_varlen<VarlenTraits<E, 128, true, 1, 1, 4, 64, 5, 2>>},
  };
}

}  // namespace attnkit::test
