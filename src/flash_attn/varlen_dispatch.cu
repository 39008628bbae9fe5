// run_varlen_attention: VarlenArgs -> kernel parameters and launch facts, the plan of
// choose_launch (launch_plan.cpp, where every launch choice is made), and the map from the
// runtime dtype / cache kind / head size and the plan's tile to a compiled kernel.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "attnkit/error.h"
#include "core/cuda_archs.h"
#include "cuda/cuda_check.h"
#include "cuda/device_errors.h"
#include "cuda/fp8_dequant.h"
#include "cuda/device_props.h"
#include "cuda/split_kv_combine.h"
#include "cuda/split_workspace.h"
#include "cuda/tensor_map.h"
#include "flash_attn/hopper_traits.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/varlen_launch.h"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn {

namespace {

constexpr const char* kWhere = "flash_attn varlen attention";
constexpr int kMaxSplits = 256;

// The plan's head dim (tile_head_dim: the runtime head size rounded up to its tile's dim) -> its instantiation.
template <class Elem, CacheKind kCache>
void launch_head_dim(const VarlenKernelParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  static_assert(kCache != CacheKind::nvfp4, "nvfp4 caches are read by the planned launches only");
  constexpr bool kFp8 = kCache == CacheKind::fp8;
  auto run = [&]<int kHeadDim>() {
    if constexpr (tile_instantiated(TileId::hopper, kHeadDim, kCache)) {
      if (plan.generation == Generation::hopper) return launch_hopper<Elem, kHeadDim, kCache>(p, plan, stream);
    }
    launch_mma_sync<Elem, kHeadDim, kCache>(p, plan, stream);
  };
  static_assert(std::size(kMmaSyncHeadDims) == 7, "one case per compiled head dim");
  switch (plan.head_dim) {
    case 64: return run.template operator()<64>();
    case 80: if constexpr (!kFp8) return run.template operator()<80>(); break;
    case 96: return run.template operator()<96>();
    case 128: return run.template operator()<128>();
    case 192: return run.template operator()<192>();
    case 256: return run.template operator()<256>();
    case 512: return run.template operator()<512>();
  }
  fail(kWhere, "head dim", plan.head_dim, "has no kernels" + std::string(kFp8 ? " for fp8 caches" : ""));
}

// The geometry of one cache side as a TMA map sees it (cuda/tensor_map.h).
cuda::PagedSideGeometry side_geometry(const VarlenKernelParams& q, bool v_side, int row_bytes) {
  cuda::PagedSideGeometry g;
  g.row_bytes = row_bytes;
  g.block_size = q.block_size.divisor;
  g.num_kv_heads = q.num_kv_heads;
  g.num_blocks = q.num_blocks;
  g.base = v_side ? q.v_cache : q.k_cache;
  g.stride_block = v_side ? q.v_stride_block : q.k_stride_block;
  g.stride_slot = v_side ? q.v_stride_slot : q.k_stride_slot;
  g.stride_head = v_side ? q.v_stride_head : q.k_stride_head;
  return g;
}

// The tensor maps of the K and V sides (PagedSideGeometry), or false where the cache has none.
bool encode_kv_maps(VarlenKernelParams& q, int row_bytes) {
  const cuda::PagedSideGeometry k = side_geometry(q, false, row_bytes), v = side_geometry(q, true, row_bytes);
  return cuda::encode_paged_side_map(k, q.k_map, nullptr) && cuda::encode_paged_side_map(v, q.v_map, nullptr);
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
  ATTNKIT_REQUIRE(c.dtype == q.dtype || is_fp8(c.dtype) || c.dtype == DType::nvfp4, kWhere, "cache.dtype",
                  dtype_name(c.dtype),
                  std::string("must equal q.dtype (") + std::string(dtype_name(q.dtype)) +
                      ") or be fp8_e4m3 / fp8_e5m2 / nvfp4 for this kernel");
  const CacheKind kind = cache_kind_of(c.dtype);
  const bool fp4 = kind == CacheKind::nvfp4;
  ATTNKIT_REQUIRE(c.head_size == head_size, kWhere, "cache.head_size", c.head_size,
                  "must equal q's head size " + std::to_string(head_size));
  ATTNKIT_REQUIRE(kernel_head_dim(head_size, kind, /*planned=*/fp4) > 0, kWhere, "head_size", head_size,
                  head_size_rule(kind, fp4));
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
  const int vec = kind == CacheKind::b16 ? 8 : 16;  // elements (bytes for fp8 / nvfp4) per 16 bytes
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
  if (fp4) {  // (block-scale rows are copied in 4-byte chunks)
    auto aligned4 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 3u) == 0; };
    const bool scales_aligned = aligned4(c.k.scale_base) && aligned4(c.v.scale_base) &&
                                c.k.scale_stride_block % 4 == 0 && c.k.scale_stride_slot % 4 == 0 &&
                                c.k.scale_stride_head % 4 == 0 && c.v.scale_stride_block % 4 == 0 &&
                                c.v.scale_stride_slot % 4 == 0 && c.v.scale_stride_head % 4 == 0;
    ATTNKIT_REQUIRE(c.k.scale_base != nullptr && c.v.scale_base != nullptr && scales_aligned, kWhere,
                    "cache block scales", c.k.scale_stride_slot,
                    "an nvfp4 cache needs its block-scale rows (KVCacheSpec::view), 4-byte aligned");
  }

  VarlenKernelParams p;
  p.head_size = head_size;
  p.kv_row_bytes = kv_row_bytes(head_size, kind);
  p.q = q.data;
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out = a.out.data;
  p.out_stride_token = a.out.stride(0);
  p.out_stride_head = a.out.stride(1);
  p.num_tokens = q.size(0);
  p.k_cache = c.k.base;
  p.v_cache = c.v.base;
  const int64_t elem = fp4 ? 1 : static_cast<int64_t>(dtype_size(c.dtype));  // (nvfp4 strides are bytes)
  const auto byte_stride = [&](int64_t stride, int64_t max_index, const char* name) {
    const int64_t bytes = stride * elem;
    ATTNKIT_REQUIRE(bytes >= 0 && bytes * std::max<int64_t>(max_index, 1) < (int64_t(1) << 31), kWhere, name,
                    stride, "a cache block must span < 2 GiB (the kernel keeps 32-bit in-block offsets)");
    return static_cast<int32_t>(bytes);
  };
  // (block, slot, head) strides of one side's rows -> bytes, checked
  auto side_strides = [&](int64_t block, int64_t slot, int64_t head, const std::string& name, int32_t& b,
                          int32_t& s, int32_t& h) {
    b = byte_stride(block, 1, (name + ".stride_block").c_str());
    s = byte_stride(slot, c.block_size, (name + ".stride_slot").c_str());
    h = byte_stride(head, c.num_kv_heads, (name + ".stride_head").c_str());
  };
  side_strides(c.k.stride_block, c.k.stride_slot, c.k.stride_head, "cache.k", p.k_stride_block, p.k_stride_slot,
               p.k_stride_head);
  side_strides(c.v.stride_block, c.v.stride_slot, c.v.stride_head, "cache.v", p.v_stride_block, p.v_stride_slot,
               p.v_stride_head);
  if (fp4) {
    p.k_block_scales = c.k.scale_base;
    p.v_block_scales = c.v.scale_base;
    side_strides(c.k.scale_stride_block, c.k.scale_stride_slot, c.k.scale_stride_head, "cache.k.scale",
                 p.k_bscale_stride_block, p.k_bscale_stride_slot, p.k_bscale_stride_head);
    side_strides(c.v.scale_stride_block, c.v.scale_stride_slot, c.v.scale_stride_head, "cache.v.scale",
                 p.v_bscale_stride_block, p.v_bscale_stride_slot, p.v_bscale_stride_head);
  }
  p.block_size = cuda::FastDivmod(c.block_size);
  // (block ids are int32: a block past 2^31 - 1 cannot be named, so the guards' bound fits 32 bits)
  ATTNKIT_REQUIRE(c.num_blocks >= 0 && c.num_blocks <= 0x7fffffff, kWhere, "cache.num_blocks", c.num_blocks,
                  "must be in [0, 2^31) (block ids are int32)");
  p.num_blocks = c.num_blocks;
  p.fp8_format = static_cast<int>(c.dtype == DType::fp8_e5m2 ? cuda::Fp8Format::e5m2 : cuda::Fp8Format::e4m3);
  p.cu_seqlens_q = a.cu_seqlens_q;
  if (a.cu_seqlens_k != nullptr) {  // contiguous K/V: the view of contiguous_kv_view
    const bool view = c.block_size == 16 && c.k.stride_block == c.k.stride_slot && c.v.stride_block == c.v.stride_slot;
    ATTNKIT_REQUIRE(view, kWhere, "cache (contiguous K/V)", c.block_size,
                    "must be contiguous_kv_view's view (16-row blocks starting at every row)");
    ATTNKIT_REQUIRE(a.seqused_k != nullptr, kWhere, "seqused_k", "nullptr",
                    "contiguous K/V need each request's key count (seqused_k)");
    p.cu_seqlens_k = a.cu_seqlens_k;
  }
  p.seqused_k = a.seqused_k;
  p.block_table = a.block_table;
  p.max_blocks_per_req = a.max_blocks_per_req;
  p.num_reqs = a.num_reqs;
  p.num_heads = a.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.group = cuda::FastDivmod(a.num_heads / c.num_kv_heads);

  p.scale = ap.resolved_scale(head_size);
  p.causal = ap.causal;
  p.window_left = ap.window_left;
  p.window_right = ap.window_right;
  p.softcap = ap.softcap;
  if (ap.alibi_slopes.defined() && ap.alibi_slopes.ndim == 2) {  // one row of slopes per request
    ap.alibi_slopes.require_dtype(kWhere, "params.alibi_slopes", DType::f32);
    ap.alibi_slopes.require_device(kWhere, "params.alibi_slopes", Device::CUDA);
    ap.alibi_slopes.require_shape(kWhere, "params.alibi_slopes", {a.num_reqs, a.num_heads});
  } else {
    require_f32_vector(ap.alibi_slopes, "params.alibi_slopes", a.num_heads);
  }
  require_f32_vector(ap.sinks, "params.sinks", a.num_heads);
  if (ap.alibi_slopes.defined()) {
    p.alibi_slopes = ap.alibi_slopes.ptr<const float>();
    p.alibi_stride = ap.alibi_slopes.stride(ap.alibi_slopes.ndim - 1);
    p.alibi_req_stride = ap.alibi_slopes.ndim == 2 ? ap.alibi_slopes.stride(0) : 0;
  }
  if (ap.sinks.defined()) {
    p.sinks = ap.sinks.ptr<const float>();
    p.sinks_stride = ap.sinks.stride(0);
  }
  if (kind != CacheKind::b16) {  // (fp8 dequant scales, nvfp4 global scales)
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

static LaunchFacts varlen_launch_facts(const VarlenArgs& a, const VarlenKernelParams& p) {
  const cuda::DeviceProps& dev = cuda::current_device_props();
  LaunchFacts f;
  // The architecture of the code this device runs (core/cuda_archs.h): TMA, clusters and PDL
  // exist in sm90 code only, so a compute_80 PTX build on an sm90 device launches as sm80.
  const int code_cc = cuda_code_cc(built_cuda_archs(), dev.cc_major * 10 + dev.cc_minor);
  ATTNKIT_REQUIRE(code_cc > 0, kWhere, "device", "sm" + std::to_string(dev.cc_major * 10 + dev.cc_minor),
                  "has no code in this build (it contains " + describe_cuda_archs(built_cuda_archs()) +
                      "; CMake ATTNKIT_CUDA_ARCHS)");
  f.cc_major = code_cc / 10;
  f.sm_count = dev.sm_count;
  f.hopper_kernels = hopper_kernels_available();
  f.preferred = a.generation;
  f.head_size = static_cast<int>(a.q.size(2));
  f.cache = cache_kind_of(a.cache.dtype);
  f.same_kv_strides = p.k_stride_block == p.v_stride_block && p.k_stride_slot == p.v_stride_slot;
  // The cache's sides must encode as TMA maps (strides, alignment) for TMA tiles: checked here
  // without the driver; the launch encodes them when its plan takes such a tile. (TMA tiles read
  // block tables only: contiguous K/V take the cp.async tiles.)
  const int row_bytes = kv_row_bytes(f.head_size, f.cache);
  f.tma_geometry = a.cu_seqlens_k == nullptr && tma_rows(f.head_size, f.cache) &&
                   cuda::paged_side_map_refusal(side_geometry(p, false, row_bytes)).empty() &&
                   cuda::paged_side_map_refusal(side_geometry(p, true, row_bytes)).empty();
  f.alibi_per_request = p.alibi_req_stride != 0 || (a.params.alibi_slopes.defined() && a.params.alibi_slopes.ndim == 2);
  f.num_reqs = a.num_reqs;
  f.num_kv_heads = p.num_kv_heads;
  f.group = p.group.divisor;
  f.max_query_len = a.max_query_len;
  f.max_seq_len = a.max_seq_len;
  f.num_splits = a.num_splits;
  f.causal = p.causal;
  return f;
}

void varlen_workspace_init(void* workspace, size_t bytes, void* stream) {
  ATTNKIT_REQUIRE(workspace != nullptr || bytes == 0, "flash_attn varlen workspace init", "bytes", bytes,
                  "a workspace of > 0 bytes needs a device pointer");
  const size_t counters = cuda::split_counter_region_bytes(bytes);
  if (counters > 0) ATTNKIT_CUDA_CHECK(cudaMemsetAsync(workspace, 0, counters, cuda::as_stream(stream)));
}

LaunchFacts varlen_launch_facts(const VarlenArgs& args) {
  return varlen_launch_facts(args, varlen_kernel_params(args));
}

namespace {

// The plan choose_launch makes for `facts`, with the TMA maps encoded into p where it takes a TMA
// tile (a driver without the encoder: the plan again without TMA); p gets the tuning's trace.
LaunchPlan plan_with_maps(VarlenKernelParams& p, LaunchFacts facts, const LaunchTuning& tuning) {
  LaunchPlan plan = choose_launch(facts, tuning);
  if (plan.config.fill == KvFill::tma && !encode_kv_maps(p, kv_row_bytes(facts.head_size, facts.cache))) {
    facts.tma_geometry = false;
    plan = choose_launch(facts, tuning);
  }
  p.cta_trace = tuning.cta_trace;
  return plan;
}

// launch.template operator()<Elem, kCache>() for the runtime q dtype (bf16 / f16) and cache kind
// (kNvfp4: whether the caller has nvfp4 instantiations).
template <bool kNvfp4, class F>
void for_elem(DType q_dtype, CacheKind cache, F&& launch) {
  auto with_elem = [&]<class Elem>() {
    switch (cache) {
      case CacheKind::b16: return launch.template operator()<Elem, CacheKind::b16>();
      case CacheKind::fp8: return launch.template operator()<Elem, CacheKind::fp8>();
      case CacheKind::nvfp4:
        if constexpr (kNvfp4) return launch.template operator()<Elem, CacheKind::nvfp4>();
        break;
    }
    fail(kWhere, "cache kind", cache_kind_name(cache), "has no kernels for this launch");
  };
  if (q_dtype == DType::bf16) with_elem.template operator()<__nv_bfloat16>();
  else with_elem.template operator()<__half>();
}

// The plan's head dim (kPlannedHeadDims) -> its planned instantiation.
template <class Elem, CacheKind kCache>
void launch_planned_head_dim(const VarlenKernelParams& p, const LaunchPlan& plan, int64_t grid_items,
                             cudaStream_t stream) {
  static_assert(std::size(kPlannedHeadDims) == 3, "one case per planned head dim");
  auto run = [&]<int kHeadDim>() {
    if constexpr (tile_instantiated(TileId::hopper, kHeadDim, kCache)) {
      if (plan.generation == Generation::hopper) return launch_hopper_planned<Elem, kHeadDim, kCache>(p, plan, grid_items, stream);
    }
    launch_planned<Elem, kHeadDim, kCache>(p, plan, grid_items, stream);
  };
  switch (plan.head_dim) {
    case 64: return run.template operator()<64>();
    case 128: return run.template operator()<128>();
    case 256: return run.template operator()<256>();
  }
  fail("flashinfer planned part", "head dim", plan.head_dim, "has no planned kernels");
}

}  // namespace

void run_planned_attention(const VarlenArgs& args, const PlannedLaunch& planned, const LaunchTuning& tuning) {
  const char* where = "flashinfer planned part";
  ATTNKIT_REQUIRE(args.num_splits == 1, where, "num_splits", args.num_splits,
                  "must be 1 (a planned launch splits by the plan's chunks)");
  ATTNKIT_REQUIRE(args.cu_seqlens_k == nullptr, where, "cu_seqlens_k", "set", "must be null (pages come from the page table)");
  ATTNKIT_REQUIRE(planned.items != nullptr && planned.num_items != nullptr && planned.page_indptr != nullptr, where,
                  "planned items / num_items / page_indptr", "nullptr", "must be device arrays");
  ATTNKIT_REQUIRE(planned.planned_items >= 0 && planned.planned_items <= planned.grid_items, where, "planned_items",
                  planned.planned_items, "must be in [0, grid_items = " + std::to_string(planned.grid_items) + "]");
  VarlenKernelParams p = varlen_kernel_params(args);
  if (p.num_tokens == 0 || args.num_reqs == 0 || planned.planned_items == 0) return;
  p.plan_items = planned.items;
  p.plan_num_items = planned.num_items;
  p.plan_tile_q = planned.tile_q;
  p.page_indptr = planned.page_indptr;
  p.plan_part_o = planned.part_o;
  p.plan_part_lse = planned.part_lse;
  p.errors = cuda::device_error_record();
  LaunchFacts facts = varlen_launch_facts(args, p);
  facts.planned_items = planned.planned_items;
  facts.plan_tile_q = planned.tile_q;
  const LaunchPlan plan = plan_with_maps(p, facts, tuning);
  const cudaStream_t stream = cuda::as_stream(args.stream);
  for_elem<true>(args.q.dtype, facts.cache, [&]<class Elem, CacheKind kCache>() {
    launch_planned_head_dim<Elem, kCache>(p, plan, planned.grid_items, stream);
  });
  cuda::check_device_errors_after(where, args.stream);
}

void run_varlen_attention(const VarlenArgs& args, const LaunchTuning& tuning) {
  ATTNKIT_REQUIRE(args.cache.dtype != DType::nvfp4, kWhere, "cache.dtype", "nvfp4",
                  "is read by the FlashInfer-style planned decode only (run_planned_attention)");
  VarlenKernelParams p = varlen_kernel_params(args);
  if (p.num_tokens == 0 || args.num_reqs == 0) return;
  p.errors = cuda::device_error_record();
  const LaunchFacts facts = varlen_launch_facts(args, p);
  const LaunchPlan plan = plan_with_maps(p, facts, tuning);
  const cudaStream_t stream = cuda::as_stream(args.stream);
  for_elem<false>(args.q.dtype, facts.cache,
                  [&]<class Elem, CacheKind kCache>() { launch_head_dim<Elem, kCache>(p, plan, stream); });
  cuda::check_device_errors_after(kWhere, args.stream);
}

}  // namespace attnkit::flash_attn
