// The KV-cache write (reshape_and_cache_flash / write_kv) and the LSE merge (merge_states).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <string>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/ops.h"
#include "convert.h"

namespace attnkit::py {

namespace {

// vLLM's reshape_and_cache_flash: key/value [T, num_kv_heads, head_size] (T may exceed
// slot_mapping's length under CUDA-graph padding: only the first slot_mapping.size(0) rows are
// written), caches [num_blocks, block_size, num_kv_heads, head_size] with any strides on the
// first three dims (kv_cache[:, 0] / kv_cache[:, 1]).
void reshape_and_cache(const InArray& key, const InArray& value, const InArray& key_cache,
                       const InArray& value_cache, const InArray& slot_mapping,
                       const std::string& kv_cache_dtype, const OptIn& k_scale,
                       const OptIn& v_scale, uintptr_t stream) {
  constexpr std::string_view where = "reshape_and_cache_flash";
  TensorView k = to_view(key, where, "key"), v = to_view(value, where, "value");
  const TensorView slots = to_view(slot_mapping, where, "slot_mapping");
  slots.require_ndim(where, "slot_mapping", 1);
  k.require_ndim(where, "key", 3);
  v.require_ndim(where, "value", 3);
  const int64_t n = slots.shape[0];
  ATTNKIT_REQUIRE(k.shape[0] >= n, where, "key.size(0)", k.shape[0],
                  "must be >= slot_mapping.size(0) = " + std::to_string(n));
  ATTNKIT_REQUIRE(v.shape[0] >= n, where, "value.size(0)", v.shape[0],
                  "must be >= slot_mapping.size(0) = " + std::to_string(n));
  k.shape[0] = n;  // the padded tail is not written (vLLM counts tokens by slot_mapping)
  v.shape[0] = n;
  const TensorView kc = as_cache_view(to_view(key_cache, where, "key_cache"), kv_cache_dtype, where, "key_cache");
  const TensorView vc = as_cache_view(to_view(value_cache, where, "value_cache"), kv_cache_dtype, where, "value_cache");
  const PagedKV cache = paged_kv_from_views(kc, vc);
  KVScales scales;
  if (is_fp8(cache.dtype)) {  // "auto" caches ignore the scales, as vLLM's kernel does
    scales.k_scale = as_kv_scale(to_view(k_scale, where, "k_scale"), cache.num_kv_heads, where, "k_scale");
    scales.v_scale = as_kv_scale(to_view(v_scale, where, "v_scale"), cache.num_kv_heads, where, "v_scale");
  }
  write_kv(k, v, cache, slots, scales, stream_ptr(stream));
}

void merge(const InArray& out_a, const InArray& lse_a, const InArray& out_b, const InArray& lse_b,
           const OutArray& out, const OptOut& lse_out, uintptr_t stream) {
  constexpr std::string_view where = "merge_states";
  merge_states(to_view(out_a, where, "out_a"), to_view(lse_a, where, "lse_a"),
               to_view(out_b, where, "out_b"), to_view(lse_b, where, "lse_b"),
               to_view(out, where, "out"), to_view(lse_out, where, "lse_out"), stream_ptr(stream));
}

}  // namespace

void register_kv_ops(nb::module_& m) {
  m.def("reshape_and_cache", &reshape_and_cache, nb::arg("key"), nb::arg("value"),
        nb::arg("key_cache"), nb::arg("value_cache"), nb::arg("slot_mapping"),
        nb::arg("kv_cache_dtype"), nb::arg("k_scale").none(), nb::arg("v_scale").none(),
        nb::arg("stream"),
        "Writes new tokens' K/V into the paged cache views (vLLM's reshape_and_cache_flash).");
  m.def("merge_states", &merge, nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"),
        nb::arg("lse_b"), nb::arg("out"), nb::arg("lse_out").none(), nb::arg("stream"),
        "Merges two partial attention results (natural-log LSE [num_heads, num_tokens]).");
}

}  // namespace attnkit::py
