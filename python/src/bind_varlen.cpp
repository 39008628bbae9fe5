// The varlen attention call behind attnkit.flash_attn_varlen_func: CPU arrays run on the
// reference backend, CUDA arrays on the FlashAttention-style kernel through its launch seam (src/flash_attn/varlen_launch.h).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/reference.h"
#include "convert.h"
#include "flash_attn/generation.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::py {

namespace {

constexpr std::string_view kWhere = "flash_attn_varlen_func";

struct VarlenCall {
  TensorView q, k, v, out, lse;
  TensorView cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  std::string kv_cache_dtype;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  AttentionParams params;
  int num_splits = 0;
  TensorView workspace;
  void* stream = nullptr;
};

void require_same_device(const TensorView& t, const TensorView& q, std::string_view name) {
  if (!t.defined()) return;
  const bool same = t.device == q.device && (q.device == Device::CPU || t.device_index == q.device_index);
  ATTNKIT_REQUIRE(same, kWhere, std::string(name) + ".device",
                  std::string(device_name(t.device)) + ":" + std::to_string(t.device_index),
                  "must be the device of q = " + std::string(device_name(q.device)) + ":" +
                      std::to_string(q.device_index));
}

// Checks shared by both devices: shapes, dtypes, devices and the argument combinations
// FlashAttention allows.
void check_common(const VarlenCall& c) {
  c.q.require_ndim(kWhere, "q", 3);
  c.q.require_last_dim_contiguous(kWhere, "q");
  ATTNKIT_REQUIRE(is_float(c.q.dtype), kWhere, "q.dtype", dtype_name(c.q.dtype),
                  "must be float32, float16 or bfloat16");
  c.out.require_shape(kWhere, "out", {c.q.shape[0], c.q.shape[1], c.q.shape[2]});
  c.out.require_dtype(kWhere, "out", c.q.dtype);
  c.out.require_last_dim_contiguous(kWhere, "out");
  for (auto [t, name] : {std::pair{&c.k, "k"}, {&c.v, "v"}, {&c.out, "out"}, {&c.lse, "lse"},
                         {&c.cu_seqlens_q, "cu_seqlens_q"}, {&c.cu_seqlens_k, "cu_seqlens_k"},
                         {&c.seqused_k, "seqused_k"}, {&c.block_table, "block_table"},
                         {&c.params.alibi_slopes, "alibi_slopes"}, {&c.params.sinks, "s_aux"},
                         {&c.params.k_scale, "k_descale"}, {&c.params.v_scale, "v_descale"}}) {
    require_same_device(*t, c.q, name);
  }
  c.cu_seqlens_q.require_dtype(kWhere, "cu_seqlens_q", DType::i32);
  c.cu_seqlens_q.require_ndim(kWhere, "cu_seqlens_q", 1);
  c.cu_seqlens_q.require_contiguous(kWhere, "cu_seqlens_q");
  ATTNKIT_REQUIRE(c.cu_seqlens_q.shape[0] >= 1, kWhere, "cu_seqlens_q.shape",
                  c.cu_seqlens_q.shape_str(), "must be [num_seqs + 1] with num_seqs >= 0");
  const int64_t num_reqs = c.cu_seqlens_q.shape[0] - 1;
  ATTNKIT_REQUIRE(c.max_seqlen_q >= 0, kWhere, "max_seqlen_q", c.max_seqlen_q, "must be >= 0");
  ATTNKIT_REQUIRE(c.max_seqlen_k >= 0, kWhere, "max_seqlen_k", c.max_seqlen_k, "must be >= 0");
  ATTNKIT_REQUIRE(c.num_splits >= 0, kWhere, "num_splits", c.num_splits,
                  "must be >= 0 (0 = let the library decide)");
  if (c.seqused_k.defined()) {
    c.seqused_k.require_dtype(kWhere, "seqused_k", DType::i32);
    c.seqused_k.require_shape(kWhere, "seqused_k", {num_reqs});
    c.seqused_k.require_contiguous(kWhere, "seqused_k");
  }
  if (c.block_table.defined()) {
    ATTNKIT_REQUIRE(!c.cu_seqlens_k.defined(), kWhere, "cu_seqlens_k", "given",
                    "must be None with block_table (a paged cache's lengths come from "
                    "seqused_k)");
    ATTNKIT_REQUIRE(c.seqused_k.defined(), kWhere, "seqused_k", "None",
                    "is required with block_table");
    c.block_table.require_dtype(kWhere, "block_table", DType::i32);
    c.block_table.require_ndim(kWhere, "block_table", 2);
    c.block_table.require_shape(kWhere, "block_table", {num_reqs, -1});
    c.block_table.require_contiguous(kWhere, "block_table");
    c.k.require_ndim(kWhere, "k (paged key cache)", 4);
    c.v.require_ndim(kWhere, "v (paged value cache)", 4);
  } else {
    ATTNKIT_REQUIRE(c.cu_seqlens_k.defined(), kWhere, "cu_seqlens_k", "None",
                    "is required without block_table (contiguous k/v)");
    c.cu_seqlens_k.require_dtype(kWhere, "cu_seqlens_k", DType::i32);
    c.cu_seqlens_k.require_shape(kWhere, "cu_seqlens_k", {num_reqs + 1});
    c.k.require_ndim(kWhere, "k", 3);
    c.v.require_ndim(kWhere, "v", 3);
  }
}

void run_cpu(const VarlenCall& c, const PagedKV& cache) {
  const int64_t num_reqs = c.cu_seqlens_q.shape[0] - 1;
  const std::vector<int32_t> qsl = host_int32(c.cu_seqlens_q, kWhere, "cu_seqlens_q");
  std::vector<int32_t> seq_lens, table;
  int max_blocks = 0;
  if (c.block_table.defined()) {
    seq_lens = host_int32(c.seqused_k, kWhere, "seqused_k", num_reqs);
    table = host_int32(c.block_table, kWhere, "block_table");
    max_blocks = static_cast<int>(c.block_table.shape[1]);
  } else {
    const std::vector<int32_t> cuk = host_int32(c.cu_seqlens_k, kWhere, "cu_seqlens_k");
    const int64_t total_k = c.k.shape[0];
    ATTNKIT_REQUIRE(cuk[0] >= 0, kWhere, "cu_seqlens_k[0]", cuk[0], "must be >= 0");
    for (int64_t r = 0; r < num_reqs; ++r) {
      ATTNKIT_REQUIRE(cuk[r + 1] >= cuk[r], kWhere, "cu_seqlens_k[" + std::to_string(r + 1) + "]",
                      cuk[r + 1], "must be >= cu_seqlens_k[" + std::to_string(r) + "] = " +
                                      std::to_string(cuk[r]));
    }
    ATTNKIT_REQUIRE(cuk[num_reqs] <= total_k, kWhere,
                    "cu_seqlens_k[" + std::to_string(num_reqs) + "]", cuk[num_reqs],
                    "must be <= k.size(0) = " + std::to_string(total_k));
    if (c.seqused_k.defined()) {
      seq_lens = host_int32(c.seqused_k, kWhere, "seqused_k", num_reqs);
      for (int64_t r = 0; r < num_reqs; ++r) {
        ATTNKIT_REQUIRE(seq_lens[r] >= 0 && seq_lens[r] <= cuk[r + 1] - cuk[r], kWhere,
                        "seqused_k[" + std::to_string(r) + "]", seq_lens[r],
                        "must be in [0, cu_seqlens_k[r+1] - cu_seqlens_k[r] = " +
                            std::to_string(cuk[r + 1] - cuk[r]) + "]");
      }
    } else {
      seq_lens.resize(num_reqs);
      for (int64_t r = 0; r < num_reqs; ++r) seq_lens[r] = cuk[r + 1] - cuk[r];
    }
    for (int32_t len : seq_lens) max_blocks = std::max(max_blocks, (len + kIdentityBlock - 1) / kIdentityBlock);
    table.assign(static_cast<size_t>(num_reqs) * max_blocks, 0);
    for (int64_t r = 0; r < num_reqs; ++r) {
      for (int j = 0; j * kIdentityBlock < seq_lens[r]; ++j) table[r * max_blocks + j] = cuk[r] + j * kIdentityBlock;
    }
  }
  // max_seqlen_* are upper bounds a GPU launch sizes its grid by: hold the caller to them here,
  // where the lengths are on the host, so a wrong bound shows up on the CPU too.
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int32_t qlen = qsl[r + 1] - qsl[r];
    ATTNKIT_REQUIRE(qlen <= c.max_seqlen_q, kWhere, "max_seqlen_q", c.max_seqlen_q,
                    "must be >= every query length (seq " + std::to_string(r) + " has " +
                        std::to_string(qlen) + ")");
    ATTNKIT_REQUIRE(seq_lens[r] <= c.max_seqlen_k, kWhere, "max_seqlen_k", c.max_seqlen_k,
                    "must be >= every key length (seq " + std::to_string(r) + " has " +
                        std::to_string(seq_lens[r]) + ")");
  }
  BatchView batch;
  batch.query_start_loc = qsl;
  batch.seq_lens = seq_lens;
  batch.block_table = table;
  batch.max_blocks_per_req = max_blocks;
  reference_attention(c.q, cache, batch, c.params, c.out, /*allow_query_longer_than_keys=*/true);
}

