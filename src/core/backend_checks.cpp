#include "core/backend_checks.h"

#include <algorithm>
#include <string>

#include "attnkit/error.h"
#include "core/id_scan.h"

namespace attnkit {

namespace {
// Any int32 block id is a valid index into a cache of this many blocks.
constexpr int64_t kAnyInt32BlockId = int64_t{1} << 31;
}  // namespace

void validate_for_builder(const CommonAttentionMetadata& md, int block_size, std::string_view where) {
  ATTNKIT_REQUIRE(block_size > 0, where, "block_size", block_size, "must be > 0");
  try {
    md.validate(kAnyInt32BlockId, block_size);
  } catch (const Error& e) {
    throw Error(std::string(where), e.value(), e.rule());
  }
}

void require_no_dcp(const CommonAttentionMetadata& md, std::string_view where, std::string_view why) {
  ATTNKIT_REQUIRE(md.dcp_world_size == 1, where, "dcp_world_size", md.dcp_world_size,
                  "must be 1: " + std::string(why));
}

int max_block_id_read(const CommonAttentionMetadata& md, int block_size) {
  int max_id = -1;
  const std::vector<int32_t> keys = md.key_seq_lens();
  for (int r = 0; r < md.num_reqs; ++r) {
    const int blocks = (keys[r] + block_size - 1) / block_size;
    const int32_t* row = md.block_table.data() + static_cast<int64_t>(r) * md.max_blocks_per_req;
    if (blocks > 0) max_id = std::max(max_id, id_range(row, blocks).max);
  }
  return max_id;
}

KVCacheSpec cache_spec_of(const TensorView& cache, const AttentionConfig& cfg, std::string_view where) {
  cache.require_defined(where, "kv_cache");
  KVCacheSpec spec;
  spec.block_size = cfg.block_size;
  spec.num_kv_heads = cfg.num_kv_heads;
  spec.head_size = cfg.head_size;
  spec.cache_dtype = cfg.cache_dtype;
  spec.layout = cfg.layout;
  spec.num_blocks = 1;
  spec.validate(where);
  if (cache.ndim == 5) {
    spec.num_blocks = cache.size(0);
  } else if (cache.ndim == 1) {
    const int64_t per_block = 2LL * cfg.block_size * cfg.num_kv_heads * spec.row_elems();
    ATTNKIT_REQUIRE(cache.size(0) % per_block == 0, where, "kv_cache.numel()", cache.size(0),
                    "a flat cache must hold whole blocks of " + std::to_string(per_block) +
                        " elements (2 x block_size x num_kv_heads x row)");
    spec.num_blocks = cache.size(0) / per_block;
  } else {
    fail(where, "kv_cache.shape", cache.shape_str(),
         "must be the backend's 5-D physical shape or flat (1-D)");
  }
  ATTNKIT_REQUIRE(spec.num_blocks > 0, where, "kv_cache num_blocks", spec.num_blocks, "must be > 0");
  return spec;
}

void require_declared_features(const AttentionParams& p, const Features& declared, std::string_view where) {
  auto need = [&](bool used, bool ok, const char* what, const char* flag) {
    if (used && !ok)
      throw Error(std::string(where), std::string("params.") + what + " in use",
                  std::string("the impl was made for a configuration without ") + flag +
                      " (declare it in AttentionConfig::features so the backend can pick a kernel that has it)");
  };
  need(p.alibi_slopes.defined(), declared.alibi, "alibi_slopes", "ALiBi");
  need(p.sinks.defined(), declared.sinks, "sinks", "sinks");
  need(p.softcap > 0.f, declared.softcap, "softcap", "softcap");
  need(p.window_left >= 0 || p.window_right >= 0, declared.sliding_window, "window", "a sliding window");
  need(!p.causal, declared.non_causal, "causal = false", "non-causal attention");
  need(p.lse.defined(), declared.lse, "lse", "LSE output");
}

void require_same_gpu(const TensorView& t, std::string_view name, int device_index,
                      std::string_view where) {
  ATTNKIT_REQUIRE(t.device_index == device_index, where, std::string(name) + ".device_index",
                  t.device_index, "must be q's CUDA device " + std::to_string(device_index));
}

ForwardViews check_forward_tensors(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse,
                                   const AttentionConfig& cfg, int64_t num_tokens, Device device,
                                   bool out_same_dtype, std::string_view where) {
  q.require_defined(where, "q");
  q.require_device(where, "q", device);
  q.require_dtype(where, "q", cfg.dtype);
  q.require_shape(where, "q", {-1, cfg.num_heads, cfg.head_size});
  q.require_last_dim_contiguous(where, "q");
  ATTNKIT_REQUIRE(q.size(0) >= num_tokens, where, "q.shape[0]", q.size(0),
                  "must be >= num_actual_tokens = " + std::to_string(num_tokens));
  out.require_defined(where, "out");
  out.require_device(where, "out", device);
  if (out_same_dtype) {
    out.require_dtype(where, "out", q.dtype);
  } else {
    ATTNKIT_REQUIRE(is_float(out.dtype), where, "out.dtype", dtype_name(out.dtype),
                    "must be f32, f16 or bf16");
  }
  out.require_shape(where, "out", {q.size(0), cfg.num_heads, cfg.head_size});
  out.require_last_dim_contiguous(where, "out");
  for (const auto* kv : {&k, &v}) {
    if (!kv->defined()) continue;
    const char* name = kv == &k ? "k" : "v";
    kv->require_device(where, name, device);
    kv->require_shape(where, name, {-1, cfg.num_kv_heads, cfg.head_size});
    ATTNKIT_REQUIRE(kv->size(0) >= num_tokens, where, std::string(name) + ".shape[0]", kv->size(0),
                    "must be >= num_actual_tokens = " + std::to_string(num_tokens));
  }
  ForwardViews cut{q, out, lse};
  cut.q.shape[0] = num_tokens;
  cut.out.shape[0] = num_tokens;
  if (lse.defined()) {
    lse.require_dtype(where, "lse", DType::f32);
    lse.require_shape(where, "lse", {cfg.num_heads, num_tokens});
  }
  return cut;
}

}  // namespace attnkit
