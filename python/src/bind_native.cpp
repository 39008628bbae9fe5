// The native API: the backend registry, the selector, KV cache specs and the native write_kv
// over one physically shaped cache tensor.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/selector.h"
#include "convert.h"

namespace attnkit::py {

namespace {

std::vector<std::string> dtype_names(const std::vector<DType>& ts) {
  std::vector<std::string> out;
  for (DType t : ts) out.emplace_back(dtype_name(t));
  return out;
}

nb::dict features_dict(const Features& f) {
  nb::dict d;
  d["sinks"] = f.sinks;
  d["alibi"] = f.alibi;
  d["softcap"] = f.softcap;
  d["sliding_window"] = f.sliding_window;
  d["non_causal"] = f.non_causal;
  d["lse"] = f.lse;
  return d;
}

nb::list list_backends() {
  nb::list out;
  for (const AttentionBackend* b : backends()) {
    const Capabilities c = b->capabilities();
    nb::dict d;
    d["name"] = std::string(b->name());
    d["dtypes"] = dtype_names(c.dtypes);
    d["cache_dtypes"] = dtype_names(c.cache_dtypes);
    d["head_sizes"] = c.head_sizes;
    d["block_sizes"] = c.block_sizes.describe();
    std::vector<std::string> layouts;
    for (KVLayout l : c.layouts) layouts.emplace_back(layout_name(l));
    d["layouts"] = layouts;
    d["features"] = features_dict(c.features);
    d["runs_on_cpu"] = c.runs_on_cpu;
    d["min_cc"] = c.min_cc;
    out.append(d);
  }
  return out;
}

DType resolve_cache_dtype(const std::string& cache_dtype, DType dtype) {
  return cache_dtype == "auto" ? dtype : parse_dtype(cache_dtype);
}

AttentionConfig make_config(int num_heads, int num_kv_heads, int head_size, const std::string& dtype,
                            const std::string& kv_cache_dtype, int block_size,
                            const std::string& layout, const Features& features, int cc,
                            int num_sms) {
  AttentionConfig cfg;
  cfg.num_heads = num_heads;
  cfg.num_kv_heads = num_kv_heads;
  cfg.head_size = head_size;
  cfg.dtype = parse_dtype(dtype);
  cfg.cache_dtype = resolve_cache_dtype(kv_cache_dtype, cfg.dtype);
  cfg.block_size = block_size;
  cfg.layout = parse_layout(layout);
  cfg.features = features;
  ATTNKIT_REQUIRE(cc >= 0, "select", "cc", cc, "must be 0 (CPU) or a compute capability like 90");
  cfg.device = cc == 0 ? DeviceSpec::Cpu() : DeviceSpec::Cuda(cc / 10, cc % 10, num_sms);
  return cfg;
}

nb::dict select(int num_heads, int num_kv_heads, int head_size, const std::string& dtype,
                const std::string& kv_cache_dtype, int block_size, const std::string& layout,
                bool sinks, bool alibi, bool softcap, bool sliding_window, bool non_causal,
                bool lse, int cc, int num_sms, const std::optional<std::string>& backend) {
  const Features f{sinks, alibi, softcap, sliding_window, non_causal, lse};
  const AttentionConfig cfg = make_config(num_heads, num_kv_heads, head_size, dtype,
                                          kv_cache_dtype, block_size, layout, f, cc, num_sms);
  const Selection s = backend ? select_backend(cfg, std::string_view(*backend)) : select_backend(cfg);
  nb::dict d;
  d["backend"] = s.backend;
  d["variant"] = s.variant;
  d["reason"] = s.reason;
  nb::list refused;
  for (const Refusal& r : s.refused) {
    nb::dict rd;
    rd["backend"] = r.backend;
    rd["reasons"] = r.reasons;
    refused.append(rd);
  }
  d["refused"] = refused;
  return d;
}

std::vector<int64_t> kv_cache_shape(const std::string& backend_name, int64_t num_blocks,
                                    int block_size, int num_kv_heads, int head_size,
                                    const std::string& cache_dtype) {
  return backend(backend_name)
      .get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, parse_dtype(cache_dtype));
}

std::vector<int> kv_cache_stride_order(const std::string& backend_name, const std::string& layout) {
  const auto o = backend(backend_name).get_kv_cache_stride_order(parse_layout(layout));
  return {o.begin(), o.end()};
}

// The spec of a physically shaped 5-D cache tensor (NHD (nb, 2, bs, h, row) or HND
// (nb, 2, h, bs, row)) of dtype `cache_dtype` ("auto" = the tensor's own).
KVCacheSpec spec_of_tensor(const TensorView& t, const std::string& layout,
                           const std::string& kv_cache_dtype, std::string_view where) {
  t.require_ndim(where, "kv_cache", 5);
  ATTNKIT_REQUIRE(t.shape[1] == 2, where, "kv_cache.shape", t.shape_str(),
                  "the second dim must be 2 (K and V)");
  KVCacheSpec s;
  s.layout = parse_layout(layout);
  s.num_blocks = t.shape[0];
  const bool nhd = s.layout == KVLayout::NHD;
  s.block_size = static_cast<int>(nhd ? t.shape[2] : t.shape[3]);
  s.num_kv_heads = static_cast<int>(nhd ? t.shape[3] : t.shape[2]);
  if (kv_cache_dtype == "auto") {
    ATTNKIT_REQUIRE(t.dtype != DType::u8, where, "kv_cache.dtype", "uint8",
                    "a uint8 cache needs kv_cache_dtype 'fp8', 'fp8_e4m3', 'fp8_e5m2' or 'nvfp4'");
    s.cache_dtype = t.dtype;
  } else {
    s.cache_dtype = parse_dtype(kv_cache_dtype);
  }
  const int64_t row = t.shape[4];
  // nvfp4 rows hold head_size/2 packed bytes + head_size/16 scales = 9/16 of head_size.
  s.head_size = static_cast<int>(s.cache_dtype == DType::nvfp4 ? row * 16 / 9 : row);
  s.validate(where);
  ATTNKIT_REQUIRE(s.row_elems() == row, where, "kv_cache.shape", t.shape_str(),
                  "the last dim does not fit an nvfp4 row (head_size/2 + head_size/16 bytes)");
  return s;
}

void native_write_kv(const InArray& key, const InArray& value, const InArray& kv_cache,
                     const InArray& slot_mapping, const std::string& layout,
                     const std::string& kv_cache_dtype, const OptIn& k_scale, const OptIn& v_scale,
                     uintptr_t stream) {
  constexpr std::string_view where = "write_kv";
  TensorView cache = to_view(kv_cache, where, "kv_cache");
  const KVCacheSpec spec = spec_of_tensor(cache, layout, kv_cache_dtype, where);
  cache.dtype = spec.storage_dtype();
  KVScales scales;
  scales.k_scale = to_view(k_scale, where, "k_scale");
  scales.v_scale = to_view(v_scale, where, "v_scale");
  write_kv(to_view(key, where, "key"), to_view(value, where, "value"), spec.view(cache),
           to_view(slot_mapping, where, "slot_mapping"), scales, stream_ptr(stream));
}

// The batch shape of host arrays query_start_loc [num_reqs + 1] / seq_lens [num_reqs], for the
// decode/prefill helpers (which read nothing else).
CommonAttentionMetadata batch_shape(const InArray& query_start_loc, const InArray& seq_lens,
                                    std::string_view where) {
  CommonAttentionMetadata md;
  md.query_start_loc = host_int32(to_view(query_start_loc, where, "query_start_loc"), where, "query_start_loc");
  md.seq_lens = host_int32(to_view(seq_lens, where, "seq_lens"), where, "seq_lens");
  md.finalize();
  return md;
}

nb::dict split(const InArray& query_start_loc, const InArray& seq_lens, int decode_threshold) {
  const auto s = split_decodes_and_prefills(
      batch_shape(query_start_loc, seq_lens, "split_decodes_and_prefills"), decode_threshold);
  nb::dict d;
  d["num_decodes"] = s.num_decodes;
  d["num_prefills"] = s.num_prefills;
  d["num_decode_tokens"] = s.num_decode_tokens;
  d["num_prefill_tokens"] = s.num_prefill_tokens;
  return d;
}

std::vector<int> decode_first(const InArray& query_start_loc, const InArray& seq_lens, int decode_threshold) {
  return decode_first_order(batch_shape(query_start_loc, seq_lens, "decode_first_order"), decode_threshold);
}

}  // namespace

