#include "flashinfer/flashinfer_impl.h"

#include <algorithm>
#include <memory>
#include <string>

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "attnkit/device.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/gpu_planned.h"
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

  // The partials of the plans of the builder make_builder(cfg) makes (default BuilderLimits): a
  // plan lays its partial rows out for its capacity (a captured launch serves every plan of it),
  // so this is the capacity's size whatever max_tokens (> 0) says.
  size_t workspace_bytes(int64_t max_tokens) const override {
    const BuilderLimits limits;
    return max_tokens > 0 ? plan_workspace_bytes(cfg_, limits, limits.max_tokens) : 0;
  }
  // The larger of the two parts' (they run one after the other and share the buffer).
  size_t workspace_bytes_for(const BackendMetadata& metadata) const override {
    const auto* md = dynamic_cast<const FlashInferMetadata*>(&metadata);
    ATTNKIT_REQUIRE(md != nullptr && md->state, "flashinfer workspace_bytes_for", "metadata",
                    "another backend's metadata", "must come from the flashinfer builder (make_builder(cfg).build)");
    size_t need = 0;
    if (md->num_decodes > 0) need = std::max(need, md->state->decode_plan.workspace_bytes());
    if (md->num_prefills > 0) need = std::max(need, md->state->prefill_plan.workspace_bytes());
    return need;
  }
  void set_workspace(void* device_ptr, size_t bytes) override {
    ATTNKIT_REQUIRE(device_ptr != nullptr || bytes == 0, "flashinfer set_workspace", "bytes", bytes,
                    "a workspace of > 0 bytes needs a device pointer");
    caller_ws_ = device_ptr;
    caller_ws_bytes_ = bytes;
  }

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
    // The partials' workspace: the caller's (set_workspace), checked before any launch.
    const size_t need = workspace_bytes_for(metadata);
    ATTNKIT_REQUIRE(need == 0 || caller_ws_ != nullptr, kWhere, "workspace", "none",
                    "the batch's plans need " + std::to_string(need) +
                        " bytes of device workspace for their partials: call set_workspace with workspace_bytes("
                        "max_tokens) bytes (the impl allocates none)");
    ATTNKIT_REQUIRE(caller_ws_bytes_ >= need, kWhere, "workspace bytes", caller_ws_bytes_,
                    "must hold the plans' partials: " + std::to_string(need) + " bytes (see workspace_bytes)");
    const PlanState& st = *md->state;
    const bool capturing = stream_capturing(stream);
    // The plans' device copies: over the caller's buffer (the builder's set_device_buffer).
    ATTNKIT_REQUIRE(st.device && st.prefill_device, kWhere, "the builder's device buffer", "not set",
                    "must be set before a GPU forward: MetadataBuilder::set_device_buffer with "
                    "device_buffer_bytes() bytes (the plans' device copies; the library allocates no device memory)");
    if (md->num_decodes > 0)
      run_part(views, kv_cache, st.decode_plan, st.decode_pages, st.decode_batch(), *st.device, 0, p, capturing,
               stream);
    if (md->num_prefills > 0)  // (decodes first: the prefill part's tokens follow theirs)
      run_part(views, kv_cache, st.prefill_plan, st.prefill_pages, st.prefill_batch(), *st.prefill_device,
               md->num_decode_tokens, p, capturing, stream);
  }

 private:
  // One planned part on the planned kernels, over its tokens [token0, token0 + the part's
  // tokens) of q / out / lse: the plan's device copy (the builder's state holds it, over the
  // caller's buffer: staged by every build and copied by the first forward after it) and the caller's
  // workspace for the split partials (the parts run one after the other on the stream and
  // share it). On a stream capturing a CUDA graph the launches
  // serve every plan of the capacity, so the graph replays the builder's later batches (of the
  // same query lengths).
  void run_part(const ForwardViews& views, const TensorView& kv_cache, const PlanBuffers& plan,
                const PageTable& pages, const PlanBatch& batch, DevicePlan& device, int64_t token0,
                const AttentionParams& p, bool capturing, void* stream) {
    device.copy_staged(stream);
    const KVCacheSpec spec = cache_spec_of(kv_cache, cfg_, kWhere);
    const int64_t tokens = plan.num_tokens;
    PlannedPartArgs a;
    a.q = token_rows(views.q, token0, tokens);
    a.out = token_rows(views.out, token0, tokens);
    a.cache = spec.view(kv_cache);
    a.params = p;
    if (p.lse.defined()) a.params.lse = lse_columns(p.lse, token0, tokens);
    a.workspace = caller_ws_;
    a.workspace_bytes = caller_ws_bytes_;
    a.stream = stream;
    a.graph_safe = capturing;
    run_planned_part(device, plan, pages, batch, a);
  }

  // Rows [first, first + count) of a [tokens, ...] view; columns of an LSE [heads, tokens].
  static TensorView token_rows(TensorView t, int64_t first, int64_t count) {
    t.data = static_cast<char*>(t.data) + first * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
    t.shape[0] = count;
    return t;
  }
  static TensorView lse_columns(TensorView t, int64_t first, int64_t count) {
    t.data = static_cast<char*>(t.data) + first * t.strides[1] * static_cast<int64_t>(dtype_size(t.dtype));
    t.shape[1] = count;
    return t;
  }

  AttentionConfig cfg_;
  void* caller_ws_ = nullptr;  // set_workspace's
  size_t caller_ws_bytes_ = 0;
};

}  // namespace

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg) {
  return std::make_unique<FlashInferImpl>(cfg);
}

}  // namespace attnkit::flashinfer
