// The native forward path: a layer picks its backend through the selector, turns batch
// metadata into the backend's own with its builder, and runs the backend's impl (the same
// AttentionBackend / MetadataBuilder / AttentionImpl objects an engine in C++ would use).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>

#include "attnkit/backend.h"
#include "attnkit/error.h"
#include "attnkit/metadata.h"
#include "attnkit/selector.h"
#include "convert.h"

namespace attnkit::py {

namespace {

constexpr std::string_view kBuild = "AttentionLayer.build_metadata";
constexpr std::string_view kForward = "AttentionLayer.forward";

std::vector<int64_t> host_int64(const TensorView& t, std::string_view where, std::string_view name) {
  t.require_dtype(where, name, DType::i64);
  t.require_device(where, name, Device::CPU);
  t.require_ndim(where, name, 1);
  std::vector<int64_t> out(static_cast<size_t>(t.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) out[i] = t.ptr<const int64_t>()[i * t.strides[0]];
  return out;
}

// Batch metadata as the builder made it, with the common host arrays it was built from.
struct Metadata {
  CommonAttentionMetadata common;
  std::unique_ptr<BackendMetadata> backend_md;
};

class Layer {
 public:
  Layer(const AttentionConfig& cfg, const std::optional<std::string>& preferred) : cfg_(cfg) {
    const Selection s = preferred ? select_backend(cfg, std::string_view(*preferred)) : select_backend(cfg);
    backend_ = &backend(s.backend);
    variant_ = s.variant;
    builder_ = backend_->make_builder(cfg);
    impl_ = backend_->make_impl(cfg);
  }

  std::string backend_name() const { return std::string(backend_->name()); }
  const std::string& variant() const { return variant_; }
  std::vector<int64_t> kv_cache_shape(int64_t num_blocks) const {
    return backend_->get_kv_cache_shape(num_blocks, cfg_.block_size, cfg_.num_kv_heads,
                                        cfg_.head_size, cfg_.cache_dtype);
  }
  std::vector<int> kv_cache_stride_order() const {
    const auto o = backend_->get_kv_cache_stride_order(cfg_.layout);
    return {o.begin(), o.end()};
  }
  int reorder_batch_threshold() const { return builder_->reorder_batch_threshold(); }
  size_t workspace_bytes(int64_t max_tokens) const { return impl_->workspace_bytes(max_tokens); }
  size_t workspace_bytes_for(const Metadata& md) const { return impl_->workspace_bytes_for(*md.backend_md); }
  // The caller's device workspace (a CUDA array of at least workspace_bytes bytes; None: none).
  // The array must outlive the forwards that use it.
  void set_workspace(const OptIn& workspace) {
    constexpr std::string_view where = "AttentionLayer.set_workspace";
    if (!workspace) {
      impl_->set_workspace(nullptr, 0);
      return;
    }
    const TensorView w = to_view(workspace, where, "workspace");
    w.require_device(where, "workspace", Device::CUDA);
    w.require_contiguous(where, "workspace");
    impl_->set_workspace(w.data, static_cast<size_t>(w.numel()) * dtype_size(w.dtype));
  }

  size_t device_buffer_bytes() const { return builder_->device_buffer_bytes(); }
  // The caller's device buffer for the builder's plans (a contiguous CUDA array of at least
  // device_buffer_bytes bytes); it must outlive the metadata and forwards that use it.
  void set_device_buffer(const InArray& buffer) {
    constexpr std::string_view where = "AttentionLayer.set_device_buffer";
    const TensorView b = to_view(buffer, where, "buffer");
    b.require_device(where, "buffer", Device::CUDA);
    b.require_contiguous(where, "buffer");
    builder_->set_device_buffer(b.data, static_cast<size_t>(b.numel()) * dtype_size(b.dtype));
  }

  // Host arrays (CPU int32 / int64) always; on a GPU also their device copies.
  std::unique_ptr<Metadata> build(const InArray& query_start_loc, const InArray& seq_lens,
                                  const InArray& block_table, const InArray& slot_mapping,
                                  bool causal, const OptIn& query_start_loc_dev,
                                  const OptIn& seq_lens_dev, const OptIn& block_table_dev,
                                  const OptIn& slot_mapping_dev, int dcp_world_size, int dcp_rank,
                                  int dcp_interleave, const OptIn& dcp_local_seq_lens_dev) {
    auto md = std::make_unique<Metadata>();
    CommonAttentionMetadata& c = md->common;
    const TensorView bt = to_view(block_table, kBuild, "block_table");
    bt.require_ndim(kBuild, "block_table", 2);
    c.query_start_loc = host_int32(to_view(query_start_loc, kBuild, "query_start_loc"), kBuild, "query_start_loc");
    c.seq_lens = host_int32(to_view(seq_lens, kBuild, "seq_lens"), kBuild, "seq_lens");
    c.block_table = host_int32(bt, kBuild, "block_table");
    c.max_blocks_per_req = static_cast<int>(bt.shape[1]);
    c.slot_mapping = host_int64(to_view(slot_mapping, kBuild, "slot_mapping"), kBuild, "slot_mapping");
    ATTNKIT_REQUIRE(c.query_start_loc.size() == c.seq_lens.size() + 1, kBuild, "query_start_loc.size()",
                    c.query_start_loc.size(),
                    "must be seq_lens.size() + 1 = " + std::to_string(c.seq_lens.size() + 1));
    c.causal = causal;
    c.dcp_world_size = dcp_world_size;  // (the rank's shard: checked by the builder's validation)
    c.dcp_rank = dcp_rank;
    c.dcp_interleave = dcp_interleave;
    c.finalize();
    c.query_start_loc_dev = to_view(query_start_loc_dev, kBuild, "query_start_loc_dev");
    c.seq_lens_dev = to_view(seq_lens_dev, kBuild, "seq_lens_dev");
    c.block_table_dev = to_view(block_table_dev, kBuild, "block_table_dev");
    c.slot_mapping_dev = to_view(slot_mapping_dev, kBuild, "slot_mapping_dev");
    c.dcp_local_seq_lens_dev = to_view(dcp_local_seq_lens_dev, kBuild, "dcp_local_seq_lens_dev");
    md->backend_md = builder_->build(c);
    return md;
  }

  void forward(const InArray& q, const OptIn& k, const OptIn& v, const InArray& kv_cache,
               const Metadata& md, const OutArray& out, float scale, int window_left,
               int window_right, float softcap, const OptIn& alibi_slopes, const OptIn& sinks,
               const OptIn& k_scale, const OptIn& v_scale, const OptOut& lse, uintptr_t stream) {
    AttentionParams p;
    p.scale = scale;
    p.causal = md.common.causal;
    p.window_left = window_left;
    p.window_right = window_right;
    p.softcap = softcap;
    p.alibi_slopes = to_view(alibi_slopes, kForward, "alibi_slopes");
    p.sinks = to_view(sinks, kForward, "sinks");
    p.k_scale = to_view(k_scale, kForward, "k_scale");
    p.v_scale = to_view(v_scale, kForward, "v_scale");
    p.lse = to_view(lse, kForward, "lse");
    TensorView cache = to_view(kv_cache, kForward, "kv_cache");
    // uint8 storage of an fp8 cache: the backend reads the bytes as its configured cache dtype.
    if (cache.dtype == DType::u8 && is_fp8(cfg_.cache_dtype)) cache.dtype = cfg_.cache_dtype;
    impl_->forward(to_view(q, kForward, "q"), to_view(k, kForward, "k"), to_view(v, kForward, "v"),
                   cache, *md.backend_md, p, to_view(out, kForward, "out"), stream_ptr(stream));
  }

 private:
  AttentionConfig cfg_;
  const AttentionBackend* backend_ = nullptr;
  std::string variant_;
  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<AttentionImpl> impl_;
};

AttentionConfig layer_config(int num_heads, int num_kv_heads, int head_size, const std::string& dtype,
                             const std::string& kv_cache_dtype, int block_size,
                             const std::string& layout, bool sinks, bool alibi, bool softcap,
                             bool sliding_window, bool non_causal, bool lse, int cc, int num_sms) {
  AttentionConfig cfg;
  cfg.num_heads = num_heads;
  cfg.num_kv_heads = num_kv_heads;
  cfg.head_size = head_size;
  cfg.dtype = parse_dtype(dtype);
  cfg.cache_dtype = kv_cache_dtype == "auto" ? cfg.dtype : parse_dtype(kv_cache_dtype);
  cfg.block_size = block_size;
  cfg.layout = parse_layout(layout);
  cfg.features = {sinks, alibi, softcap, sliding_window, non_causal, lse};
  ATTNKIT_REQUIRE(cc >= 0, "AttentionLayer", "cc", cc, "must be 0 (CPU) or a compute capability like 90");
  cfg.device = cc == 0 ? DeviceSpec::Cpu() : DeviceSpec::Cuda(cc / 10, cc % 10, num_sms);
  return cfg;
}

}  // namespace

void register_layer(nb::module_& m) {
  nb::class_<Metadata>(m, "LayerMetadata", "Batch metadata built by a layer's backend builder.")
      .def_prop_ro("num_reqs", [](const Metadata& md) { return md.common.num_reqs; })
      .def_prop_ro("num_actual_tokens", [](const Metadata& md) { return md.common.num_actual_tokens; })
      .def_prop_ro("max_query_len", [](const Metadata& md) { return md.common.max_query_len; })
      .def_prop_ro("max_seq_len", [](const Metadata& md) { return md.common.max_seq_len; })
      .def_prop_ro("causal", [](const Metadata& md) { return md.common.causal; });

  nb::class_<Layer>(m, "Layer")
      .def("__init__",
           [](Layer* self, int num_heads, int num_kv_heads, int head_size, const std::string& dtype,
              const std::string& kv_cache_dtype, int block_size, const std::string& layout, bool sinks,
              bool alibi, bool softcap, bool sliding_window, bool non_causal, bool lse, int cc,
              int num_sms, const std::optional<std::string>& backend) {
             new (self) Layer(layer_config(num_heads, num_kv_heads, head_size, dtype, kv_cache_dtype,
                                           block_size, layout, sinks, alibi, softcap, sliding_window,
                                           non_causal, lse, cc, num_sms),
                              backend);
           },
           nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_size"), nb::arg("dtype"),
           nb::arg("kv_cache_dtype"), nb::arg("block_size"), nb::arg("layout"), nb::arg("sinks"),
           nb::arg("alibi"), nb::arg("softcap"), nb::arg("sliding_window"), nb::arg("non_causal"),
           nb::arg("lse"), nb::arg("cc"), nb::arg("num_sms"), nb::arg("backend").none())
      .def_prop_ro("backend", &Layer::backend_name)
      .def_prop_ro("variant", &Layer::variant)
      .def_prop_ro("reorder_batch_threshold", &Layer::reorder_batch_threshold)
      .def("workspace_bytes", &Layer::workspace_bytes, nb::arg("max_tokens"))
      .def("workspace_bytes_for", &Layer::workspace_bytes_for, nb::arg("metadata"))
      .def("set_workspace", &Layer::set_workspace, nb::arg("workspace").none())
      .def("device_buffer_bytes", &Layer::device_buffer_bytes)
      .def("set_device_buffer", &Layer::set_device_buffer, nb::arg("buffer"))
      .def("kv_cache_shape", &Layer::kv_cache_shape, nb::arg("num_blocks"))
      .def("kv_cache_stride_order", &Layer::kv_cache_stride_order)
      .def("build", &Layer::build, nb::arg("query_start_loc"), nb::arg("seq_lens"),
           nb::arg("block_table"), nb::arg("slot_mapping"), nb::arg("causal"),
           nb::arg("query_start_loc_dev").none(), nb::arg("seq_lens_dev").none(),
           nb::arg("block_table_dev").none(), nb::arg("slot_mapping_dev").none(), nb::arg("dcp_world_size") = 1,
           nb::arg("dcp_rank") = 0, nb::arg("dcp_interleave") = 1, nb::arg("dcp_local_seq_lens_dev").none() = nb::none())
      .def("forward", &Layer::forward, nb::arg("q"), nb::arg("k").none(), nb::arg("v").none(),
           nb::arg("kv_cache"), nb::arg("metadata"), nb::arg("out"), nb::arg("scale"),
           nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
           nb::arg("alibi_slopes").none(), nb::arg("sinks").none(), nb::arg("k_scale").none(),
           nb::arg("v_scale").none(), nb::arg("lse").none(), nb::arg("stream"));
}

}  // namespace attnkit::py
