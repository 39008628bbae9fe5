// DLPack arrays (nanobind ndarrays from any framework) -> attnkit::TensorView, and the small
// conversions every binding needs (cache dtypes, scales, host copies of int arrays).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"

namespace attnkit::py {

namespace nb = nanobind;

// Inputs are read-only views (so read-only NumPy arrays are accepted); outputs must be writable.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;
using OptIn = std::optional<InArray>;
using OptOut = std::optional<OutArray>;

// The TensorView of a DLPack array: dtype from the DLPack code (float32/16, bfloat16,
// float8_e4m3fn, float8_e5m2, uint8, int32, int64), device CPU (also CUDA-pinned host memory)
// or CUDA, shape and strides in elements. Anything else throws Error naming `name`.
TensorView to_view(const InArray& a, std::string_view where, std::string_view name);
TensorView to_view(const OutArray& a, std::string_view where, std::string_view name);
TensorView to_view(const OptIn& a, std::string_view where, std::string_view name);
TensorView to_view(const OptOut& a, std::string_view where, std::string_view name);

// The cache dtype a KV cache tensor holds, given vLLM's kv_cache_dtype string: "auto" = the
// tensor's own dtype (uint8 is refused: it needs an fp8 name); "fp8" / "fp8_e4m3" / "fp8_e5m2"
// = that fp8 format, stored in a uint8 tensor or one of that fp8 dtype; any other name must
// match the tensor's dtype. Returns the view re-typed to the cache dtype (same bytes).
TensorView as_cache_view(TensorView cache, std::string_view kv_cache_dtype,
                         std::string_view where, std::string_view name);

// A dequant scale as the library takes it (f32 [1] or [num_kv_heads]): accepts a 0-d scalar,
// [1], [num_kv_heads], or FlashAttention's [num_seqs, num_kv_heads] descale when every row is
// the same memory (stride 0, as `expand` makes) or there is one row. Undefined stays undefined.
TensorView as_kv_scale(TensorView s, int num_kv_heads, std::string_view where,
                       std::string_view name);

// A small int32 array copied to the host (CPU arrays only), honouring strides; `expect_len`
// >= 0 checks the length. Throws Error on a wrong dtype, device or length.
std::vector<int32_t> host_int32(const TensorView& t, std::string_view where, std::string_view name,
                                int64_t expect_len = -1);

// Block size of the identity paged view over contiguous K/V (the reference's minimum).
inline constexpr int kIdentityBlock = 16;

// Contiguous k / v [total_tokens, num_kv_heads, head_size] as a paged cache, with no copy:
// block b starts at token row b and holds kIdentityBlock consecutive rows (blocks overlap), so a
// request whose keys start at row s reads position p from row s + p through a block row
// s, s + 16, s + 32, ... (num_blocks = total_tokens). Checks v against k (shape, dtype).
PagedKV identity_paged_kv(const TensorView& k, const TensorView& v, std::string_view where);

// The CUDA stream handle passed from Python as an int (0 = the legacy default stream).
inline void* stream_ptr(uintptr_t s) { return reinterpret_cast<void*>(s); }

}  // namespace attnkit::py
