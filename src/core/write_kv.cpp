// write_kv: validation for every device, and the CPU reshape-and-cache (plain copy with RNE
// conversion, fp8 quantization with per-tensor or per-head scales, nvfp4 block quantization).
#include <cmath>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "core/cuda_dispatch.h"

namespace attnkit {

namespace {

constexpr std::string_view kWhere = "write_kv";

std::string device_str(Device d, int index) {
  return std::string(device_name(d)) + ":" + std::to_string(index);
}

void require_on_cache_device(const TensorView& t, std::string_view name, const PagedKV& cache) {
  ATTNKIT_REQUIRE(t.device == cache.device && t.device_index == cache.device_index, kWhere,
                  std::string(name) + ".device", device_str(t.device, t.device_index),
                  "must be the cache's device " + device_str(cache.device, cache.device_index));
}

void check_kv_input(const TensorView& t, std::string_view name, const PagedKV& cache,
                    int64_t num_tokens) {
  t.require_ndim(kWhere, name, 3);
  t.require_shape(kWhere, name, {num_tokens, cache.num_kv_heads, cache.head_size});
  ATTNKIT_REQUIRE(is_float(t.dtype), kWhere, std::string(name) + ".dtype", dtype_name(t.dtype),
                  "must be f32, f16 or bf16");
  t.require_last_dim_contiguous(kWhere, name);
  ATTNKIT_REQUIRE(t.data != nullptr || num_tokens == 0, kWhere, std::string(name) + ".data",
                  "nullptr", "a tensor with elements must point at memory");
  require_on_cache_device(t, name, cache);
}

void check_scale(const TensorView& s, std::string_view name, const PagedKV& cache) {
  if (!s.defined()) return;
  s.require_dtype(kWhere, name, DType::f32);
  s.require_ndim(kWhere, name, 1);
  require_on_cache_device(s, name, cache);
  const int64_t n = s.shape[0];
  if (is_fp8(cache.dtype) || is_float(cache.dtype)) {
    ATTNKIT_REQUIRE(n == 1 || n == cache.num_kv_heads, kWhere, std::string(name) + ".shape",
                    s.shape_str(),
                    "must be [1] (per tensor) or [num_kv_heads = " +
                        std::to_string(cache.num_kv_heads) + "] (per KV head)");
  } else {
    ATTNKIT_REQUIRE(n == 1, kWhere, std::string(name) + ".shape", s.shape_str(),
                    "an nvfp4 cache takes one global scale per tensor: shape [1]");
  }
}

// Per-KV-head scales read from a CPU scale tensor (1.0 when undefined).
std::vector<float> head_scales(const TensorView& s, std::string_view name, const PagedKV& cache) {
  std::vector<float> out(cache.num_kv_heads, 1.f);
  if (!s.defined()) return out;
  const int64_t n = s.shape[0];
  for (int64_t i = 0; i < n; ++i) {
    const float v = s.ptr<const float>()[i * s.strides[0]];
    ATTNKIT_REQUIRE(std::isfinite(v) && v > 0.f, kWhere,
                    std::string(name) + "[" + std::to_string(i) + "]", v,
                    "a quantization scale must be finite and > 0");
  }
  for (int h = 0; h < cache.num_kv_heads; ++h)
    out[h] = s.ptr<const float>()[(n == 1 ? 0 : h) * s.strides[0]];
  return out;
}

// Writes one row of head_size floats to (slot, head) of one cache side.
void store_row(const PagedKV& cache, const PagedKVSide& side, int64_t slot, int head,
               const float* x, float scale) {
  const int64_t off = row_offset(side, cache.block_size, slot, head);
  const int hs = cache.head_size;
  if (is_float(cache.dtype)) {
    const int64_t elem = static_cast<int64_t>(dtype_size(cache.dtype));
    void* row = static_cast<uint8_t*>(side.base) + off * elem;
    for (int d = 0; d < hs; ++d) store_from_float(row, cache.dtype, d, x[d]);
  } else if (is_fp8(cache.dtype)) {
    uint8_t* row = static_cast<uint8_t*>(side.base) + off;
    for (int d = 0; d < hs; ++d) row[d] = quantize_fp8(cache.dtype, x[d], scale);
  } else {  // nvfp4
    uint8_t* packed = static_cast<uint8_t*>(side.base) + off;
    uint8_t* scales =
        static_cast<uint8_t*>(side.scale_base) + scale_offset(side, cache.block_size, slot, head);
    for (int b = 0; b < hs / kNvfp4BlockValues; ++b)
      quantize_nvfp4_block(x + b * kNvfp4BlockValues, scale, packed + b * kNvfp4BlockValues / 2,
                           scales + b);
  }
}

void write_kv_cpu(const TensorView& key, const TensorView& value, const PagedKV& cache,
                  const TensorView& slot_mapping, const KVScales& scales) {
  const int64_t num_tokens = slot_mapping.shape[0];
  const int64_t num_slots = cache.num_slots();
  const int64_t* slots = slot_mapping.ptr<const int64_t>();
  const int64_t sstride = slot_mapping.strides[0];
  // Check every slot before writing anything, so a rejected call leaves the cache untouched.
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t * sstride];
    ATTNKIT_REQUIRE(slot < num_slots, kWhere, "slot_mapping[" + std::to_string(t) + "]", slot,
                    "a slot must be < num_blocks * block_size = " + std::to_string(num_slots) +
                        " (negative = padding)");
  }
  const bool quantized = !is_float(cache.dtype);
  const std::vector<float> ks =
      quantized ? head_scales(scales.k_scale, "k_scale", cache) : std::vector<float>();
  const std::vector<float> vs =
      quantized ? head_scales(scales.v_scale, "v_scale", cache) : std::vector<float>();
  std::vector<float> row(cache.head_size);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t * sstride];
    if (slot < 0) continue;
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      for (int side = 0; side < 2; ++side) {
        const TensorView& src = side == 0 ? key : value;
        const auto* base = static_cast<const uint8_t*>(src.data) +
                           (t * src.strides[0] + h * src.strides[1]) *
                               static_cast<int64_t>(dtype_size(src.dtype));
        for (int d = 0; d < cache.head_size; ++d) row[d] = load_as_float(base, src.dtype, d);
        const float scale = quantized ? (side == 0 ? ks[h] : vs[h]) : 1.f;
        store_row(cache, side == 0 ? cache.k : cache.v, slot, h, row.data(), scale);
      }
    }
  }
}

}  // namespace

