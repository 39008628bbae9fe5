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

// Score modifications and the mask, where the tile needs them (boundary tiles, score mods):
// masked scores become -inf.
template <class Lay, int kS>
__device__ __forceinline__ void modify_and_mask(cuda::FragC (&s)[kS], const cuda::ScoreMod& mod,
                                                bool whole_tile_visible, const VarlenKernelParams& p,
                                                const WorkItem& w, int row0, int key0, int lane,
                                                bool per_request_alibi) {
  if (mod.active() || !whole_tile_visible) {
    const cuda::RowFacts rows = row_facts<Lay>(p, w, row0, lane, per_request_alibi);
    if (mod.active()) mod.apply<Lay>(s, rows, key0, lane);
    if (!whole_tile_visible) cuda::apply_mask<Lay>(s, rows, key0, lane);
  }
}

// Scores to probabilities: s holds the fragment's scores over keys [key0, key0 + 8 * kS);
// whole_tile_visible: every key of the tile is visible to every row (no mask needed).
// `rescale` receives the factor the output rows must be multiplied by (rescale_output).
// Lay: where the fragment's rows and keys sit (cuda/frag_rows.h). per_request_alibi: row_facts.
// kMaxSlackLog2: RowSoftmax::step's slack of the running maxima (0: none).
template <class Lay = cuda::RowsOnM, int kMaxSlackLog2 = 0, int kS>
__device__ __forceinline__ void softmax_scores(cuda::FragC (&s)[kS], cuda::RowSoftmax& softmax,
                                               const cuda::ScoreMod& mod, float unit, bool whole_tile_visible,
                                               const VarlenKernelParams& p, const WorkItem& w, int row0, int key0,
                                               int lane, float (&rescale)[2], bool per_request_alibi = true) {
  modify_and_mask<Lay>(s, mod, whole_tile_visible, p, w, row0, key0, lane, per_request_alibi);
  softmax.template step<Lay, kMaxSlackLog2>(s, unit, rescale);
}

// The speculative policy of the same step (the hopper kernel on 16-bit caches, every tile of an
// item after its first): the exponentials run at the stored maxima before any maximum of the
// tile is known (RowSoftmax::exp_at_stored_max: no tree of maxima, no shuffles, no rescale).
// all_fit(fits) says whether every thread that shares the tile's S can keep them (the hopper
// kernel: the warpgroup, which issued one wgmma for it); if not, s_again(s) computes the scores
// once more (S = Q K^T from the K tile still in its stage) and they take the exact step above.
// kLimitLog2: the largest P kept, log2 (as kMaxSlackLog2). ALiBi slopes per head only (the
// hopper kernel's).
template <class Lay = cuda::RowsOnM, int kLimitLog2 = 8, int kS, class AllFit, class SAgain>
__device__ __forceinline__ void softmax_scores_speculative(cuda::FragC (&s)[kS], cuda::RowSoftmax& softmax,
                                                           const cuda::ScoreMod& mod, float unit,
                                                           bool whole_tile_visible, const VarlenKernelParams& p,
                                                           const WorkItem& w, int row0, int key0, int lane,
                                                           float (&rescale)[2], AllFit&& all_fit, SAgain&& s_again) {
  modify_and_mask<Lay>(s, mod, whole_tile_visible, p, w, row0, key0, lane, false);
  float part[2];
  const bool fits = softmax.template exp_at_stored_max<Lay, kLimitLog2>(s, unit, part);
  if (all_fit(fits)) {
    softmax.add_sums(part);
    rescale[0] = rescale[1] = 1.f;
    return;
  }
  s_again(s);
  softmax_scores<Lay, kLimitLog2>(s, softmax, mod, unit, whole_tile_visible, p, w, row0, key0, lane, rescale,
                                  false);
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
