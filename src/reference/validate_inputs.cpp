#include "reference/validate_inputs.h"

#include <cmath>
#include <string>

#include "attnkit/error.h"
#include "reference/kv_row_reader.h"

namespace attnkit::reference {

namespace {

void validate_activation(const TensorView& t, const char* name) {
  t.require_defined(kWhere, name);
  t.require_ndim(kWhere, name, 3);
  ATTNKIT_REQUIRE(is_float(t.dtype), kWhere, std::string(name) + ".dtype", dtype_name(t.dtype),
                  "must be f32, f16 or bf16");
  t.require_device(kWhere, name, Device::CPU);
  t.require_last_dim_contiguous(kWhere, name);
}

void validate_cache(const PagedKV& c, int64_t head_size) {
  ATTNKIT_REQUIRE(c.device == Device::CPU, kWhere, "cache.device", device_name(c.device),
                  "the reference runs on the CPU");
  const bool dtype_ok = is_float(c.dtype) || is_fp8(c.dtype) || c.dtype == DType::nvfp4;
  ATTNKIT_REQUIRE(dtype_ok, kWhere, "cache.dtype", dtype_name(c.dtype),
                  "must be f32, f16, bf16, fp8_e4m3, fp8_e5m2 or nvfp4");
  ATTNKIT_REQUIRE(c.num_blocks >= 0, kWhere, "cache.num_blocks", c.num_blocks, "must be >= 0");
  ATTNKIT_REQUIRE(c.block_size > 0 && c.block_size % 16 == 0, kWhere, "cache.block_size",
                  c.block_size, "must be a positive multiple of 16");
  ATTNKIT_REQUIRE(c.num_kv_heads > 0, kWhere, "cache.num_kv_heads", c.num_kv_heads,
                  "must be > 0");
  ATTNKIT_REQUIRE(c.head_size == head_size, kWhere, "cache.head_size", c.head_size,
                  "must equal q.size(2) = " + std::to_string(head_size));
  if (c.dtype == DType::nvfp4) {
    ATTNKIT_REQUIRE(c.head_size % kNvfp4BlockValues == 0, kWhere, "cache.head_size",
                    c.head_size, "an nvfp4 cache needs a multiple of 16 (one scale per 16)");
  }
  if (c.num_blocks == 0) return;
  ATTNKIT_REQUIRE(c.k.base && c.v.base, kWhere, c.k.base ? "cache.v.base" : "cache.k.base",
                  "nullptr", "a cache with blocks must point at memory");
  if (c.dtype == DType::nvfp4) {
    ATTNKIT_REQUIRE(c.k.scale_base && c.v.scale_base, kWhere,
                    c.k.scale_base ? "cache.v.scale_base" : "cache.k.scale_base", "nullptr",
                    "an nvfp4 cache needs its block scales");
  }
}

// The optional tensors the reference reads or writes directly. AttentionParams::validate checks
// them too; repeating the few checks the memory accesses below rely on keeps this file safe
// on its own.
void validate_param_tensor(const TensorView& t, const char* name, int64_t d0, int64_t d1) {
  if (!t.defined()) return;
  t.require_dtype(kWhere, name, DType::f32);
  t.require_device(kWhere, name, Device::CPU);
  if (d1 < 0) t.require_shape(kWhere, name, {d0});
  else t.require_shape(kWhere, name, {d0, d1});
}

// The values the math needs: finite slopes, sinks finite or -inf.
void validate_head_values(const TensorView& sinks, const TensorView& alibi) {
  const int64_t rows = alibi.defined() && alibi.ndim == 2 ? alibi.size(0) : 1;
  for (int64_t r = 0; alibi.defined() && r < rows; ++r)
    for (int64_t h = 0; h < alibi.size(alibi.ndim - 1); ++h) {
      const float m = alibi.ptr<const float>()[(alibi.ndim == 2 ? r * alibi.stride(0) : 0) +
                                               h * alibi.stride(alibi.ndim - 1)];
      ATTNKIT_REQUIRE(std::isfinite(m), kWhere,
                      "alibi_slopes[" + (alibi.ndim == 2 ? std::to_string(r) + "][" : std::string()) +
                          std::to_string(h) + "]",
                      m, "an ALiBi slope must be finite");
    }
  if (!sinks.defined()) return;
  for (int64_t h = 0; h < sinks.size(0); ++h) {
    const float s = sinks.ptr<const float>()[h * sinks.stride(0)];
    ATTNKIT_REQUIRE(!std::isnan(s) && s != INFINITY, kWhere,
                    "sinks[" + std::to_string(h) + "]", s,
                    "a sink logit must be finite or -inf");
  }
}

}  // namespace

void validate_inputs(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                     const AttentionParams& params, const TensorView& out,
                     bool allow_query_longer_than_keys) {
  validate_activation(q, "q");
  validate_activation(out, "out");
  out.require_shape(kWhere, "out", {q.size(0), q.size(1), q.size(2)});
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_size = q.size(2);
  ATTNKIT_REQUIRE(num_heads > 0, kWhere, "q.size(1) (num_heads)", num_heads, "must be > 0");
  ATTNKIT_REQUIRE(head_size > 0, kWhere, "q.size(2) (head_size)", head_size, "must be > 0");

  validate_cache(cache, head_size);
  ATTNKIT_REQUIRE(num_heads % cache.num_kv_heads == 0, kWhere, "num_heads", num_heads,
                  "must be a multiple of cache.num_kv_heads = " +
                      std::to_string(cache.num_kv_heads));

  batch.validate(kWhere, cache.num_blocks, cache.block_size, allow_query_longer_than_keys);
  const int64_t batch_tokens = batch.query_start_loc.back();
  ATTNKIT_REQUIRE(batch_tokens <= num_tokens, kWhere, "query_start_loc[num_reqs]",
                  batch_tokens, "must be <= q.size(0) = " + std::to_string(num_tokens));

  params.validate(kWhere, static_cast<int>(num_heads), cache.num_kv_heads, num_tokens,
                  Device::CPU);
  if (params.alibi_slopes.defined() && params.alibi_slopes.ndim == 2)  // (one row per request)
    validate_param_tensor(params.alibi_slopes, "alibi_slopes", batch.num_reqs(), num_heads);
  else
    validate_param_tensor(params.alibi_slopes, "alibi_slopes", num_heads, -1);
  validate_param_tensor(params.sinks, "sinks", num_heads, -1);
  validate_param_tensor(params.lse, "lse", num_heads, num_tokens);
  validate_head_values(params.sinks, params.alibi_slopes);
  validate_kv_scale(kWhere, "k_scale", params.k_scale, cache);
  validate_kv_scale(kWhere, "v_scale", params.v_scale, cache);
}

}  // namespace attnkit::reference