void write_kv(const TensorView& key, const TensorView& value, const PagedKV& cache,
              const TensorView& slot_mapping, const KVScales& scales, void* stream) {
  cache.validate(kWhere);
  slot_mapping.require_dtype(kWhere, "slot_mapping", DType::i64);
  slot_mapping.require_ndim(kWhere, "slot_mapping", 1);
  require_on_cache_device(slot_mapping, "slot_mapping", cache);
  const int64_t num_tokens = slot_mapping.shape[0];
  ATTNKIT_REQUIRE(slot_mapping.data != nullptr || num_tokens == 0, kWhere, "slot_mapping.data",
                  "nullptr", "a tensor with elements must point at memory");
  check_kv_input(key, "key", cache, num_tokens);
  check_kv_input(value, "value", cache, num_tokens);
  ATTNKIT_REQUIRE(value.dtype == key.dtype, kWhere, "value.dtype", dtype_name(value.dtype),
                  "must equal key.dtype = " + std::string(dtype_name(key.dtype)));
  check_scale(scales.k_scale, "k_scale", cache);
  check_scale(scales.v_scale, "v_scale", cache);
  if (cache.device == Device::CUDA) {
    cuda::write_kv(key, value, cache, slot_mapping, scales, stream);
    return;
  }
  write_kv_cpu(key, value, cache, slot_mapping, scales);
}

}  // namespace attnkit
