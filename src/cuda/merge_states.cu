// merge_states on CUDA: the LSE merge of two partial attention results, with the one rule of
// detail/merge_rule.h. Eight threads share a (token, head) row: each reads the two LSEs and
// computes the weights itself (cached loads, a few flops), then merges its chunks of the row
// with 16-byte vectors when every operand's layout allows. `out` may alias out_a or out_b
// (each element is read and written by the same thread); lse_out may alias lse_a or lse_b
// (the row's threads all read the LSEs before a warp barrier, and one writes after it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnkit/detail/merge_rule.h"
#include "attnkit/error.h"
#include "core/cuda_dispatch.h"
#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "cuda/device_props.h"
#include "cuda/vec_io.cuh"

namespace attnkit::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 8;                   // threads per (token, head) row
constexpr int kRowsPerWarp = 32 / kRowThreads;   // rows a warp merges per step
constexpr int kVec = 8;

struct Operand {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t stride_token = 0, stride_head = 0;  // elements
};

struct Args {
  Operand a, b, out;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  float* lse_out = nullptr;
  int64_t lse_a_stride[2] = {0, 0}, lse_b_stride[2] = {0, 0}, lse_out_stride[2] = {0, 0};
  int64_t num_tokens = 0;
  int num_heads = 0, head_size = 0;
};

__device__ __forceinline__ int64_t row_elem(const Operand& o, int64_t t, int h) {
  return t * o.stride_token + static_cast<int64_t>(h) * o.stride_head;
}

// N = values per chunk (kVec when every operand is aligned, else 1).
template <int N>
__global__ void __launch_bounds__(kThreads) merge_states_kernel(const Args p) {
  const int lane = threadIdx.x % 32;
  const int sub = lane % kRowThreads;
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  // The loop bound is uniform across the warp so __syncwarp sees every lane.
  for (int64_t row0 = warp * kRowsPerWarp; row0 < rows; row0 += warps * kRowsPerWarp) {
    const int64_t row = row0 + lane / kRowThreads;
    const bool valid = row < rows;
    const int64_t t = valid ? row / p.num_heads : 0;
    const int h = valid ? static_cast<int>(row - t * p.num_heads) : 0;
    float wa = 0.f, wb = 0.f, lse = 0.f;
    if (valid) {
      const float la = p.lse_a[h * p.lse_a_stride[0] + t * p.lse_a_stride[1]];
      const float lb = p.lse_b[h * p.lse_b_stride[0] + t * p.lse_b_stride[1]];
      lse = merge_weights(la, lb, &wa, &wb);
    }
    __syncwarp();  // every LSE of these rows is read before any is overwritten
    if (valid && sub == 0 && p.lse_out) p.lse_out[h * p.lse_out_stride[0] + t * p.lse_out_stride[1]] = lse;
    if (!valid) continue;
    const int64_t ea = row_elem(p.a, t, h), eb = row_elem(p.b, t, h), eo = row_elem(p.out, t, h);
    for (int d = sub * N; d < p.head_size; d += kRowThreads * N) {
      float xa[N], xb[N], y[N];
      load_floats<N>(p.a.data, ea + d, p.a.dtype, N > 1, xa);
      load_floats<N>(p.b.data, eb + d, p.b.dtype, N > 1, xb);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = merge_value(xa[i], wa, xb[i], wb);
      store_floats<N>(p.out.data, eo + d, p.out.dtype, N > 1, y);
    }
  }
}

// ---- host side ------------------------------------------------------------------------------
constexpr std::string_view kWhere = "merge_states (cuda)";

Operand operand(const TensorView& t) {
  return Operand{t.data, t.dtype, t.strides[0], t.strides[1]};
}

bool vectorizable(const TensorView& t) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  auto ok = [](int64_t bytes) { return bytes % 16 == 0; };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && ok(t.strides[0] * es) &&
         ok(t.strides[1] * es);
}

void check_out(const TensorView& t, std::string_view name, int64_t T, int64_t H, int64_t D) {
  t.require_device(kWhere, name, Device::CUDA);
  t.require_shape(kWhere, name, {T, H, D});
  t.require_last_dim_contiguous(kWhere, name);
  ATTNKIT_REQUIRE(is_float(t.dtype), kWhere, std::string(name) + ".dtype", dtype_name(t.dtype),
                  "must be f32, f16 or bf16");
}

void check_lse(const TensorView& t, std::string_view name, int64_t T, int64_t H) {
  t.require_device(kWhere, name, Device::CUDA);
  t.require_dtype(kWhere, name, DType::f32);
  t.require_shape(kWhere, name, {H, T});
}

}  // namespace

void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse_out,
                  void* stream) {
  // The public merge_states validated everything; these checks guard what the kernel reads.
  out.require_ndim(kWhere, "out", 3);
  const int64_t T = out.shape[0], H = out.shape[1], D = out.shape[2];
  check_out(out_a, "out_a", T, H, D);
  check_out(out_b, "out_b", T, H, D);
  check_out(out, "out", T, H, D);
  check_lse(lse_a, "lse_a", T, H);
  check_lse(lse_b, "lse_b", T, H);
  if (lse_out.defined()) check_lse(lse_out, "lse_out", T, H);
  ATTNKIT_REQUIRE(H < (int64_t{1} << 31) && D < (int64_t{1} << 31), kWhere, "out.shape",
                  out.shape_str(), "heads and head_size must fit in 31 bits");
  if (T == 0 || H == 0) return;

  Args p;
  p.a = operand(out_a);
  p.b = operand(out_b);
  p.out = operand(out);
  p.lse_a = lse_a.ptr<const float>();
  p.lse_b = lse_b.ptr<const float>();
  p.lse_out = lse_out.defined() ? lse_out.ptr<float>() : nullptr;
  p.lse_a_stride[0] = lse_a.strides[0], p.lse_a_stride[1] = lse_a.strides[1];
  p.lse_b_stride[0] = lse_b.strides[0], p.lse_b_stride[1] = lse_b.strides[1];
  if (lse_out.defined()) p.lse_out_stride[0] = lse_out.strides[0], p.lse_out_stride[1] = lse_out.strides[1];
  p.num_tokens = T;
  p.num_heads = static_cast<int>(H);
  p.head_size = static_cast<int>(D);

  DeviceGuard guard(out.device_index);
  const bool vec = D % kVec == 0 && vectorizable(out_a) && vectorizable(out_b) && vectorizable(out);
  const int64_t rows = T * H;
  const int64_t blocks_needed = (rows + kRowsPerWarp * (kThreads / 32) - 1) / (kRowsPerWarp * (kThreads / 32));
  const int blocks = static_cast<int>(
      std::min<int64_t>(blocks_needed, static_cast<int64_t>(current_device_props().sm_count) * 16));
  const cudaStream_t s = as_stream(stream);
  if (vec) {
    merge_states_kernel<kVec><<<blocks, kThreads, 0, s>>>(p);
  } else {
    merge_states_kernel<1><<<blocks, kThreads, 0, s>>>(p);
  }
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace attnkit::cuda