void run_cuda(const VarlenCall& c, const PagedKV& cache) {
#if defined(ATTNKIT_WITH_CUDA)
  // Contiguous K/V (cu_seqlens_k, no block_table) need seqused_k on the GPU (the wrapper derives
  // it from cu_seqlens_k when the caller gives none).
  ATTNKIT_REQUIRE(c.block_table.defined() || c.seqused_k.defined(), kWhere, "seqused_k", "None",
                  "contiguous k/v on CUDA need seqused_k (flash_attn_varlen_func derives it from cu_seqlens_k)");
  const int num_heads = static_cast<int>(c.q.shape[1]);
  c.params.validate(kWhere, num_heads, cache.num_kv_heads, c.q.shape[0], Device::CUDA);
  ATTNKIT_REQUIRE(cache.head_size == c.q.shape[2], kWhere, "k.size(3) (head_size)",
                  cache.head_size, "must equal q.size(2) = " + std::to_string(c.q.shape[2]));
  ATTNKIT_REQUIRE(num_heads % cache.num_kv_heads == 0, kWhere, "num_heads", num_heads,
                  "must be a multiple of num_kv_heads = " + std::to_string(cache.num_kv_heads));
  flash_attn::VarlenArgs a;
  a.q = c.q;
  a.cache = cache;
  a.out = c.out;
  a.cu_seqlens_q = c.cu_seqlens_q.ptr<const int32_t>();
  a.seqused_k = c.seqused_k.ptr<const int32_t>();
  if (c.block_table.defined()) {
    a.block_table = c.block_table.ptr<const int32_t>();
    a.max_blocks_per_req = static_cast<int>(c.block_table.shape[1]);
  } else {  // (cache: the contiguous view, identity_paged_kv)
    a.cu_seqlens_k = c.cu_seqlens_k.ptr<const int32_t>();
  }
  a.num_reqs = static_cast<int>(c.cu_seqlens_q.shape[0] - 1);
  a.max_query_len = c.max_seqlen_q;
  a.max_seq_len = c.max_seqlen_k;
  a.num_heads = num_heads;
  a.params = c.params;
  a.num_splits = std::max(1, c.num_splits);
  if (a.num_splits > 1) {
    const size_t need = flash_attn::varlen_workspace_bytes(c.q.shape[0], num_heads,
                                                           static_cast<int>(c.q.shape[2]),
                                                           a.num_splits);
    const size_t have = c.workspace.defined() ? static_cast<size_t>(c.workspace.numel()) : 0;
    ATTNKIT_REQUIRE(have >= need, kWhere, "workspace bytes", have,
                    "num_splits = " + std::to_string(a.num_splits) + " needs " +
                        std::to_string(need) + " bytes of uint8 workspace");
    a.workspace = c.workspace.data;
    a.workspace_bytes = have;
  }
  a.stream = c.stream;
  // The caller's workspace is fresh memory on every call (the Python wrapper allocates it):
  // zero its counters first (a small memset on the same stream).
  if (a.num_splits > 1) flash_attn::varlen_workspace_init(a.workspace, a.workspace_bytes, a.stream);
  flash_attn::run_varlen_attention(a);
#else
  (void)cache;
  fail(kWhere, "q.device", "cuda:" + std::to_string(c.q.device_index),
       "this attnkit build has no CUDA kernels (built with ATTNKIT_CUDA=OFF or without nvcc)");
#endif
}

