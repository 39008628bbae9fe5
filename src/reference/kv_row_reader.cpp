#include "reference/kv_row_reader.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "attnkit/error.h"

namespace attnkit::reference {

namespace {
float scale_at(const TensorView& scale, int64_t i) {
  return scale.ptr<const float>()[i * scale.stride(0)];
}
}  // namespace

void validate_kv_scale(const char* where, const char* name, const TensorView& scale,
                       const PagedKV& cache) {
  if (!scale.defined()) return;
  scale.require_dtype(where, name, DType::f32);
  scale.require_device(where, name, Device::CPU);
  scale.require_ndim(where, name, 1);
  const int64_t n = scale.size(0);
  if (cache.dtype == DType::nvfp4) {
    ATTNKIT_REQUIRE(n == 1, where, std::string(name) + ".shape", scale.shape_str(),
                    "an nvfp4 cache takes one global scale per tensor: shape [1]");
  } else {
    ATTNKIT_REQUIRE(n == 1 || n == cache.num_kv_heads, where, std::string(name) + ".shape",
                    scale.shape_str(),
                    "must be [1] (per tensor) or [num_kv_heads = " +
                        std::to_string(cache.num_kv_heads) + "] (per KV head)");
  }
  if (!is_fp8(cache.dtype) && cache.dtype != DType::nvfp4) return;  // unused: not read
  for (int64_t i = 0; i < n; ++i) {
    const float s = scale_at(scale, i);
    ATTNKIT_REQUIRE(std::isfinite(s) && s > 0.f, where,
                    std::string(name) + "[" + std::to_string(i) + "]", s,
                    "a dequant scale must be finite and > 0");
  }
}

KVRowReader::KVRowReader(const PagedKV& cache, const PagedKVSide& side, const TensorView& scale)
    : side_(side), dtype_(cache.dtype), block_size_(cache.block_size),
      head_size_(cache.head_size), head_scale_(cache.num_kv_heads, 1.f) {
  if (scale.defined()) {
    const bool per_head = scale.size(0) > 1;
    for (int h = 0; h < cache.num_kv_heads; ++h) head_scale_[h] = scale_at(scale, per_head ? h : 0);
  }
  if (dtype_ == DType::f16) {  // a table: the conversion is a call per element otherwise
    f16_code_.resize(65536);
    for (uint32_t c = 0; c < 65536; ++c) f16_code_[c] = f16_bits_to_float(static_cast<uint16_t>(c));
  }
  if (is_fp8(dtype_)) {
    for (int c = 0; c < 256; ++c)
      fp8_code_[c] = dequantize_fp8(dtype_, static_cast<uint8_t>(c), 1.f);
  }
}

void KVRowReader::read(int64_t slot, int kv_head, float* out) const {
  const int64_t off = row_offset(side_, block_size_, slot, kv_head);
  switch (dtype_) {
    case DType::f32: {
      std::memcpy(out, static_cast<const float*>(side_.base) + off, head_size_ * sizeof(float));
      return;
    }
    case DType::f16: {
      const uint16_t* row = static_cast<const uint16_t*>(side_.base) + off;
      for (int d = 0; d < head_size_; ++d) out[d] = f16_code_[row[d]];
      return;
    }
    case DType::bf16: {  // bf16 is the top half of an f32
      const uint16_t* row = static_cast<const uint16_t*>(side_.base) + off;
      for (int d = 0; d < head_size_; ++d)
        out[d] = std::bit_cast<float>(static_cast<uint32_t>(row[d]) << 16);
      return;
    }
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: {
      // read value = stored * scale, computed in float as every backend does.
      const uint8_t* row = static_cast<const uint8_t*>(side_.base) + off;
      const float s = head_scale_[kv_head];
      for (int d = 0; d < head_size_; ++d) out[d] = fp8_code_[row[d]] * s;
      return;
    }
    case DType::nvfp4: {
      const uint8_t* packed = static_cast<const uint8_t*>(side_.base) + off;
      const uint8_t* scales = static_cast<const uint8_t*>(side_.scale_base) +
                              scale_offset(side_, block_size_, slot, kv_head);
      const float g = head_scale_[kv_head];
      for (int b = 0; b < head_size_ / kNvfp4BlockValues; ++b)
        dequantize_nvfp4_block(packed + b * (kNvfp4BlockValues / 2), scales[b], g,
                               out + b * kNvfp4BlockValues);
      return;
    }
    default:
      fail("KVRowReader", "cache.dtype", dtype_name(dtype_),
           "must be f32, f16, bf16, fp8_e4m3, fp8_e5m2 or nvfp4");
  }
}

}  // namespace attnkit::reference
