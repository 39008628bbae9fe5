#include "flashinfer/flashinfer_impl.h"

#include <string>

#include "attnkit/error.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/metadata_builder.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer forward";

// The planned window must contain the call's: a plan trimmed to a narrower window would skip
// keys the call needs (-1 = unbounded).
bool window_within(int call, int planned) { return planned < 0 || (call >= 0 && call <= planned); }

void check_rows(const TensorView& t, std::string_view name, DType dtype, int64_t tokens, int heads,
                int head_size) {
  t.require_defined(kWhere, name);
  t.require_device(kWhere, name, Device::CUDA);
  t.require_dtype(kWhere, name, dtype);
  t.require_shape(kWhere, name, {-1, heads, head_size});
  t.require_last_dim_contiguous(kWhere, name);
  ATTNKIT_REQUIRE(t.size(0) >= tokens, kWhere, std::string(name) + ".shape[0]", t.size(0),
                  "must be >= num_actual_tokens = " + std::to_string(tokens));
}

void check_cache(const TensorView& cache, const AttentionConfig& cfg, const PlanState& state) {
  cache.require_defined(kWhere, "kv_cache");
  cache.require_device(kWhere, "kv_cache", Device::CUDA);
  cache.require_ndim(kWhere, "kv_cache", 5);
  const AttentionBackend& b = flashinfer_backend();
  const auto logical = b.get_kv_cache_shape(cache.size(0), cfg.block_size, cfg.num_kv_heads,
                                            cfg.head_size, cfg.cache_dtype);
  const auto order = b.get_kv_cache_stride_order(cfg.layout);
  std::string want = "[";
  for (int d = 0; d < 5; ++d) want += (d ? ", " : "") + std::to_string(logical[order[d]]);
  want += "]";
  for (int d = 0; d < 5; ++d)
    ATTNKIT_REQUIRE(cache.size(d) == logical[order[d]], kWhere, "kv_cache.shape", cache.shape_str(),
                    "must be " + want + " (the " + std::string(layout_name(cfg.layout)) +
                        " physical order of get_kv_cache_shape)");
  const DType storage = cfg.cache_dtype == DType::nvfp4 ? DType::u8 : cfg.cache_dtype;
  cache.require_dtype(kWhere, "kv_cache", storage);
  cache.require_contiguous(kWhere, "kv_cache");
  for (const PageTable* t : {&state.decode_pages, &state.prefill_pages})
    for (int64_t i = 0; i < t->num_pages; ++i)
      ATTNKIT_REQUIRE(t->indices[i] < cache.size(0), kWhere, "planned page id", t->indices[i],
                      "must be < the cache's num_blocks = " + std::to_string(cache.size(0)));
}

class FlashInferImpl final : public AttentionImpl {
 public:
  explicit FlashInferImpl(const AttentionConfig& cfg) : cfg_(cfg) {}

  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& kv_cache, const BackendMetadata& metadata,
               const AttentionParams& params, const TensorView& out, void* /*stream*/) override {
    const auto* md = dynamic_cast<const FlashInferMetadata*>(&metadata);
    ATTNKIT_REQUIRE(md != nullptr, kWhere, "metadata", "another backend's metadata",
                    "must come from the flashinfer builder (make_builder(cfg).build)");
    ATTNKIT_REQUIRE(!md->stale(), kWhere, "metadata generation", md->generation,
                    "must be the builder's latest build: the builder re-planned its buffers since");
    const int64_t tokens = md->num_actual_tokens;
    check_rows(q, "q", cfg_.dtype, tokens, cfg_.num_heads, cfg_.head_size);
    check_rows(out, "out", q.dtype, tokens, cfg_.num_heads, cfg_.head_size);
    ATTNKIT_REQUIRE(out.size(0) == q.size(0), kWhere, "out.shape[0]", out.size(0),
                    "must equal q.shape[0] = " + std::to_string(q.size(0)));
    if (k.defined()) check_rows(k, "k", cfg_.dtype, tokens, cfg_.num_kv_heads, cfg_.head_size);
    if (v.defined()) check_rows(v, "v", cfg_.dtype, tokens, cfg_.num_kv_heads, cfg_.head_size);
    check_cache(kv_cache, cfg_, *md->state);
    params.validate(kWhere, cfg_.num_heads, cfg_.num_kv_heads, tokens, Device::CUDA);
    ATTNKIT_REQUIRE(!params.alibi_slopes.defined(), kWhere, "params.alibi_slopes", "defined",
                    "ALiBi is not supported by the flashinfer backend");
    ATTNKIT_REQUIRE(params.causal == md->causal, kWhere, "params.causal", params.causal,
                    "must match the metadata's causal = " + std::to_string(md->causal) +
                        " (the builder split and planned the batch for it)");
    ATTNKIT_REQUIRE(window_within(params.window_left, md->window_left), kWhere,
                    "params.window_left", params.window_left,
                    "must lie within the planned window_left = " + std::to_string(md->window_left) +
                        " (set BuilderLimits::window_left to the layer's window)");
    ATTNKIT_REQUIRE(window_within(params.window_right, md->window_right), kWhere,
                    "params.window_right", params.window_right,
                    "must lie within the planned window_right = " + std::to_string(md->window_right));
    throw Error(std::string(kWhere), "backend = flashinfer",
                "the FlashInfer-style GPU kernels are not in this build yet (the host side "
                "validated this call and planned the batch; the kernels come in a later issue)");
  }

 private:
  AttentionConfig cfg_;
};

}  // namespace

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg) {
  return std::make_unique<FlashInferImpl>(cfg);
}

}  // namespace attnkit::flashinfer