void varlen_attention(const InArray& q, const InArray& k, const InArray& v,
                      const std::string& kv_cache_dtype, const InArray& cu_seqlens_q,
                      const OptIn& cu_seqlens_k, const OptIn& seqused_k, const OptIn& block_table,
                      int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal,
                      int window_left, int window_right, float softcap, const OptIn& alibi_slopes,
                      const OptIn& s_aux, const OptIn& k_descale, const OptIn& v_descale,
                      const OutArray& out, const OptOut& lse, int num_splits,
                      const OptOut& workspace, uintptr_t stream) {
  VarlenCall c;
  c.q = to_view(q, kWhere, "q");
  c.k = to_view(k, kWhere, "k");
  c.v = to_view(v, kWhere, "v");
  c.out = to_view(out, kWhere, "out");
  c.lse = to_view(lse, kWhere, "softmax_lse");
  c.cu_seqlens_q = to_view(cu_seqlens_q, kWhere, "cu_seqlens_q");
  c.cu_seqlens_k = to_view(cu_seqlens_k, kWhere, "cu_seqlens_k");
  c.seqused_k = to_view(seqused_k, kWhere, "seqused_k");
  c.block_table = to_view(block_table, kWhere, "block_table");
  c.kv_cache_dtype = kv_cache_dtype;
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_k = max_seqlen_k;
  c.num_splits = num_splits;
  c.workspace = to_view(workspace, kWhere, "workspace");
  c.stream = stream_ptr(stream);

  c.k = as_cache_view(c.k, kv_cache_dtype, kWhere, "k");
  c.v = as_cache_view(c.v, kv_cache_dtype, kWhere, "v");
  c.params.scale = softmax_scale;
  c.params.causal = causal;
  c.params.window_left = window_left;
  c.params.window_right = window_right;
  c.params.softcap = softcap;
  c.params.alibi_slopes = to_view(alibi_slopes, kWhere, "alibi_slopes");
  c.params.sinks = to_view(s_aux, kWhere, "s_aux");
  c.params.lse = c.lse;
  check_common(c);

  PagedKV cache = c.block_table.defined() ? paged_kv_from_views(c.k, c.v)
                                          : identity_paged_kv(c.k, c.v, kWhere);
  // Descales only mean something for fp8 caches; FlashAttention ignores them otherwise.
  if (is_fp8(cache.dtype)) {
    c.params.k_scale = as_kv_scale(to_view(k_descale, kWhere, "k_descale"), cache.num_kv_heads, kWhere, "k_descale");
    c.params.v_scale = as_kv_scale(to_view(v_descale, kWhere, "v_descale"), cache.num_kv_heads, kWhere, "v_descale");
    require_same_device(c.params.k_scale, c.q, "k_descale");
    require_same_device(c.params.v_scale, c.q, "v_descale");
  }
  if (c.q.device == Device::CPU) {
    run_cpu(c, cache);
  } else {
    run_cuda(c, cache);
  }
}

