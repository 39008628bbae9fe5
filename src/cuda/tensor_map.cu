#include "cuda/tensor_map.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <initializer_list>
#include <mutex>

namespace attnkit::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver the runtime already loaded (no link against libcuda).
EncodeTiled encode_fn() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(p);
    cudaGetLastError();
  });
  return fn;
}

bool fail(std::string* why, const std::string& rule) {
  if (why) *why = rule;
  return false;
}

// The rule the first of a map's strides (bytes) breaks; empty if none does.
std::string stride_refusal(std::initializer_list<int64_t> strides) {
  for (int64_t s : strides)
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40))
      return "stride " + std::to_string(s) + " must be a positive multiple of 16 below 2^40";
  return {};
}

}  // namespace

std::string paged_side_map_refusal(const PagedSideGeometry& g) {
  if (g.row_bytes <= 0 || g.row_bytes % 128 != 0 || g.row_bytes > 512)
    return "row bytes " + std::to_string(g.row_bytes) + " must be a multiple of 128 up to 512";
  if (g.block_size % 16 != 0) return "block size must be a multiple of 16";
  if (reinterpret_cast<uintptr_t>(g.base) % 16 != 0) return "cache base must be 16-byte aligned";
  if (std::string rule = stride_refusal({g.stride_block, g.stride_slot, g.stride_head}); !rule.empty()) return rule;
  // A box copies a whole block: blocks that overlap (the contiguous view of ragged K/V, a block
  // at every row) would read the last ones' slots past the end of the cache.
  if ((g.block_size - 1) * g.stride_slot + g.row_bytes > g.stride_block)
    return "a block's slots (" + std::to_string(g.block_size) + " x stride " + std::to_string(g.stride_slot) +
           ") must not run into the next block (stride " + std::to_string(g.stride_block) + ")";
  return {};
}

bool encode_paged_side_map(const PagedSideGeometry& g, TmaDesc& out, std::string* why) {
  static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc), "TmaDesc holds one CUtensorMap");
  if (std::string rule = paged_side_map_refusal(g); !rule.empty()) return fail(why, rule);
  const EncodeTiled fn = encode_fn();
  if (fn == nullptr) return fail(why, "the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[5] = {128, static_cast<cuuint64_t>(g.block_size), static_cast<cuuint64_t>(g.row_bytes / 128),
                              static_cast<cuuint64_t>(g.num_kv_heads), static_cast<cuuint64_t>(g.num_blocks)};
  const cuuint64_t strides[4] = {static_cast<cuuint64_t>(g.stride_slot), 128, static_cast<cuuint64_t>(g.stride_head),
                                 static_cast<cuuint64_t>(g.stride_block)};
  const int segments = g.row_bytes / 128;
  const cuuint32_t box[5] = {128, 16, static_cast<cuuint32_t>(segments), 1, 1};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 5, const_cast<void*>(g.base), dims, strides, box,
                        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return fail(why, "cuTensorMapEncodeTiled returned " + std::to_string(static_cast<int>(r)));
  std::memcpy(out.bytes, &map, sizeof map);
  return true;
}

std::string rows_map_refusal(const RowsGeometry& g) {
  if (reinterpret_cast<uintptr_t>(g.base) % 16 != 0) return "base must be 16-byte aligned";
  if (g.row_bytes <= 0 || g.row_bytes % 16 != 0)
    return "row bytes " + std::to_string(g.row_bytes) + " must be a positive multiple of 16";
  if (std::string rule = stride_refusal({g.stride_head, g.stride_token}); !rule.empty()) return rule;
  if (g.heads <= 0 || g.tokens <= 0)
    return "heads " + std::to_string(g.heads) + " and tokens " + std::to_string(g.tokens) + " must be positive";
  if (g.box_heads < 1 || g.box_tokens < 1 || g.box_heads > 256 || g.box_tokens > 256)
    return "box sides " + std::to_string(g.box_heads) + " x " + std::to_string(g.box_tokens) + " must be in [1, 256]";
  return {};
}

bool encode_rows_map(const RowsGeometry& g, TmaDesc& out, std::string* why) {
  if (std::string rule = rows_map_refusal(g); !rule.empty()) return fail(why, rule);
  const EncodeTiled fn = encode_fn();
  if (fn == nullptr) return fail(why, "the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(g.row_bytes), static_cast<cuuint64_t>(g.heads),
                              static_cast<cuuint64_t>(g.tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(g.stride_head), static_cast<cuuint64_t>(g.stride_token)};
  const cuuint32_t box[3] = {128, static_cast<cuuint32_t>(g.box_heads), static_cast<cuuint32_t>(g.box_tokens)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = fn(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, g.base, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return fail(why, "cuTensorMapEncodeTiled returned " + std::to_string(static_cast<int>(r)));
  std::memcpy(out.bytes, &map, sizeof map);
  return true;
}

}  // namespace attnkit::cuda