void register_native(nb::module_& m) {
  m.def("backends", &list_backends, "Every backend of the registry with its capabilities.");
  m.def("select", &select, nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_size"),
        nb::arg("dtype"), nb::arg("kv_cache_dtype"), nb::arg("block_size"), nb::arg("layout"),
        nb::arg("sinks"), nb::arg("alibi"), nb::arg("softcap"), nb::arg("sliding_window"),
        nb::arg("non_causal"), nb::arg("lse"), nb::arg("cc"), nb::arg("num_sms"),
        nb::arg("backend").none());
  m.def("kv_cache_shape", &kv_cache_shape, nb::arg("backend"), nb::arg("num_blocks"),
        nb::arg("block_size"), nb::arg("num_kv_heads"), nb::arg("head_size"),
        nb::arg("cache_dtype"));
  m.def("kv_cache_stride_order", &kv_cache_stride_order, nb::arg("backend"), nb::arg("layout"));
  m.def("write_kv", &native_write_kv, nb::arg("key"), nb::arg("value"), nb::arg("kv_cache"),
        nb::arg("slot_mapping"), nb::arg("layout"), nb::arg("kv_cache_dtype"),
        nb::arg("k_scale").none(), nb::arg("v_scale").none(), nb::arg("stream"));

  m.def("split_decodes_and_prefills", &split, nb::arg("query_start_loc"), nb::arg("seq_lens"),
        nb::arg("decode_threshold") = 1,
        "Counts of a decodes-first batch: num_decodes, num_prefills and their tokens.");
  m.def("decode_first_order", &decode_first, nb::arg("query_start_loc"), nb::arg("seq_lens"),
        nb::arg("decode_threshold") = 1,
        "The request permutation that puts decodes first (stable): new i is old perm[i].");

  nb::class_<KVCacheSpec>(m, "KVCacheSpec",
                          "Paged KV cache spec: logical shape (num_blocks, 2, block_size, "
                          "num_kv_heads, head_size), layout NHD or HND.")
      .def("__init__",
           [](KVCacheSpec* s, int64_t num_blocks, int block_size, int num_kv_heads, int head_size,
              const std::string& cache_dtype, const std::string& layout) {
             new (s) KVCacheSpec{num_blocks, block_size, num_kv_heads, head_size,
                                 parse_dtype(cache_dtype), parse_layout(layout)};
             s->validate();
           },
           nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"),
           nb::arg("head_size"), nb::arg("cache_dtype") = "bf16", nb::arg("layout") = "NHD")
      .def_ro("num_blocks", &KVCacheSpec::num_blocks)
      .def_ro("block_size", &KVCacheSpec::block_size)
      .def_ro("num_kv_heads", &KVCacheSpec::num_kv_heads)
      .def_ro("head_size", &KVCacheSpec::head_size)
      .def_prop_ro("cache_dtype", [](const KVCacheSpec& s) { return std::string(dtype_name(s.cache_dtype)); })
      .def_prop_ro("storage_dtype", [](const KVCacheSpec& s) { return std::string(dtype_name(s.storage_dtype())); })
      .def_prop_ro("layout", [](const KVCacheSpec& s) { return std::string(layout_name(s.layout)); })
      .def_prop_ro("row_elems", &KVCacheSpec::row_elems)
      .def_prop_ro("logical_shape", [](const KVCacheSpec& s) { auto a = s.logical_shape(); return std::vector<int64_t>(a.begin(), a.end()); })
      .def_prop_ro("stride_order", [](const KVCacheSpec& s) { auto a = s.stride_order(); return std::vector<int>(a.begin(), a.end()); })
      .def_prop_ro("logical_strides", [](const KVCacheSpec& s) { auto a = s.logical_strides(); return std::vector<int64_t>(a.begin(), a.end()); })
      .def_prop_ro("physical_shape",
                   [](const KVCacheSpec& s) {
                     const auto shape = s.logical_shape();
                     const auto order = s.stride_order();
                     std::vector<int64_t> out;
                     for (int d : order) out.push_back(shape[d]);
                     return out;
                   })
      .def_prop_ro("bytes_per_block", &KVCacheSpec::bytes_per_block)
      .def_prop_ro("total_bytes", &KVCacheSpec::total_bytes)
      .def("__repr__", [](const KVCacheSpec& s) {
        return "KVCacheSpec(num_blocks=" + std::to_string(s.num_blocks) +
               ", block_size=" + std::to_string(s.block_size) +
               ", num_kv_heads=" + std::to_string(s.num_kv_heads) +
               ", head_size=" + std::to_string(s.head_size) + ", cache_dtype='" +
               std::string(dtype_name(s.cache_dtype)) + "', layout='" +
               std::string(layout_name(s.layout)) + "')";
      });
}

}  // namespace attnkit::py
