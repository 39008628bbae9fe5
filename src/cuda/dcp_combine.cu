// The DCP combine (include/attnkit/dcp.h): the local steps (cuda/dcp_combine.h) and, in a build
// with NCCL, the two collective paths between them on the caller's communicator and stream.
#include "cuda/dcp_combine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "attnkit/dcp.h"
#include "attnkit/detail/merge_rule.h"
#include "attnkit/error.h"
#include "core/dcp_combine_check.h"
#include "cuda/cuda_check.h"

#if defined(ATTNKIT_WITH_NCCL)
#include <nccl.h>
#endif

namespace attnkit::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block (one warp each)

// The merge of one row over n parts (LSEs at lse[r * stride]) and the sink.
struct RowMerge {
  float m = -INFINITY, sum = 0.f;
  __device__ __forceinline__ float weight(float lse) const {
    return m == -INFINITY ? 0.f : expf(sanitize_lse(lse) - m) / sum;
  }
  __device__ __forceinline__ float lse() const { return m == -INFINITY ? -INFINITY : m + logf(sum); }
};
__device__ __forceinline__ RowMerge merge_of(const float* lse, int64_t stride, int n, float sink) {
  RowMerge r;
  r.m = sanitize_lse(sink);
  for (int i = 0; i < n; ++i) r.m = fmaxf(r.m, sanitize_lse(lse[i * stride]));
  if (r.m == -INFINITY) return r;
  r.sum = expf(sanitize_lse(sink) - r.m);  // (exp(-inf) = 0: no sink)
  for (int i = 0; i < n; ++i) r.sum += expf(sanitize_lse(lse[i * stride]) - r.m);
  return r;
}

template <class T>
__device__ __forceinline__ float load_f(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(*p);
  else return __bfloat162float(*p);
}
template <class T>
__device__ __forceinline__ void store_f(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) *p = v;
  else if constexpr (std::is_same_v<T, __half>) *p = __float2half_rn(v);
  else *p = __float2bfloat16_rn(v);
}

struct Rows {  // a [T, H, D] view, element strides
  const void* data;
  int64_t st, sh;
};
struct OutRows {
  void* data;
  int64_t st, sh;
};

template <class E>
__global__ void weigh_kernel(DcpShape s, Rows po, const float* lse_all, const float* sinks, float* send) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= s.tokens * s.heads) return;
  const int lane = threadIdx.x & 31, H = s.heads, Hs = s.slice(), D = s.head_size;
  const int64_t T = s.tokens, t = row / H;
  const int h = static_cast<int>(row % H);
  const int64_t at = h * T + t;
  const RowMerge rm = merge_of(lse_all + at, int64_t{H} * T, s.world, sinks ? sinks[h] : -INFINITY);
  const float w = rm.weight(lse_all[int64_t{s.rank} * H * T + at]);
  float* dst = send + ((int64_t{h / Hs} * T + t) * Hs + h % Hs) * D;
  const E* src = static_cast<const E*>(po.data) + t * po.st + h * po.sh;
  for (int d = lane; d < D; d += 32) dst[d] = w == 0.f ? 0.f : w * load_f(src + d);  // (an empty part: exactly 0)
}

template <class E>
__global__ void finish_kernel(DcpShape s, const float* recv, const float* lse_all, const float* sinks, OutRows out,
                              float* out_lse) {
  const int Hs = s.slice(), H = s.heads, D = s.head_size;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32, T = s.tokens;
  if (row >= T * Hs) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / Hs;
  const int hh = static_cast<int>(row % Hs), h = s.rank * Hs + hh;
  const float* src = recv + (t * Hs + hh) * D;
  E* dst = static_cast<E*>(out.data) + t * out.st + hh * out.sh;
  for (int d = lane; d < D; d += 32) store_f(dst + d, src[d]);
  if (lane == 0 && out_lse != nullptr) {
    const RowMerge rm = merge_of(lse_all + h * T + t, int64_t{H} * T, s.world, sinks ? sinks[h] : -INFINITY);
    out_lse[hh * T + t] = rm.lse();
  }
}

