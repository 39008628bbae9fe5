// The GPU code this build contains (CMake: ATTNKIT_CUDA_ARCHS, passed as the compile definition
// ATTNKIT_CUDA_ARCHS_STR), and whether it runs on a device: what the selector and the generation
// choice ask before they hand a GPU configuration to a backend.
#pragma once
#include <string>
#include <vector>

namespace attnkit {

struct BuiltCudaArchs {
  std::vector<int> sass;  // machine code, as major * 10 + minor (sm_90a: 90, with sm90a set)
  std::vector<int> ptx;   // PTX the driver JIT-compiles for later devices
  bool sm90a = false;     // the sm_90a code (wgmma, setmaxnreg: the hopper generation)
};

// Parses a CMake CUDA architecture list ("80-real;90a-real;90-virtual", "90a", "80-virtual",
// ',' or ';' separated; a plain entry is both SASS and PTX, as CMake builds it). Error naming the
// entry that is not an architecture.
BuiltCudaArchs parse_cuda_archs(const std::string& list);
// This build's (empty without CUDA).
const BuiltCudaArchs& built_cuda_archs();
// Whether code of `archs` runs on a device of compute capability cc (major * 10 + minor): SASS
// of the same major and a minor <= the device's (sm_90a SASS: sm90 only), or PTX of an arch <= cc.
bool cuda_archs_run_on(const BuiltCudaArchs& archs, int cc);
// The architecture of the code that a device of compute capability cc runs (what the driver
// loads: the SASS of its major with the highest minor <= its own, else the highest PTX <= cc,
// JIT-compiled), as major * 10 + minor; 0 when none runs. Launch decisions that need sm90
// instructions (TMA, clusters, PDL) ask this, not the device: compute_80 PTX on an H200 has none.
int cuda_code_cc(const BuiltCudaArchs& archs, int cc);
// "sm_80, sm_90a, PTX compute_90" (what error messages and the selector say).
std::string describe_cuda_archs(const BuiltCudaArchs& archs);
// The shared memory one CTA may opt in to on a device of compute capability cc (bytes; the CUDA
// C++ Programming Guide's per-architecture limits): 227 KB on sm90 / sm10x, 163 KB on sm80 /
// sm87, 99 KB on sm86 / sm89 / sm12x and on architectures not listed. What the selector judges
// a tile's fit by (flash_attn/tile_set.h tile_smem_refusal); a launch checks the real device's.
int smem_per_block_optin(int cc);
// The selector's rule: empty when this build's GPU code runs on a device of compute capability
// cc (or the build has no CUDA: the backends say so themselves), else why not, in words.
std::string gpu_code_refusal(int cc);

}  // namespace attnkit
