// The step between the two GEMMs of every varlen kernel generation, for one warp's m16 row
// fragment and one K/V tile: score modifications and the mask where the tile needs them, the
// online-softmax update (S becomes P in place), and the rescale of the output rows. The
// mma_sync and hopper kernels hold S and O in the same C-fragment layout, so they share it.
#pragma once
#include "cuda/attention_mask.h"
#include "cuda/mma_sm80.h"
#include "cuda/online_softmax.h"
#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn {

// Scores to probabilities: s holds the fragment's scores over keys [key0, key0 + 8 * kS);
// whole_tile_visible: every key of the tile is visible to every row (no mask needed).
// `rescale` receives the factor the output rows must be multiplied by (rescale_output).
// Lay: where the fragment's rows and keys sit (cuda/frag_rows.h). per_request_alibi: row_facts.
template <class Lay = cuda::RowsOnM, int kS>
__device__ __forceinline__ void softmax_scores(cuda::FragC (&s)[kS], cuda::RowSoftmax& softmax,
                                               const cuda::ScoreMod& mod, float unit, bool whole_tile_visible,
                                               const VarlenKernelParams& p, const WorkItem& w, int row0, int key0,
                                               int lane, float (&rescale)[2], bool per_request_alibi = true) {
  if (mod.active() || !whole_tile_visible) {  // boundary tiles and score mods only
    const cuda::RowFacts rows = row_facts<Lay>(p, w, row0, lane, per_request_alibi);
    if (mod.active()) mod.apply<Lay>(s, rows, key0, lane);
    if (!whole_tile_visible) cuda::apply_mask<Lay>(s, rows, key0, lane);
  }
  softmax.step<Lay>(s, unit, rescale);
}

// Once the running maxima settle, most tiles change none of them: skip the multiply.
// `before` runs first on both paths (the hopper kernel's wait for the P V still writing O: the
// branch ends the softmax's block, so ptxas does not hoist that wait above the softmax).
template <class Lay = cuda::RowsOnM, int kO, class Before>
__device__ __forceinline__ void rescale_output(cuda::FragC (&o)[kO], const float (&rescale)[2], Before&& before) {
  if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
    before();
    cuda::scale_rows<Lay>(o, rescale);
  } else {
    before();
  }
}
template <class Lay = cuda::RowsOnM, int kO>
__device__ __forceinline__ void rescale_output(cuda::FragC (&o)[kO], const float (&rescale)[2]) {
  rescale_output<Lay>(o, rescale, [] {});
}

// Both, for kernels whose output accumulator is idle during the softmax.
template <class Lay = cuda::RowsOnM, int kS, int kO>
__device__ __forceinline__ void softmax_tile(cuda::FragC (&s)[kS], cuda::FragC (&o)[kO], cuda::RowSoftmax& softmax,
                                             const cuda::ScoreMod& mod, float unit, bool whole_tile_visible,
                                             const VarlenKernelParams& p, const WorkItem& w, int row0, int key0,
                                             int lane) {
  float rescale[2];
  softmax_scores<Lay>(s, softmax, mod, unit, whole_tile_visible, p, w, row0, key0, lane, rescale);
  rescale_output<Lay>(o, rescale);
}

}  // namespace attnkit::flash_attn
