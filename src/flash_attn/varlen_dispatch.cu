// run_varlen_attention: VarlenArgs -> kernel parameters, and the one place where runtime
// values (dtype, cache dtype, head size, decode vs prefill shape) choose a compiled kernel.
#include <algorithm>
#include <cmath>
#include <string>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/fp8_dequant.h"
#include "cuda/device_props.h"
#include "cuda/split_kv_combine.h"
#include "flash_attn/hopper_traits.h"
#include "cuda/split_workspace.h"
#include "flash_attn/varlen_launch.h"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn {

namespace {

constexpr const char* kWhere = "flash_attn varlen attention";
constexpr int kMaxSplits = 256;
// Packed rows (query tokens x GQA group) up to which one 16-row tile with the warps split
// over the keys serves a request better than 128-row tiles.
constexpr int kDecodeMaxPackedRows = 16;

template <class Elem, int kHeadDim, bool kFp8>
void launch_config(const VarlenKernelParams& p, const VarlenLaunchShape& shape, Generation generation,
                   cudaStream_t stream) {
  if (static_cast<int64_t>(shape.max_query_len) * p.group <= kDecodeMaxPackedRows) {
    launch_decode<Elem, kHeadDim, kFp8>(p, shape, stream);
    return;
  }
  if constexpr (!kFp8 && (kHeadDim == 64 || kHeadDim == 128)) {
    // Split launches (decode-heavy batches with few requests) stay on the mma_sync kernel,
    // whose epilogue writes and merges split partials; so do caches whose K and V strides
    // differ (the hopper producer computes one set of page offsets for both).
    const bool same_kv_strides = p.k_stride_block == p.v_stride_block && p.k_stride_slot == p.v_stride_slot;
    if (generation == Generation::hopper && p.num_splits == 1 && same_kv_strides && hopper_kernels_available()) {
      launch_hopper<Elem, kHeadDim>(p, shape, stream);
      return;
    }
  }
  launch_varlen<PrefillTraits<Elem, kHeadDim, kFp8>>(p, shape, stream);
}

template <class Elem, bool kFp8>
void launch_head_dim(int head_size, const VarlenKernelParams& p, const VarlenLaunchShape& shape, Generation g,
                     cudaStream_t stream) {
  switch (head_size) {
    case 64: return launch_config<Elem, 64, kFp8>(p, shape, g, stream);
    case 96: return launch_config<Elem, 96, kFp8>(p, shape, g, stream);
    case 128: return launch_config<Elem, 128, kFp8>(p, shape, g, stream);
    case 192: return launch_config<Elem, 192, kFp8>(p, shape, g, stream);
    case 256: return launch_config<Elem, 256, kFp8>(p, shape, g, stream);
    default:
      fail(kWhere, "head_size", head_size, "must be one of 64, 96, 128, 192, 256");
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

void require_f32_vector(const TensorView& t, const char* name, int64_t min_len) {
  if (!t.defined()) return;
  t.require_dtype(kWhere, name, DType::f32);
  t.require_device(kWhere, name, Device::CUDA);
  t.require_ndim(kWhere, name, 1);
  ATTNKIT_REQUIRE(t.size(0) >= min_len, kWhere, std::string(name) + ".shape", t.shape_str(),
                  "must hold at least " + std::to_string(min_len) + " values");
}

// Per-tensor ([1]) or per-KV-head ([num_kv_heads]) fp8 scale: element stride for kv_head.
int64_t scale_stride(const TensorView& t, const char* name, int num_kv_heads) {
  if (!t.defined()) return 0;
  require_f32_vector(t, name, 1);
  ATTNKIT_REQUIRE(t.size(0) == 1 || t.size(0) == num_kv_heads, kWhere, std::string(name) + ".shape",
                  t.shape_str(), "must be [1] or [num_kv_heads = " + std::to_string(num_kv_heads) + "]");
  return t.size(0) == 1 ? 0 : t.stride(0);
}

}  // namespace

VarlenKernelParams varlen_kernel_params(const VarlenArgs& a) {
  const TensorView& q = a.q;
  const PagedKV& c = a.cache;
  const AttentionParams& ap = a.params;
  q.require_device(kWhere, "q", Device::CUDA);
  q.require_ndim(kWhere, "q", 3);
  q.require_last_dim_contiguous(kWhere, "q");
  ATTNKIT_REQUIRE(q.dtype == DType::bf16 || q.dtype == DType::f16, kWhere, "q.dtype",
                  dtype_name(q.dtype), "must be bf16 or f16");
  const int head_size = static_cast<int>(q.size(2));
  ATTNKIT_REQUIRE(q.size(1) == a.num_heads, kWhere, "q.shape", q.shape_str(),
                  "dim 1 must be num_heads = " + std::to_string(a.num_heads));
  a.out.require_device(kWhere, "out", Device::CUDA);
  a.out.require_dtype(kWhere, "out", q.dtype);
  a.out.require_shape(kWhere, "out", {q.size(0), q.size(1), q.size(2)});
  a.out.require_last_dim_contiguous(kWhere, "out");
  ATTNKIT_REQUIRE(c.device == Device::CUDA, kWhere, "cache.device", device_name(c.device), "must be cuda");
  ATTNKIT_REQUIRE(c.dtype == q.dtype || is_fp8(c.dtype), kWhere, "cache.dtype", dtype_name(c.dtype),
                  std::string("must equal q.dtype (") + std::string(dtype_name(q.dtype)) +
                      ") or be fp8_e4m3 / fp8_e5m2 for this kernel");
  ATTNKIT_REQUIRE(c.head_size == head_size, kWhere, "cache.head_size", c.head_size,
                  "must equal q's head size " + std::to_string(head_size));
  ATTNKIT_REQUIRE(c.num_kv_heads > 0 && a.num_heads % c.num_kv_heads == 0, kWhere, "cache.num_kv_heads",
                  c.num_kv_heads, "must divide num_heads = " + std::to_string(a.num_heads));
  ATTNKIT_REQUIRE(c.block_size > 0 && c.block_size % 16 == 0, kWhere, "cache.block_size", c.block_size,
                  "must be a positive multiple of 16");
  ATTNKIT_REQUIRE(a.num_splits >= 1 && a.num_splits <= kMaxSplits, kWhere, "num_splits", a.num_splits,
                  "must be in [1, " + std::to_string(kMaxSplits) + "]");
  ATTNKIT_REQUIRE(ap.softcap >= 0.f, kWhere, "params.softcap", ap.softcap, "must be >= 0");
  ATTNKIT_REQUIRE(ap.window_left >= -1 && ap.window_right >= -1, kWhere, "params.window",
                  std::to_string(ap.window_left) + ", " + std::to_string(ap.window_right),
                  "each side must be >= -1 (-1 = unbounded)");

  // 16-byte vector access: bases and row strides.
  const int vec = is_fp8(c.dtype) ? 16 : 8;  // elements per 16 bytes
  const bool io_aligned = aligned16(q.data) && aligned16(a.out.data) && q.stride(0) % 8 == 0 &&
                          q.stride(1) % 8 == 0 && a.out.stride(0) % 8 == 0 && a.out.stride(1) % 8 == 0;
  ATTNKIT_REQUIRE(io_aligned, kWhere, "q / out strides", q.shape_str(),
                  "q and out must be 16-byte aligned with token and head strides multiple of 8 elements");
  const bool cache_aligned =
      aligned16(c.k.base) && aligned16(c.v.base) && c.k.stride_block % vec == 0 && c.k.stride_slot % vec == 0 &&
      c.k.stride_head % vec == 0 && c.v.stride_block % vec == 0 && c.v.stride_slot % vec == 0 &&
      c.v.stride_head % vec == 0;
  ATTNKIT_REQUIRE(cache_aligned, kWhere, "cache strides", c.k.stride_slot,
                  "cache rows must be 16-byte aligned (base and strides)");

  VarlenKernelParams p;
  p.q = q.data;
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out = a.out.data;
  p.out_stride_token = a.out.stride(0);
  p.out_stride_head = a.out.stride(1);
  p.num_tokens = q.size(0);
  p.k_cache = c.k.base;
  p.v_cache = c.v.base;
  const int64_t elem = static_cast<int64_t>(dtype_size(c.dtype));
  const auto byte_stride = [&](int64_t stride, int64_t max_index, const char* name) {
    const int64_t bytes = stride * elem;
    ATTNKIT_REQUIRE(bytes >= 0 && bytes * std::max<int64_t>(max_index, 1) < (int64_t(1) << 31), kWhere, name,
                    stride, "a cache block must span < 2 GiB (the kernel keeps 32-bit in-block offsets)");
    return static_cast<int32_t>(bytes);
  };
  p.k_stride_block = byte_stride(c.k.stride_block, 1, "cache.k.stride_block");
  p.k_stride_slot = byte_stride(c.k.stride_slot, c.block_size, "cache.k.stride_slot");
  p.k_stride_head = byte_stride(c.k.stride_head, c.num_kv_heads, "cache.k.stride_head");
  p.v_stride_block = byte_stride(c.v.stride_block, 1, "cache.v.stride_block");
  p.v_stride_slot = byte_stride(c.v.stride_slot, c.block_size, "cache.v.stride_slot");
  p.v_stride_head = byte_stride(c.v.stride_head, c.num_kv_heads, "cache.v.stride_head");
  p.block_size = cuda::FastDivmod(c.block_size);
  p.num_blocks = c.num_blocks;
  p.fp8_format = static_cast<int>(c.dtype == DType::fp8_e5m2 ? cuda::Fp8Format::e5m2 : cuda::Fp8Format::e4m3);
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.seqused_k = a.seqused_k;
  p.block_table = a.block_table;
  p.max_blocks_per_req = a.max_blocks_per_req;
  p.num_reqs = a.num_reqs;
  p.num_heads = a.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.group = a.num_heads / c.num_kv_heads;

  p.scale = ap.resolved_scale(head_size);
  p.causal = ap.causal;
  p.window_left = ap.window_left;
  p.window_right = ap.window_right;
  p.softcap = ap.softcap;
  require_f32_vector(ap.alibi_slopes, "params.alibi_slopes", a.num_heads);
  require_f32_vector(ap.sinks, "params.sinks", a.num_heads);
  if (ap.alibi_slopes.defined()) {
    p.alibi_slopes = ap.alibi_slopes.ptr<const float>();
    p.alibi_stride = ap.alibi_slopes.stride(0);
  }
  if (ap.sinks.defined()) {
    p.sinks = ap.sinks.ptr<const float>();
    p.sinks_stride = ap.sinks.stride(0);
  }
  if (is_fp8(c.dtype)) {
    p.k_scale_stride = scale_stride(ap.k_scale, "params.k_scale", c.num_kv_heads);
    p.v_scale_stride = scale_stride(ap.v_scale, "params.v_scale", c.num_kv_heads);
    p.k_scale = ap.k_scale.defined() ? ap.k_scale.ptr<const float>() : nullptr;
    p.v_scale = ap.v_scale.defined() ? ap.v_scale.ptr<const float>() : nullptr;
  }
  if (ap.lse.defined()) {
    ap.lse.require_dtype(kWhere, "params.lse", DType::f32);
    ap.lse.require_device(kWhere, "params.lse", Device::CUDA);
    ap.lse.require_shape(kWhere, "params.lse", {a.num_heads, q.size(0)});
    p.lse = ap.lse.ptr<float>();
    p.lse_stride_head = ap.lse.stride(0);
    p.lse_stride_token = ap.lse.stride(1);
  }

  p.num_splits = a.num_splits;
  p.l2_prefetch = a.l2_prefetch && a.enable_pdl;
  p.kv_evict_first = a.kv_evict_first && a.num_splits > 1;  // (where it measured faster: VarlenArgs)
  p.cta_trace = a.cta_trace;
  const size_t need = varlen_workspace_bytes(q.size(0), a.num_heads, head_size, a.num_splits);
  if (need > 0) {  // (a batch without tokens needs none)
    ATTNKIT_REQUIRE(a.workspace != nullptr && a.workspace_bytes >= need && aligned16(a.workspace), kWhere,
                    "workspace_bytes", a.workspace_bytes,
                    "split-KV needs a 16-byte aligned workspace of varlen_workspace_bytes() = " +
                        std::to_string(need) + " bytes");
    p.partials = cuda::split_partials_in(a.workspace, a.workspace_bytes, q.size(0), a.num_heads, head_size,
                                         a.num_splits);
  }
  return p;
}

bool hopper_kernels_available() {
#ifdef ATTNKIT_SM90A_BUILT
  const auto& props = cuda::current_device_props();
  return props.cc_major == 9 && props.cc_minor == 0;
#else
  return false;
#endif
}

void varlen_workspace_init(void* workspace, size_t bytes, void* stream) {
  ATTNKIT_REQUIRE(workspace != nullptr || bytes == 0, "flash_attn varlen workspace init", "bytes", bytes,
                  "a workspace of > 0 bytes needs a device pointer");
  const size_t counters = cuda::split_counter_region_bytes(bytes);
  if (counters > 0) ATTNKIT_CUDA_CHECK(cudaMemsetAsync(workspace, 0, counters, cuda::as_stream(stream)));
}

void run_varlen_attention(const VarlenArgs& args) {
  ATTNKIT_REQUIRE(args.max_ctas >= 0, kWhere, "max_ctas", args.max_ctas, "must be >= 0 (0: one CTA per SM)");
  ATTNKIT_REQUIRE(args.transposed_stages == 0 || args.transposed_stages == 2 || args.transposed_stages == 3, kWhere,
                  "transposed_stages", args.transposed_stages, "must be 0 (the launcher's choice), 2 or 3");
  ATTNKIT_REQUIRE(args.hopper_q_buffers >= 0 && args.hopper_q_buffers <= 2, kWhere, "hopper_q_buffers",
                  args.hopper_q_buffers, "must be 0 (the launcher's choice), 1 or 2");
  const VarlenKernelParams p = varlen_kernel_params(args);
  if (p.num_tokens == 0 || args.num_reqs == 0) return;
  VarlenLaunchShape shape;
  shape.max_query_len = args.max_query_len;
  shape.enable_pdl = args.enable_pdl;
  shape.max_seq_len = args.max_seq_len;
  shape.max_ctas = args.max_ctas;
  shape.q_buffers = args.hopper_q_buffers;
  shape.cluster_merge = args.cluster_split_merge;
  shape.kv_fill = static_cast<int>(args.kv_fill);
  shape.transposed_decode = args.transposed_decode;
  shape.transposed_stages = args.transposed_stages;
  const cudaStream_t stream = cuda::as_stream(args.stream);
  const bool fp8 = is_fp8(args.cache.dtype);
  const int head_size = static_cast<int>(args.q.size(2));
  const Generation g = args.generation;
  if (args.q.dtype == DType::bf16) {
    if (fp8) launch_head_dim<__nv_bfloat16, true>(head_size, p, shape, g, stream);
    else launch_head_dim<__nv_bfloat16, false>(head_size, p, shape, g, stream);
  } else {
    if (fp8) launch_head_dim<__half, true>(head_size, p, shape, g, stream);
    else launch_head_dim<__half, false>(head_size, p, shape, g, stream);
  }
}

}  // namespace attnkit::flash_attn
