// merge_states: validation for every device and the CPU merge. The per-element rule is
// detail/merge_rule.h, shared with the CUDA kernels.
#include <algorithm>
#include <string>

#include "attnkit/error.h"
#include "attnkit/ops.h"
#include "core/cuda_dispatch.h"
#include "core/parallel.h"

namespace attnkit {

namespace {

constexpr std::string_view kWhere = "merge_states";

std::string device_str(const TensorView& t) {
  return std::string(device_name(t.device)) + ":" + std::to_string(t.device_index);
}

void require_same_device(const TensorView& t, std::string_view name, const TensorView& ref) {
  ATTNKIT_REQUIRE(t.device == ref.device && t.device_index == ref.device_index, kWhere,
                  std::string(name) + ".device", device_str(t),
                  "must be out_a's device " + device_str(ref));
}

void check_out(const TensorView& t, std::string_view name, const TensorView& ref) {
  t.require_ndim(kWhere, name, 3);
  if (&t != &ref) t.require_shape(kWhere, name, {ref.shape[0], ref.shape[1], ref.shape[2]});
  ATTNKIT_REQUIRE(is_float(t.dtype), kWhere, std::string(name) + ".dtype", dtype_name(t.dtype),
                  "must be f32, f16 or bf16");
  t.require_last_dim_contiguous(kWhere, name);
  ATTNKIT_REQUIRE(t.data != nullptr || t.numel() == 0, kWhere, std::string(name) + ".data",
                  "nullptr", "a tensor with elements must point at memory");
  require_same_device(t, name, ref);
}

void check_lse(const TensorView& t, std::string_view name, const TensorView& out_a) {
  t.require_dtype(kWhere, name, DType::f32);
  const int64_t heads = out_a.shape[1], tokens = out_a.shape[0];
  ATTNKIT_REQUIRE(t.ndim == 2 && t.shape[0] == heads && t.shape[1] == tokens, kWhere,
                  std::string(name) + ".shape", t.shape_str(),
                  "must be [num_heads = " + std::to_string(heads) +
                      ", num_tokens = " + std::to_string(tokens) + "] (out_a is " +
                      out_a.shape_str() + ")");
  ATTNKIT_REQUIRE(t.data != nullptr || t.numel() == 0, kWhere, std::string(name) + ".data",
                  "nullptr", "a tensor with elements must point at memory");
  require_same_device(t, name, out_a);
}

// Address of element (token, head, 0) of a [tokens, heads, head_size] view, in bytes.
const uint8_t* row_ptr(const TensorView& t, int64_t token, int64_t head) {
  return static_cast<const uint8_t*>(t.data) +
         (token * t.strides[0] + head * t.strides[1]) * static_cast<int64_t>(dtype_size(t.dtype));
}

void merge_states_cpu(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                      const TensorView& lse_b, const TensorView& out, const TensorView& lse_out) {
  const int64_t tokens = out_a.shape[0], heads = out_a.shape[1], hs = out_a.shape[2];
  auto lse_at = [](const TensorView& l, int64_t h, int64_t t) {
    return l.ptr<const float>()[h * l.strides[0] + t * l.strides[1]];
  };
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, heads * hs));
  detail::parallel_for(
      tokens,
      [&](int64_t t) {
        for (int64_t h = 0; h < heads; ++h) {
          float wa, wb;
          const float lse = merge_weights(lse_at(lse_a, h, t), lse_at(lse_b, h, t), &wa, &wb);
          const uint8_t* a = row_ptr(out_a, t, h);
          const uint8_t* b = row_ptr(out_b, t, h);
          auto* o = const_cast<uint8_t*>(row_ptr(out, t, h));
          // Element-wise read-then-write: correct when `out` aliases out_a or out_b.
          for (int64_t d = 0; d < hs; ++d) {
            const float va = load_as_float(a, out_a.dtype, d);
            const float vb = load_as_float(b, out_b.dtype, d);
            store_from_float(o, out.dtype, d, merge_value(va, wa, vb, wb));
          }
          if (lse_out.defined())
            lse_out.ptr<float>()[h * lse_out.strides[0] + t * lse_out.strides[1]] = lse;
        }
      },
      grain);
}

}  // namespace

void merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                  const TensorView& lse_b, const TensorView& out, const TensorView& lse_out,
                  void* stream) {
  check_out(out_a, "out_a", out_a);
  check_out(out_b, "out_b", out_a);
  check_out(out, "out", out_a);
  check_lse(lse_a, "lse_a", out_a);
  check_lse(lse_b, "lse_b", out_a);
  if (lse_out.defined()) check_lse(lse_out, "lse_out", out_a);
  if (out_a.device == Device::CUDA) {
    cuda::merge_states(out_a, lse_a, out_b, lse_b, out, lse_out, stream);
    return;
  }
  merge_states_cpu(out_a, lse_a, out_b, lse_b, out, lse_out);
}

}  // namespace attnkit