template <class E>
__global__ void pack_kernel(DcpShape s, Rows po, const float* lse, float* send_o, float* send_lse) {
  const int H = s.heads, Hs = s.slice(), D = s.head_size;
  const int64_t T = s.tokens, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < T * H * D) {
    const int64_t t = i / (int64_t{H} * D);
    const int h = static_cast<int>(i / D % H), d = static_cast<int>(i % D);
    send_o[((int64_t{h / Hs} * T + t) * Hs + h % Hs) * D + d] =
        load_f(static_cast<const E*>(po.data) + t * po.st + h * po.sh + d);
  }
  if (i < T * H) {  // (LSE [H][T] -> [N][Hs][T]: the same order)
    send_lse[i] = lse[i];
  }
}

template <class E>
__global__ void merge_kernel(DcpShape s, const float* recv_o, const float* recv_lse, const float* sinks, OutRows out,
                             float* out_lse) {
  const int Hs = s.slice(), D = s.head_size;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32, T = s.tokens;
  if (row >= T * Hs) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / Hs;
  const int hh = static_cast<int>(row % Hs), h = s.rank * Hs + hh;
  const RowMerge rm = merge_of(recv_lse + hh * T + t, int64_t{Hs} * T, s.world, sinks ? sinks[h] : -INFINITY);
  E* dst = static_cast<E*>(out.data) + t * out.st + hh * out.sh;
  for (int d = lane; d < D; d += 32) {
    float v = 0.f;
    for (int r = 0; r < s.world; ++r) {
      const float w = rm.weight(recv_lse[(int64_t{r} * Hs + hh) * T + t]);
      if (w != 0.f) v += w * recv_o[((int64_t{r} * T + t) * Hs + hh) * D + d];
    }
    store_f(dst + d, v);
  }
  if (lane == 0 && out_lse != nullptr) out_lse[hh * T + t] = rm.lse();
}

template <class F>
void with_dtype(DType t, const char* where, const char* name, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f16: return f.template operator()<__half>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    default: break;
  }
  fail(where, name, dtype_name(t), "must be f32, f16 or bf16");
}

Rows rows_of(const TensorView& v) { return {v.data, v.stride(0), v.stride(1)}; }
OutRows out_rows_of(const TensorView& v) { return {v.data, v.stride(0), v.stride(1)}; }
unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

void dcp_weigh_for_reduce_scatter(const DcpShape& s, const TensorView& po, const float* lse_all, const float* sinks,
                                  float* send, void* stream) {
  if (s.tokens * s.heads == 0) return;
  with_dtype(po.dtype, "dcp combine", "partial_out.dtype", [&]<class T>() {
    weigh_kernel<T><<<blocks_for(s.tokens * s.heads), kWarps * 32, 0, as_stream(stream)>>>(s, rows_of(po), lse_all,
                                                                                           sinks, send);
  });
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
}

void dcp_finish_reduce_scatter(const DcpShape& s, const float* recv, const float* lse_all, const float* sinks,
                               const TensorView& out, float* out_lse, void* stream) {
  if (s.tokens * s.slice() == 0) return;
  with_dtype(out.dtype, "dcp combine", "out.dtype", [&]<class T>() {
    finish_kernel<T><<<blocks_for(s.tokens * s.slice()), kWarps * 32, 0, as_stream(stream)>>>(
        s, recv, lse_all, sinks, out_rows_of(out), out_lse);
  });
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
}

void dcp_pack_all_to_all(const DcpShape& s, const TensorView& po, const float* partial_lse, float* send_o,
                         float* send_lse, void* stream) {
  const int64_t n = s.tokens * s.heads * s.head_size;
  if (n == 0) return;
  with_dtype(po.dtype, "dcp combine", "partial_out.dtype", [&]<class T>() {
    pack_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, as_stream(stream)>>>(s, rows_of(po), partial_lse,
                                                                                           send_o, send_lse);
  });
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
}

void dcp_merge_all_to_all(const DcpShape& s, const float* recv_o, const float* recv_lse, const float* sinks,
                          const TensorView& out, float* out_lse, void* stream) {
  if (s.tokens * s.slice() == 0) return;
  with_dtype(out.dtype, "dcp combine", "out.dtype", [&]<class T>() {
    merge_kernel<T><<<blocks_for(s.tokens * s.slice()), kWarps * 32, 0, as_stream(stream)>>>(
        s, recv_o, recv_lse, sinks, out_rows_of(out), out_lse);
  });
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace attnkit::cuda

namespace attnkit {

namespace {

constexpr std::string_view kWhere = "dcp_combine";

#if defined(ATTNKIT_WITH_NCCL)
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string(kWhere), what, std::string("NCCL error: ") + ncclGetErrorString(r));
}
#endif

}  // namespace

