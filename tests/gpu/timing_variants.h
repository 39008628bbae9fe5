// Alternative tile configurations of the varlen kernel, instantiated only in the test binary
// so that one timing run on the GPU can compare them with the configurations the dispatch
// uses (a tuning aid for the disabled *Timing* tests).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "flash_attn/varlen_params.h"

namespace attnkit::test {

using VariantLaunch = void (*)(const flash_attn::VarlenKernelParams&, const flash_attn::VarlenLaunchShape&,
                               cudaStream_t);
struct Variant {
  const char* name;
  VariantLaunch launch;
};

std::vector<Variant> prefill_variants_bf16_hd128();       // timing_variants_prefill.cu
std::vector<Variant> decode_variants_bf16_hd128();  // timing_variants_decode.cu
std::vector<Variant> decode_variants_fp8_hd128();   // timing_variants_decode_fp8.cu

}  // namespace attnkit::test
