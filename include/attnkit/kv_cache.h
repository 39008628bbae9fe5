// Paged KV cache: spec, logical shape and stride order, block-table addressing, write_kv.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

#include "attnkit/dtype.h"
#include "attnkit/tensor.h"

namespace attnkit {

enum class KVLayout : uint8_t {
  NHD,  // physical (num_blocks, 2, block_size, num_kv_heads, head_size)
  HND,  // physical (num_blocks, 2, num_kv_heads, block_size, head_size)
};
std::string_view layout_name(KVLayout l);
KVLayout parse_layout(std::string_view name);  // "NHD" / "HND" (case-insensitive)

// One side (K or V) of a paged cache as plain data: what kernels and the reference read.
// Row (block b, slot s, head h) starts at base + b*stride_block + s*stride_slot + h*stride_head
// (units: elements of the storage type; bytes for fp8 and nvfp4). For nvfp4 a row's packed
// values are head_size/2 bytes at that offset, and its head_size/16 e4m3 scales are at
// scale_base + b*scale_stride_block + s*scale_stride_slot + h*scale_stride_head.
//
// NVFP4 packed cache layout (as vLLM's FlashInfer path stores it). The cache tensor's logical
// last dim is row_elems = head_size/2 + head_size/16 bytes, but the bytes are NOT stored row by
// row: each (block, side) region of block_size * num_kv_heads * row_elems bytes is
//   [ data rows: block_size*num_kv_heads rows of head_size/2 bytes | scale rows: the same
//     number of rows of head_size/16 e4m3 bytes ]
// with rows in physical order: row index r = slot*num_kv_heads + head (NHD, slot-major) or
// head*block_size + slot (HND, head-major). So a block is [K data | K scales | V data | V scales]
// and, relative to the cache start, row (b, side, s, h) has
//   data  at b*bytes_per_block + side*side_bytes + r*(head_size/2)
//   scales at b*bytes_per_block + side*side_bytes + block_size*num_kv_heads*(head_size/2)
//             + r*(head_size/16),   side_bytes = block_size*num_kv_heads*row_elems.
// Inside a data row, value 2i is the low nibble of byte i and value 2i+1 the high nibble;
// scale byte j covers values 16j..16j+15 (docs/architecture.md section 2).
struct PagedKVSide {
  void* base = nullptr;
  void* scale_base = nullptr;  // nvfp4 only
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;
  int64_t scale_stride_block = 0, scale_stride_slot = 0, scale_stride_head = 0;
};

struct PagedKV {
  PagedKVSide k, v;
  DType dtype = DType::bf16;  // cache dtype: f32/f16/bf16/fp8_e4m3/fp8_e5m2/nvfp4
  Device device = Device::CPU;
  int device_index = 0;
  int64_t num_blocks = 0;
  int block_size = 0, num_kv_heads = 0, head_size = 0;
  int64_t num_slots() const { return num_blocks * block_size; }
  // Checks the dtype (a cache dtype), the geometry (as KVCacheSpec::validate) and that the
  // sides (and nvfp4 scales) point at memory. Throws Error.
  void validate(std::string_view where) const;
};

// f32, f16, bf16, fp8_e4m3, fp8_e5m2 or nvfp4.
bool is_cache_dtype(DType t);

struct KVCacheSpec {
  int64_t num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_size = 0;
  DType cache_dtype = DType::bf16;
  KVLayout layout = KVLayout::NHD;