// The split-KV count of the builder's rule (flash_attn/split_kv.h) for a uniform batch of
// num_reqs requests of max_q queries over max_k keys on CUDA device `device`: what
// FlashAttention's num_splits = 0 and get_scheduler_metadata decide, from host-visible sizes
// only (no copy of the device lengths).
int varlen_num_splits(int num_reqs, int max_q, int max_k, int num_heads, int num_kv_heads, int head_size,
                      bool fp8_cache, int device) {
  constexpr std::string_view where = "flash_attn num_splits";
  ATTNKIT_REQUIRE(num_reqs >= 0, where, "batch_size", num_reqs, "must be >= 0");
  ATTNKIT_REQUIRE(max_q >= 0 && max_k >= 0, where, "max_seqlen_q / max_seqlen_k",
                  std::to_string(max_q) + " / " + std::to_string(max_k), "must be >= 0");
  const DeviceSpec d = cuda_device_spec(device);
  flash_attn::SplitKVInput in;
  in.num_heads = num_heads;
  in.num_kv_heads = num_kv_heads;
  in.num_sms = d.sms_or_default();
  in.cache_dtype = fp8_cache ? DType::fp8_e4m3 : DType::bf16;
  in.head_size = head_size;
  in.cc_major = d.cc_major;
  in.hopper_kernels = flash_attn::hopper_generation_built() && d.cc_major == 9 && d.cc_minor == 0;
  return flash_attn::decide_num_splits_uniform(num_reqs, max_q, max_k, in).num_splits;
}

}  // namespace

void register_varlen(nb::module_& m) {
  m.def("varlen_num_splits", &varlen_num_splits, nb::arg("num_reqs"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_size"),
        nb::arg("fp8_cache"), nb::arg("device"),
        "The split-KV count the FlashAttention-style builder's rule takes for a uniform batch on a CUDA device.");
  m.def("varlen_attention", &varlen_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("kv_cache_dtype"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k").none(),
        nb::arg("seqused_k").none(), nb::arg("block_table").none(), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("softmax_scale"), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
        nb::arg("alibi_slopes").none(), nb::arg("s_aux").none(), nb::arg("k_descale").none(),
        nb::arg("v_descale").none(), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("num_splits"), nb::arg("workspace").none(), nb::arg("stream"),
        "Varlen paged attention (the engine of flash_attn_varlen_func); use the Python wrapper.");
#if defined(ATTNKIT_WITH_CUDA)
  m.def("varlen_workspace_bytes", &flash_attn::varlen_workspace_bytes, nb::arg("num_tokens"),
        nb::arg("num_heads"), nb::arg("head_size"), nb::arg("num_splits"));
#endif
}

}  // namespace attnkit::py
