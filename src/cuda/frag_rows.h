// Where the query rows and keys of a score fragment sit, for the code between the two GEMMs
// (masks, score mods, online softmax, output rescale). A thread always holds two query rows
// ("row slots" 0 / 1) of each m16n8 C fragment; which values belong to which row and key
// depends on which operand carried the queries (mma_sm80.h has the fragment layouts;
// lane = g * 4 + t):
//
//  * RowsOnM: S = Q K^T, query rows on the MMA's M (every kernel but the transposed decode):
//    c[0..1] = (row g, keys 2t, 2t+1), c[2..3] = (row g + 8, same keys); n8 fragment i covers
//    keys 8i .. 8i + 7; a row's values are spread over the 4 lanes of a quad.
//  * RowsOnN: S^T = K Q^T, keys on M and at most 8 query rows on N (the transposed decode tile):
//    c[0..1] = (key g, rows 2t, 2t+1), c[2..3] = (key g + 8, same rows); m16 fragment i covers
//    keys 16i .. 16i + 15; a row's values are spread over the 8 lanes with the same t.
#pragma once
#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

struct RowsOnM {
  static constexpr int kKeysPerFrag = 8;
  __device__ static constexpr int slot(int e) { return e >> 1; }  // row slot of c[e]
  __device__ static constexpr int elem(int r, int k) { return 2 * r + k; }  // k-th value of slot r
  __device__ static int row(int lane, int r) { return (lane >> 2) + 8 * r; }  // of slot r, in the warp's tile
  __device__ static int key(int lane, int i, int e) { return 8 * i + 2 * (lane & 3) + (e & 1); }
  __device__ static float reduce_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  }
  __device__ static float reduce_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
  }
};

struct RowsOnN {
  static constexpr int kKeysPerFrag = 16;
  __device__ static constexpr int slot(int e) { return e & 1; }
  __device__ static constexpr int elem(int r, int k) { return r + 2 * k; }
  __device__ static int row(int lane, int r) { return 2 * (lane & 3) + r; }
  __device__ static int key(int lane, int i, int e) { return 16 * i + (lane >> 2) + 8 * (e >> 1); }
  __device__ static float reduce_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
  }
  __device__ static float reduce_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    return v + __shfl_xor_sync(0xffffffffu, v, 16);
  }
};

}  // namespace attnkit::cuda
