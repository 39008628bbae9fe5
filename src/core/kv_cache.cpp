// KVCacheSpec: shape, stride order and addressing of the paged KV cache (docs/architecture.md section 2).
#include "attnkit/kv_cache.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "attnkit/error.h"

namespace attnkit {

std::string_view layout_name(KVLayout l) { return l == KVLayout::NHD ? "NHD" : "HND"; }

KVLayout parse_layout(std::string_view name) {
  std::string up(name);
  std::transform(up.begin(), up.end(), up.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (up == "NHD") return KVLayout::NHD;
  if (up == "HND") return KVLayout::HND;
  fail("parse_layout", "layout", std::string(name), "must be NHD or HND");
}

bool is_cache_dtype(DType t) { return is_float(t) || is_fp8(t) || t == DType::nvfp4; }

// The checks shared by KVCacheSpec and PagedKV.
static void validate_geometry(std::string_view where, int64_t num_blocks, int block_size,
                              int num_kv_heads, int head_size, DType cache_dtype) {
  ATTNKIT_REQUIRE(is_cache_dtype(cache_dtype), where, "cache_dtype", dtype_name(cache_dtype),
                  "must be one of f32, f16, bf16, fp8_e4m3, fp8_e5m2, nvfp4");
  ATTNKIT_REQUIRE(num_blocks > 0, where, "num_blocks", num_blocks, "must be > 0");
  ATTNKIT_REQUIRE(block_size > 0 && block_size % 16 == 0, where, "block_size", block_size,
                  "must be a positive multiple of 16");
  ATTNKIT_REQUIRE(num_kv_heads > 0, where, "num_kv_heads", num_kv_heads, "must be > 0");
  ATTNKIT_REQUIRE(head_size > 0, where, "head_size", head_size, "must be > 0");
  if (cache_dtype == DType::nvfp4) {
    ATTNKIT_REQUIRE(head_size % 16 == 0, where, "head_size", head_size,
                    "must be a multiple of 16 for an nvfp4 cache (one e4m3 scale per 16 values)");
  } else {
    ATTNKIT_REQUIRE(head_size % 8 == 0, where, "head_size", head_size, "must be a multiple of 8");
  }
}

void KVCacheSpec::validate(std::string_view where) const {
  validate_geometry(where, num_blocks, block_size, num_kv_heads, head_size, cache_dtype);
}

void PagedKV::validate(std::string_view where) const {
  validate_geometry(where, num_blocks, block_size, num_kv_heads, head_size, dtype);
  ATTNKIT_REQUIRE(k.base != nullptr && v.base != nullptr, where, "cache.base", "nullptr",
                  "the K and V sides must point at memory");
  if (dtype == DType::nvfp4) {
    ATTNKIT_REQUIRE(k.scale_base != nullptr && v.scale_base != nullptr, where,
                    "cache.scale_base", "nullptr", "an nvfp4 cache needs its block scales");
  }
}

DType KVCacheSpec::storage_dtype() const {
  return cache_dtype == DType::nvfp4 ? DType::u8 : cache_dtype;
}

int64_t KVCacheSpec::row_elems() const {
  return cache_dtype == DType::nvfp4 ? head_size / 2 + head_size / 16 : head_size;
}

std::array<int64_t, 5> KVCacheSpec::logical_shape() const {
  return {num_blocks, 2, block_size, num_kv_heads, row_elems()};
}

std::array<int, 5> KVCacheSpec::stride_order() const {
  if (layout == KVLayout::HND) return {0, 1, 3, 2, 4};
  return {0, 1, 2, 3, 4};
}

std::array<int64_t, 5> KVCacheSpec::logical_strides() const {
  const auto shape = logical_shape();
  const auto order = stride_order();
  // Physical dim i is logical dim order[i]; strides are dense in physical order.
  std::array<int64_t, 5> strides{};
  int64_t s = 1;
  for (int i = 4; i >= 0; --i) {
    strides[order[i]] = s;
    s *= shape[order[i]];
  }
  return strides;
}

int64_t KVCacheSpec::bytes_per_block() const {
  const int64_t elem = static_cast<int64_t>(dtype_size(storage_dtype()));
  return 2 * static_cast<int64_t>(block_size) * num_kv_heads * row_elems() * elem;
}

int64_t KVCacheSpec::total_bytes() const { return num_blocks * bytes_per_block(); }

static std::string dims_str(const std::array<int64_t, 5>& dims) {
  std::string s = "[";
  for (int d = 0; d < 5; ++d) {
    if (d) s += ", ";
    s += std::to_string(dims[d]);
  }
  return s + "]";
}

// Accepts the three spellings of a dense cache tensor: 1-D, physically shaped and contiguous,
// or logically shaped with logical_strides().
static void check_cache_tensor(const KVCacheSpec& spec, const TensorView& cache) {
  constexpr std::string_view where = "KVCacheSpec::view";
  cache.require_dtype(where, "cache", spec.storage_dtype());
  ATTNKIT_REQUIRE(cache.data != nullptr, where, "cache.data", "nullptr",
                  "the cache must point at memory");
  const auto shape = spec.logical_shape();
  const auto order = spec.stride_order();
  const auto lstrides = spec.logical_strides();
  const int64_t numel = spec.total_bytes() / static_cast<int64_t>(dtype_size(spec.storage_dtype()));
  if (cache.ndim == 1) {
    ATTNKIT_REQUIRE(cache.shape[0] == numel, where, "cache.shape", cache.shape_str(),
                    "a 1-D cache must hold num_blocks * 2 * block_size * num_kv_heads * "
                    "row_elems = " + std::to_string(numel) + " elements");
    cache.require_contiguous(where, "cache");
    return;
  }
  ATTNKIT_REQUIRE(cache.ndim == 5, where, "cache.shape", cache.shape_str(),
                  "must be 1-D, physically shaped or logically shaped (5 dims)");
  bool physical = true, logical = true;
  for (int d = 0; d < 5; ++d) {
    if (cache.shape[d] != shape[order[d]]) physical = false;
    if (cache.shape[d] != shape[d] || (shape[d] != 1 && cache.strides[d] != lstrides[d]))
      logical = false;
  }
  if (logical) return;
  if (physical) {
    cache.require_contiguous(where, "cache");
    return;
  }
  std::array<int64_t, 5> phys{};
  for (int d = 0; d < 5; ++d) phys[d] = shape[order[d]];
  fail(where, "cache.shape", cache.shape_str(),
       "must be a contiguous physical " + dims_str(phys) + " tensor (layout " +
           std::string(layout_name(spec.layout)) + ") or its logical " + dims_str(shape) +
       " view with logical_strides()");
}

PagedKV KVCacheSpec::view(const TensorView& cache) const {
  validate("KVCacheSpec::view");
  check_cache_tensor(*this, cache);
  PagedKV kv;
  kv.dtype = cache_dtype;
  kv.device = cache.device;
  kv.device_index = cache.device_index;
  kv.num_blocks = num_blocks;
  kv.block_size = block_size;
  kv.num_kv_heads = num_kv_heads;
  kv.head_size = head_size;
  const auto ls = logical_strides();
  const int64_t elem = static_cast<int64_t>(dtype_size(storage_dtype()));
  auto* bytes = static_cast<uint8_t*>(cache.data);
  kv.k.base = bytes;
  kv.v.base = bytes + ls[1] * elem;
  if (cache_dtype != DType::nvfp4) {
    for (PagedKVSide* side : {&kv.k, &kv.v}) {
      side->stride_block = ls[0];
      side->stride_slot = ls[2];
      side->stride_head = ls[3];
    }
    return kv;
  }
  // nvfp4: each (block, side) region is [data rows | scale rows], rows in physical order.
  const int64_t data_row = head_size / 2, scale_row = head_size / 16;
  const int64_t rows = static_cast<int64_t>(block_size) * num_kv_heads;
  const bool nhd = layout == KVLayout::NHD;
  for (PagedKVSide* side : {&kv.k, &kv.v}) {
    side->scale_base = static_cast<uint8_t*>(side->base) + rows * data_row;
    side->stride_block = side->scale_stride_block = ls[0];
    side->stride_slot = nhd ? num_kv_heads * data_row : data_row;
    side->stride_head = nhd ? data_row : block_size * data_row;
    side->scale_stride_slot = nhd ? num_kv_heads * scale_row : scale_row;
    side->scale_stride_head = nhd ? scale_row : block_size * scale_row;
  }
  return kv;
}

PagedKV paged_kv_from_views(const TensorView& key_cache, const TensorView& value_cache) {
  constexpr std::string_view where = "paged_kv_from_views";
  key_cache.require_ndim(where, "key_cache", 4);
  value_cache.require_ndim(where, "value_cache", 4);
  ATTNKIT_REQUIRE(key_cache.data != nullptr, where, "key_cache.data", "nullptr",
                  "the cache must point at memory");
  ATTNKIT_REQUIRE(value_cache.data != nullptr, where, "value_cache.data", "nullptr",
                  "the cache must point at memory");
  value_cache.require_shape(where, "value_cache",
                            {key_cache.shape[0], key_cache.shape[1], key_cache.shape[2],
                             key_cache.shape[3]});
  ATTNKIT_REQUIRE(value_cache.dtype == key_cache.dtype, where, "value_cache.dtype",
                  dtype_name(value_cache.dtype),
                  "must equal key_cache.dtype = " + std::string(dtype_name(key_cache.dtype)));
  ATTNKIT_REQUIRE(is_float(key_cache.dtype) || is_fp8(key_cache.dtype), where, "key_cache.dtype",
                  dtype_name(key_cache.dtype),
                  "must be f32, f16, bf16, fp8_e4m3 or fp8_e5m2 (nvfp4 caches need "
                  "KVCacheSpec::view)");
  ATTNKIT_REQUIRE(value_cache.device == key_cache.device &&
                      value_cache.device_index == key_cache.device_index,
                  where, "value_cache.device",
                  std::string(device_name(value_cache.device)) + ":" +
                      std::to_string(value_cache.device_index),
                  "must equal key_cache.device = " + std::string(device_name(key_cache.device)) +
                      ":" + std::to_string(key_cache.device_index));
  key_cache.require_last_dim_contiguous(where, "key_cache");
  value_cache.require_last_dim_contiguous(where, "value_cache");
  for (int d = 0; d < 3; ++d) {
    ATTNKIT_REQUIRE(key_cache.strides[d] >= 0, where,
                    "key_cache.stride(" + std::to_string(d) + ")", key_cache.strides[d],
                    "must be >= 0");
    ATTNKIT_REQUIRE(value_cache.strides[d] == key_cache.strides[d], where,
                    "value_cache.stride(" + std::to_string(d) + ")", value_cache.strides[d],
                    "must equal key_cache.stride(" + std::to_string(d) +
                        ") = " + std::to_string(key_cache.strides[d]) +
                        " (K and V share one addressing)");
  }
  PagedKV kv;
  kv.dtype = key_cache.dtype;
  kv.device = key_cache.device;
  kv.device_index = key_cache.device_index;
  kv.num_blocks = key_cache.shape[0];
  kv.block_size = static_cast<int>(key_cache.shape[1]);
  kv.num_kv_heads = static_cast<int>(key_cache.shape[2]);
  kv.head_size = static_cast<int>(key_cache.shape[3]);
  kv.k.base = key_cache.data;
  kv.v.base = value_cache.data;
  for (PagedKVSide* side : {&kv.k, &kv.v}) {
    side->stride_block = key_cache.strides[0];
    side->stride_slot = key_cache.strides[1];
    side->stride_head = key_cache.strides[2];
  }
  kv.validate(where);
  return kv;
}

PagedKV paged_kv_nvfp4_from_views(const TensorView& key_codes, const TensorView& value_codes,
                                  const TensorView& key_scales, const TensorView& value_scales) {
  constexpr std::string_view where = "paged_kv_nvfp4_from_views";
  const TensorView* views[4] = {&key_codes, &value_codes, &key_scales, &value_scales};
  const char* names[4] = {"key_codes", "value_codes", "key_scales", "value_scales"};
  for (int i = 0; i < 4; ++i) {
    const TensorView& t = *views[i];
    t.require_ndim(where, names[i], 4);
    ATTNKIT_REQUIRE(t.data != nullptr, where, std::string(names[i]) + ".data", "nullptr", "must point at memory");
    t.require_dtype(where, names[i], DType::u8);
    t.require_last_dim_contiguous(where, names[i]);
    ATTNKIT_REQUIRE(t.device == key_codes.device && t.device_index == key_codes.device_index, where,
                    std::string(names[i]) + ".device",
                    std::string(device_name(t.device)) + ":" + std::to_string(t.device_index),
                    "must equal key_codes.device = " + std::string(device_name(key_codes.device)) + ":" +
                        std::to_string(key_codes.device_index));
    for (int d = 0; d < 3; ++d)
      ATTNKIT_REQUIRE(t.strides[d] >= 0, where, std::string(names[i]) + ".stride(" + std::to_string(d) + ")",
                      t.strides[d], "must be >= 0");
  }
  const int64_t head_size = key_codes.shape[3] * 2;
  ATTNKIT_REQUIRE(head_size > 0 && head_size % kNvfp4BlockValues == 0, where, "key_codes.shape[3]", key_codes.shape[3],
                  "must be head_size / 2 for a head_size that is a multiple of 16");
  const int64_t n0 = key_codes.shape[0], n1 = key_codes.shape[1], n2 = key_codes.shape[2];
  value_codes.require_shape(where, "value_codes", {n0, n1, n2, head_size / 2});
  key_scales.require_shape(where, "key_scales", {n0, n1, n2, head_size / kNvfp4BlockValues});
  value_scales.require_shape(where, "value_scales", {n0, n1, n2, head_size / kNvfp4BlockValues});
  PagedKV kv;
  kv.dtype = DType::nvfp4;
  kv.device = key_codes.device;
  kv.device_index = key_codes.device_index;
  kv.num_blocks = key_codes.shape[0];
  kv.block_size = static_cast<int>(key_codes.shape[1]);
  kv.num_kv_heads = static_cast<int>(key_codes.shape[2]);
  kv.head_size = static_cast<int>(head_size);
  auto side = [](PagedKVSide& s, const TensorView& c, const TensorView& sc) {
    s.base = c.data;
    s.stride_block = c.strides[0];
    s.stride_slot = c.strides[1];
    s.stride_head = c.strides[2];
    s.scale_base = sc.data;
    s.scale_stride_block = sc.strides[0];
    s.scale_stride_slot = sc.strides[1];
    s.scale_stride_head = sc.strides[2];
  };
  side(kv.k, key_codes, key_scales);
  side(kv.v, value_codes, value_scales);
  kv.validate(where);
  return kv;
}

}  // namespace attnkit
