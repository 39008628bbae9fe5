#include "flashinfer/flashinfer_impl.h"

#include <memory>
#include <string>

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "attnkit/device.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/gpu_decode.h"
#include "flashinfer/metadata_builder.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer forward";

// The planned window must contain the call's: a plan trimmed to a narrower window would skip
// keys the call needs (-1 = unbounded).
bool window_within(int call, int planned) { return planned < 0 || (call >= 0 && call <= planned); }

// The cache tensor made for cfg (cache_spec_of, then the dense physical layout spec.view
// checks), and every page the plans read inside it.
void check_cache(const TensorView& cache, const AttentionConfig& cfg, const PlanState& state) {
  cache.require_device(kWhere, "kv_cache", Device::CUDA);
  const KVCacheSpec spec = cache_spec_of(cache, cfg, kWhere);
  (void)spec.view(cache);
  for (const PageTable* t : {&state.decode_pages, &state.prefill_pages})
    ATTNKIT_REQUIRE(t->max_page_id < spec.num_blocks, kWhere, "planned page id", t->max_page_id,
                    "must be < the cache's num_blocks = " + std::to_string(spec.num_blocks));
}

class FlashInferImpl final : public AttentionImpl {
 public:
  explicit FlashInferImpl(const AttentionConfig& cfg) : cfg_(cfg) {}

  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& kv_cache, const BackendMetadata& metadata,
               const AttentionParams& params, const TensorView& out, void* stream) override {
    const auto* md = dynamic_cast<const FlashInferMetadata*>(&metadata);
    ATTNKIT_REQUIRE(md != nullptr, kWhere, "metadata", "another backend's metadata",
                    "must come from the flashinfer builder (make_builder(cfg).build)");
    ATTNKIT_REQUIRE(!md->stale(), kWhere, "metadata generation", md->generation,
                    "must be the builder's latest build: the builder re-planned its buffers since");
    ATTNKIT_REQUIRE(!params.alibi_slopes.defined(), kWhere, "params.alibi_slopes", "defined",
                    "ALiBi is not supported by the flashinfer backend");
    ATTNKIT_REQUIRE(params.causal == md->causal, kWhere, "params.causal", params.causal,
                    std::string("must equal the batch metadata's causal = ") +
                        (md->causal ? "true" : "false") +
                        " (the builder split and planned the batch for it)");
    require_declared_features(params, cfg_.features, kWhere);
    const int64_t tokens = md->num_actual_tokens;
    const ForwardViews views = check_forward_tensors(q, k, v, out, params.lse, cfg_, tokens,
                                                     Device::CUDA, /*out_same_dtype=*/true, kWhere);
    require_same_gpu(out, "out", q.device_index, kWhere);
    require_same_gpu(kv_cache, "kv_cache", q.device_index, kWhere);
    check_cache(kv_cache, cfg_, *md->state);
    AttentionParams p = params;
    p.lse = views.lse;
    p.validate(kWhere, cfg_.num_heads, cfg_.num_kv_heads, tokens, Device::CUDA);
    ATTNKIT_REQUIRE(window_within(params.window_left, md->window_left), kWhere,
                    "params.window_left", params.window_left,
                    "must lie within the planned window_left = " + std::to_string(md->window_left) +
                        " (set BuilderLimits::window_left to the layer's window)");
    ATTNKIT_REQUIRE(window_within(params.window_right, md->window_right), kWhere,
                    "params.window_right", params.window_right,
                    "must lie within the planned window_right = " + std::to_string(md->window_right));
    ATTNKIT_REQUIRE(md->num_prefills == 0, kWhere, "batch", std::to_string(md->num_prefills) + " prefill requests",
                    "must be decode-only: the FlashInfer-style prefill kernels are not built yet (the "
                    "flash_attn backend serves mixed batches)");
    run_decode(views, kv_cache, *md, p, stream);
  }

 private:
  // The decode part on the planned decode kernels: the plan's device copy (made once for the
  // builder's capacity, refreshed when the builder re-planned) and the split partials' workspace.
  void run_decode(const ForwardViews& views, const TensorView& kv_cache, const FlashInferMetadata& md,
                  const AttentionParams& p, void* stream) {
    const PlanState& st = *md.state;
    const PlanBuffers& plan = st.decode_plan;
    if (!dev_ || dev_state_ != md.state.get()) {
      dev_ = std::make_unique<DevicePlan>(plan.capacity, plan.config.group_size, st.decode_pages.max_pages());
      dev_state_ = md.state.get();
      uploaded_ = 0;
    }
    const PlanBatch batch = st.decode_batch();
    if (uploaded_ != md.generation) {
      dev_->upload(plan, st.decode_pages, batch, stream);
      uploaded_ = md.generation;
    }
    if (plan.split_kv && workspace_.bytes() < plan.workspace_bytes()) workspace_ = CudaMemory(plan.workspace_bytes());
    const KVCacheSpec spec = cache_spec_of(kv_cache, cfg_, kWhere);
    PlannedDecodeArgs a;
    a.q = views.q;
    a.out = views.out;
    a.cache = spec.view(kv_cache);
    a.params = p;
    a.workspace = workspace_.get();
    a.workspace_bytes = workspace_.bytes();
    a.stream = stream;
    run_planned_decode(*dev_, plan, st.decode_pages, batch, a);
  }

  AttentionConfig cfg_;
  std::unique_ptr<DevicePlan> dev_;
  const PlanState* dev_state_ = nullptr;
  uint64_t uploaded_ = 0;
  CudaMemory workspace_;
};

}  // namespace

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg) {
  return std::make_unique<FlashInferImpl>(cfg);
}

}  // namespace attnkit::flashinfer
