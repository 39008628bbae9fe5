// DLPack -> TensorView and the small conversions shared by the bindings.
#include "convert.h"

#include "flash_attn/varlen_launch.h"

#include <string>

#include "attnkit/error.h"

namespace attnkit::py {

namespace {

namespace dl = nb::dlpack;

// DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 (pinned host memory,
// which the CPU reads directly), kDLCUDAManaged = 13 (unified memory: treated as CUDA).
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

std::string describe_dtype(dl::dtype t) {
  std::string kind;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    case dl::dtype_code::Bool: return "bool";
    default: kind = "dlpack_code" + std::to_string(int(t.code)) + "_bits"; break;
  }
  std::string s = kind + std::to_string(int(t.bits));
  if (t.lanes != 1) s += "x" + std::to_string(int(t.lanes));
  return s;
}

DType map_dtype(dl::dtype t, std::string_view where, std::string_view name) {
  using C = dl::dtype_code;
  if (t.lanes == 1) {
    switch (static_cast<C>(t.code)) {
      case C::Float:
        if (t.bits == 32) return DType::f32;
        if (t.bits == 16) return DType::f16;
        break;
      case C::Bfloat:
        if (t.bits == 16) return DType::bf16;
        break;
      case C::Float8_E4M3FN:
        if (t.bits == 8) return DType::fp8_e4m3;
        break;
      case C::Float8_E5M2:
        if (t.bits == 8) return DType::fp8_e5m2;
        break;
      case C::UInt:
        if (t.bits == 8) return DType::u8;
        break;
      case C::Int:
        if (t.bits == 32) return DType::i32;
        if (t.bits == 64) return DType::i64;
        break;
      default: break;
    }
  }
  fail(where, std::string(name) + ".dtype", describe_dtype(t),
       "must be one of float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, uint8, int32, "
       "int64");
}

template <class Array>
TensorView convert(const Array& a, std::string_view where, std::string_view name) {
  TensorView v;
  const size_t nd = a.ndim();
  ATTNKIT_REQUIRE(nd <= static_cast<size_t>(TensorView::kMaxDims), where,
                  std::string(name) + ".ndim", nd,
                  "must be <= " + std::to_string(TensorView::kMaxDims));
  v.dtype = map_dtype(a.dtype(), where, name);
  const int32_t dev = a.device_type();
  if (dev == kDLCPU || dev == kDLCUDAHost) {
    v.device = Device::CPU;
    v.device_index = 0;
  } else if (dev == kDLCUDA || dev == kDLCUDAManaged) {
    v.device = Device::CUDA;
    v.device_index = a.device_id();
  } else {
    fail(where, std::string(name) + ".device", "dlpack_device_type " + std::to_string(dev),
         "must be a CPU or CUDA array");
  }
  v.ndim = static_cast<int>(nd);
  for (size_t d = 0; d < nd; ++d) {
    v.shape[d] = static_cast<int64_t>(a.shape(d));
    v.strides[d] = static_cast<int64_t>(a.stride(d));
  }
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  return v;
}

}  // namespace

TensorView to_view(const InArray& a, std::string_view where, std::string_view name) {
  return convert(a, where, name);
}
TensorView to_view(const OutArray& a, std::string_view where, std::string_view name) {
  return convert(a, where, name);
}
TensorView to_view(const OptIn& a, std::string_view where, std::string_view name) {
  return a ? convert(*a, where, name) : TensorView{};
}
TensorView to_view(const OptOut& a, std::string_view where, std::string_view name) {
  return a ? convert(*a, where, name) : TensorView{};
}

TensorView as_cache_view(TensorView cache, std::string_view kv_cache_dtype,
                         std::string_view where, std::string_view name) {
  const std::string dtype_key = std::string(name) + ".dtype";
  if (kv_cache_dtype == "auto") {
    ATTNKIT_REQUIRE(cache.dtype != DType::u8, where, dtype_key, "uint8",
                    "a uint8 cache holds fp8 bytes: pass kv_cache_dtype 'fp8', 'fp8_e4m3' or "
                    "'fp8_e5m2'");
    return cache;
  }
  const DType want = parse_dtype(kv_cache_dtype);
  if (is_fp8(want)) {
    ATTNKIT_REQUIRE(cache.dtype == DType::u8 || cache.dtype == want, where, dtype_key,
                    dtype_name(cache.dtype),
                    "kv_cache_dtype '" + std::string(kv_cache_dtype) +
                        "' needs a uint8 or " + std::string(dtype_name(want)) + " cache tensor");
    cache.dtype = want;
    return cache;
  }
  ATTNKIT_REQUIRE(cache.dtype == want, where, dtype_key, dtype_name(cache.dtype),
                  "must match kv_cache_dtype '" + std::string(kv_cache_dtype) + "'");
  return cache;
}

TensorView as_kv_scale(TensorView s, int num_kv_heads, std::string_view where,
                       std::string_view name) {
  if (!s.defined()) return s;
  const std::string shape_key = std::string(name) + ".shape";
  const std::string rule = "must be a scalar, [1], [num_kv_heads = " +
                           std::to_string(num_kv_heads) +
                           "] or [num_seqs, num_kv_heads] with equal rows (an expanded view)";
  if (s.ndim == 0) {
    s.ndim = 1;
    s.shape[0] = 1;
    s.strides[0] = 1;
    return s;
  }
  if (s.ndim == 2) {
    // FlashAttention's descale [num_seqs, num_kv_heads]: one row of memory, used by every seq.
    ATTNKIT_REQUIRE(s.shape[0] == 1 || s.strides[0] == 0, where, shape_key, s.shape_str(),
                    rule + "; per-sequence scales are not supported");
    s.ndim = 1;
    s.shape[0] = s.shape[1];
    s.strides[0] = s.strides[1];
  }
  ATTNKIT_REQUIRE(s.ndim == 1, where, shape_key, s.shape_str(), rule);
  if (s.shape[0] > 1 && s.strides[0] == 0) {  // one value broadcast over the heads
    s.shape[0] = 1;
    s.strides[0] = 1;
  }
  return s;
}

std::vector<int32_t> host_int32(const TensorView& t, std::string_view where, std::string_view name,
                                int64_t expect_len) {
  t.require_dtype(where, name, DType::i32);
  t.require_device(where, name, Device::CPU);
  ATTNKIT_REQUIRE(t.ndim >= 1, where, std::string(name) + ".shape", t.shape_str(),
                  "must have at least one dim");
  if (expect_len >= 0) {
    ATTNKIT_REQUIRE(t.ndim == 1 && t.shape[0] == expect_len, where, std::string(name) + ".shape",
                    t.shape_str(), "must be [" + std::to_string(expect_len) + "]");
  }
  // Row-major walk over any strides (1-D or 2-D in practice).
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  const auto* base = static_cast<const int32_t*>(t.data);
  std::array<int64_t, TensorView::kMaxDims> idx{};
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim; ++d) off += idx[d] * t.strides[d];
    out[i] = base[off];
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

PagedKV identity_paged_kv(const TensorView& k, const TensorView& v, std::string_view where) {
  (void)where;  // (the view's checks name "flash_attn contiguous K/V")
  return flash_attn::contiguous_kv_view(k, v);
}

}  // namespace attnkit::py
