// AttentionParams: the default scale and the checks every backend runs on its parameters.
#include "attnkit/params.h"

#include <cmath>
#include <string>

#include "attnkit/error.h"

namespace attnkit {

float AttentionParams::resolved_scale(int head_size) const {
  if (scale != 0.f) return scale;
  ATTNKIT_REQUIRE(head_size > 0, "AttentionParams::resolved_scale", "head_size", head_size,
                  "must be > 0");
  return 1.f / std::sqrt(static_cast<float>(head_size));
}

namespace {

// An optional f32 tensor of shape [n] on `device`.
void check_per_head(std::string_view where, std::string_view name, const TensorView& t,
                    int64_t n, std::string_view n_name, Device device) {
  if (!t.defined()) return;
  t.require_dtype(where, name, DType::f32);
  ATTNKIT_REQUIRE(t.ndim == 1 && t.shape[0] == n, where, std::string(name) + ".shape",
                  t.shape_str(),
                  "must be [" + std::string(n_name) + " = " + std::to_string(n) + "]");
  t.require_contiguous(where, name);
  t.require_device(where, name, device);
}

void check_kv_scale(std::string_view where, std::string_view name, const TensorView& t,
                    int num_kv_heads, Device device) {
  if (!t.defined()) return;
  t.require_dtype(where, name, DType::f32);
  t.require_ndim(where, name, 1);
  ATTNKIT_REQUIRE(t.shape[0] == 1 || t.shape[0] == num_kv_heads, where,
                  std::string(name) + ".shape", t.shape_str(),
                  "must be [1] (per tensor) or [num_kv_heads = " + std::to_string(num_kv_heads) +
                      "] (per KV head)");
  t.require_contiguous(where, name);
  t.require_device(where, name, device);
}

// ALiBi slopes: [num_heads], or [num_reqs, num_heads] (one row per request).
void check_alibi(std::string_view where, const TensorView& t, int num_heads, Device device) {
  if (!t.defined()) return;
  t.require_dtype(where, "alibi_slopes", DType::f32);
  ATTNKIT_REQUIRE((t.ndim == 1 && t.shape[0] == num_heads) || (t.ndim == 2 && t.shape[1] == num_heads), where,
                  "alibi_slopes.shape", t.shape_str(),
                  "must be [num_heads = " + std::to_string(num_heads) + "] or [num_reqs, num_heads = " +
                      std::to_string(num_heads) + "]");
  t.require_contiguous(where, "alibi_slopes");
  t.require_device(where, "alibi_slopes", device);
}

}  // namespace

float AttentionParams::alibi_slope(int req, int head) const {
  if (!alibi_slopes.defined()) return 0.f;
  const int64_t row = alibi_slopes.ndim == 2 ? static_cast<int64_t>(req) * alibi_slopes.stride(0) : 0;
  return alibi_slopes.ptr<const float>()[row + static_cast<int64_t>(head) * alibi_slopes.stride(alibi_slopes.ndim - 1)];
}

void AttentionParams::validate(std::string_view where, int num_heads, int num_kv_heads,
                               int64_t num_tokens, Device device) const {
  ATTNKIT_REQUIRE(num_heads > 0, where, "num_heads", num_heads, "must be > 0");
  ATTNKIT_REQUIRE(num_kv_heads > 0, where, "num_kv_heads", num_kv_heads, "must be > 0");
  ATTNKIT_REQUIRE(num_heads % num_kv_heads == 0, where, "num_heads", num_heads,
                  "must be divisible by num_kv_heads = " + std::to_string(num_kv_heads) +
                      " (GQA/MQA groups of equal size)");
  ATTNKIT_REQUIRE(num_tokens >= 0, where, "num_tokens", num_tokens, "must be >= 0");
  ATTNKIT_REQUIRE(std::isfinite(scale), where, "scale", scale,
                  "must be finite (0 means 1/sqrt(head_size))");
  ATTNKIT_REQUIRE(std::isfinite(softcap) && softcap >= 0.f, where, "softcap", softcap,
                  "must be finite and >= 0 (0 disables it)");
  ATTNKIT_REQUIRE(window_left >= -1, where, "window_left", window_left,
                  "must be >= -1 (-1 = unbounded)");
  ATTNKIT_REQUIRE(window_right >= -1, where, "window_right", window_right,
                  "must be >= -1 (-1 = unbounded)");
  check_alibi(where, alibi_slopes, num_heads, device);
  check_per_head(where, "sinks", sinks, num_heads, "num_heads", device);
  check_kv_scale(where, "k_scale", k_scale, num_kv_heads, device);
  check_kv_scale(where, "v_scale", v_scale, num_kv_heads, device);
  if (lse.defined()) {
    lse.require_dtype(where, "lse", DType::f32);
    ATTNKIT_REQUIRE(lse.ndim == 2 && lse.shape[0] == num_heads && lse.shape[1] == num_tokens,
                    where, "lse.shape", lse.shape_str(),
                    "must be [num_heads = " + std::to_string(num_heads) +
                        ", num_tokens = " + std::to_string(num_tokens) + "]");
    lse.require_contiguous(where, "lse");
    lse.require_device(where, "lse", device);
  }
}

}  // namespace attnkit