  // Checks every field (block_size a positive multiple of 16, head_size a multiple of 16 for
  // nvfp4 / of 8 otherwise, supported cache dtype, positive counts). Throws Error.
  void validate(std::string_view where = "KVCacheSpec") const;
  // Storage dtype of the cache tensor (u8 for nvfp4, else cache_dtype).
  DType storage_dtype() const;
  // Last logical dim in storage elements: head_size, or head_size/2 + head_size/16 for nvfp4.
  int64_t row_elems() const;
  // Logical shape (num_blocks, 2, block_size, num_kv_heads, row_elems()).
  std::array<int64_t, 5> logical_shape() const;
  // Permutation from logical to physical dim order: NHD (0,1,2,3,4), HND (0,1,3,2,4).
  std::array<int, 5> stride_order() const;
  // Strides of the logical dims (in storage elements) for a densely packed physical tensor.
  std::array<int64_t, 5> logical_strides() const;
  int64_t bytes_per_block() const;  // both K and V
  int64_t total_bytes() const;
  // Describes a dense cache tensor of this spec as K and V sides. `cache` must be contiguous
  // in the physical order with the storage dtype and num_blocks*bytes_per_block bytes; it is
  // passed as a 1-D view, a contiguous physically shaped view, or the logically shaped view
  // whose strides are logical_strides() (what vLLM's kv_cache tensor is).
  PagedKV view(const TensorView& cache) const;
};

// Builds a PagedKV from separate K and V cache views of shape
// [num_blocks, block_size, num_kv_heads, head_size] with any strides on the first three dims
// and a contiguous last dim (vLLM's kv_cache[:, 0] / kv_cache[:, 1]). Not for nvfp4.
PagedKV paged_kv_from_views(const TensorView& key_cache, const TensorView& value_cache);

// An nvfp4 PagedKV from separate views (FlashInfer's form: packed codes and block scales in
// their own tensors): key_codes / value_codes uint8 [num_blocks, block_size, num_kv_heads,
// head_size / 2] (value 2i in the low nibble of byte i) and key_scales / value_scales uint8 (e4m3
// bytes) [num_blocks, block_size, num_kv_heads, head_size / 16], any strides on the first three
// dims and a contiguous last dim, all on one device. The global scales are the call's k_scale /
// v_scale (KVScales). Error naming the tensor and the rule otherwise.
PagedKV paged_kv_nvfp4_from_views(const TensorView& key_codes, const TensorView& value_codes,
                                  const TensorView& key_scales, const TensorView& value_scales);

// Quantization scales for fp8 / nvfp4 caches: float32, shape [1] (per tensor) or
// [num_kv_heads] (per KV head; fp8 only). For nvfp4 they are the global scales.
// Undefined views mean 1.0. Same device as the cache.
struct KVScales {
  TensorView k_scale, v_scale;
};

// The reshape-and-cache op. key/value: [num_tokens, num_kv_heads, head_size] (f32/f16/bf16,
// one dtype for both, last dim contiguous, other dims any stride); slot_mapping: int64
// [num_tokens] (negative = padding, skipped; slot >= num_blocks*block_size -> Error).
// Quantizes to fp8/nvfp4 per `scales`: fp8 stores saturate(RNE(x / scale[h])), nvfp4 uses the
// scale as the global scale of quantize_nvfp4_block. Scales are not used for f32/f16/bf16
// caches (their dtype, shape and device are still checked). Runs on the device the tensors
// live on (all on the cache's device); `stream` is a cudaStream_t for CUDA tensors (never the legacy default stream unless the
// caller passes it). Shapes, dtypes and devices are checked on the host for both devices;
// the values of slot_mapping and of the scales (finite, > 0) are checked on the host for CPU
// tensors only: for CUDA tensors they stay on the device and the kernel must not write a slot
// out of range.
void write_kv(const TensorView& key, const TensorView& value, const PagedKV& cache,
              const TensorView& slot_mapping, const KVScales& scales = {},
              void* stream = nullptr);

// Storage offsets (in storage elements) of the row for cache slot `slot` (block*bs + offset).
inline int64_t row_offset(const PagedKVSide& side, int block_size, int64_t slot, int head) {
  const int64_t b = slot / block_size, s = slot % block_size;
  return b * side.stride_block + s * side.stride_slot + head * side.stride_head;
}
inline int64_t scale_offset(const PagedKVSide& side, int block_size, int64_t slot, int head) {
  const int64_t b = slot / block_size, s = slot % block_size;
  return b * side.scale_stride_block + s * side.scale_stride_slot + head * side.scale_stride_head;
}
// Cache slot of logical position `pos` of a request whose block-table row is `row`.
inline int64_t slot_of(const int32_t* row, int block_size, int64_t pos) {
  return static_cast<int64_t>(row[pos / block_size]) * block_size + pos % block_size;
}

}  // namespace attnkit