bool dcp_combine_available() {
#if defined(ATTNKIT_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

void dcp_combine(const DcpCombineArgs& a) {
  const DcpCombineLayout l = dcp_combine_check(a);  // (shapes, dtypes, devices, the workspace: dcp.cpp)
#if !defined(ATTNKIT_WITH_NCCL)
  (void)l;
  throw Error(std::string(kWhere), "nccl", "this attnkit was built without NCCL (CMake found no nccl.h / libnccl): "
                                           "decode context parallelism's combine is absent");
#else
  auto comm = static_cast<ncclComm_t>(a.nccl_comm);
  int count = 0, rank = -1;
  nccl_check(ncclCommCount(comm, &count), "ncclCommCount");
  nccl_check(ncclCommUserRank(comm, &rank), "ncclCommUserRank");
  ATTNKIT_REQUIRE(count == a.shard.world_size, kWhere, "communicator size", count,
                  "must equal the shard's world size " + std::to_string(a.shard.world_size));
  ATTNKIT_REQUIRE(rank == a.shard.rank, kWhere, "communicator rank", rank,
                  "must equal the shard's rank " + std::to_string(a.shard.rank));
  cuda::DcpShape s;
  s.tokens = l.tokens;
  s.heads = l.heads;
  s.head_size = l.head_size;
  s.world = a.shard.world_size;
  s.rank = a.shard.rank;
  const auto stream = cuda::as_stream(a.stream);
  char* ws = static_cast<char*>(a.workspace);
  const float* sinks = a.sinks.defined() ? a.sinks.ptr<const float>() : nullptr;
  float* out_lse = a.out_lse.defined() ? a.out_lse.ptr<float>() : nullptr;
  const size_t slice_rows = static_cast<size_t>(s.tokens) * s.slice() * s.head_size;
  if (a.path == DcpCombinePath::all_gather_reduce_scatter) {
    auto* lse_all = reinterpret_cast<float*>(ws + l.offsets[0]);
    auto* send = reinterpret_cast<float*>(ws + l.offsets[1]);
    auto* recv = reinterpret_cast<float*>(ws + l.offsets[2]);
    nccl_check(ncclAllGather(a.partial_lse.data, lse_all, static_cast<size_t>(s.heads) * s.tokens, ncclFloat, comm, stream),
               "ncclAllGather");
    cuda::dcp_weigh_for_reduce_scatter(s, a.partial_out, lse_all, sinks, send, a.stream);
    nccl_check(ncclReduceScatter(send, recv, slice_rows, ncclFloat, ncclSum, comm, stream), "ncclReduceScatter");
    cuda::dcp_finish_reduce_scatter(s, recv, lse_all, sinks, a.out, out_lse, a.stream);
  } else {
    auto* send_o = reinterpret_cast<float*>(ws + l.offsets[0]);
    auto* send_lse = reinterpret_cast<float*>(ws + l.offsets[1]);
    auto* recv_o = reinterpret_cast<float*>(ws + l.offsets[2]);
    auto* recv_lse = reinterpret_cast<float*>(ws + l.offsets[3]);
    cuda::dcp_pack_all_to_all(s, a.partial_out, a.partial_lse.ptr<const float>(), send_o, send_lse, a.stream);
    const size_t lse_chunk = static_cast<size_t>(s.slice()) * s.tokens;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int j = 0; j < s.world; ++j) {
      nccl_check(ncclSend(send_o + j * slice_rows, slice_rows, ncclFloat, j, comm, stream), "ncclSend");
      nccl_check(ncclRecv(recv_o + j * slice_rows, slice_rows, ncclFloat, j, comm, stream), "ncclRecv");
      nccl_check(ncclSend(send_lse + j * lse_chunk, lse_chunk, ncclFloat, j, comm, stream), "ncclSend");
      nccl_check(ncclRecv(recv_lse + j * lse_chunk, lse_chunk, ncclFloat, j, comm, stream), "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    cuda::dcp_merge_all_to_all(s, recv_o, recv_lse, sinks, a.out, out_lse, a.stream);
  }
#endif
}

}  // namespace attnkit
