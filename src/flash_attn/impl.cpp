#include "flash_attn/impl.h"

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "flash_attn/flash_attn_backend.h"
#include "flash_attn/metadata_builder.h"
#include "flash_attn/varlen_launch.h"
#ifdef ATTNKIT_WITH_CUDA
#include "cuda/device_buffer.h"
#endif

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn forward";

}  // namespace

#ifdef ATTNKIT_WITH_CUDA
struct FlashAttnImpl::OwnedWorkspace {
  cuda::DeviceBuffer buffer;
};
#else
struct FlashAttnImpl::OwnedWorkspace {};
#endif

FlashAttnImpl::FlashAttnImpl(const AttentionConfig& cfg) : cfg_(cfg) {
  require_servable(cfg, "flash_attn impl");
  generation_ = *choose_generation(cfg).chosen;  // require_servable guarantees one
}

FlashAttnImpl::~FlashAttnImpl() = default;

size_t FlashAttnImpl::max_workspace_bytes(int64_t max_tokens) const {
  ATTNKIT_REQUIRE(max_tokens >= 0, "flash_attn max_workspace_bytes", "max_tokens", max_tokens, "must be >= 0");
  return varlen_workspace_bytes(max_tokens, cfg_.num_heads, cfg_.head_size, kMaxSplits);
}

FlashAttnImpl::Workspace FlashAttnImpl::workspace_for(size_t bytes, int num_splits) {
  if (workspace_ != nullptr) {
    ATTNKIT_REQUIRE(workspace_bytes_ >= bytes, kWhere, "workspace bytes", workspace_bytes_,
                    "a launch with " + std::to_string(num_splits) + " KV splits needs " +
                        std::to_string(bytes) + " bytes (see max_workspace_bytes)");
    return {workspace_, workspace_bytes_};
  }
#ifdef ATTNKIT_WITH_CUDA
  if (!owned_) owned_ = std::make_unique<OwnedWorkspace>();
  if (owned_->buffer.bytes() < bytes) {
    owned_->buffer.resize(bytes);  // a new allocation: its counters need zeroing
    workspace_ready_ = false;
  }
  return {owned_->buffer.get(), owned_->buffer.bytes()};
#else
  fail(kWhere, "workspace", "none",
       "a launch with " + std::to_string(num_splits) + " KV splits needs " + std::to_string(bytes) +
           " bytes of device workspace: call FlashAttnImpl::set_workspace (or build with max_splits = 1)");
#endif
}

void FlashAttnImpl::set_workspace(void* device_ptr, size_t bytes) {
  ATTNKIT_REQUIRE(device_ptr != nullptr || bytes == 0, "flash_attn set_workspace", "bytes", bytes,
                  "a workspace of > 0 bytes needs a device pointer");
  workspace_ = device_ptr;
  workspace_bytes_ = bytes;
  workspace_ready_ = false;
}

void FlashAttnImpl::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& kv_cache, const BackendMetadata& metadata,
                            const AttentionParams& params, const TensorView& out, void* stream) {
  const auto* md = dynamic_cast<const FlashAttnMetadata*>(&metadata);
  ATTNKIT_REQUIRE(md != nullptr, kWhere, "metadata", "another backend's metadata",
                  "must come from the flash_attn builder");
  ATTNKIT_REQUIRE(params.causal == md->causal, kWhere, "params.causal", params.causal,
                  std::string("must equal the batch metadata's causal = ") + (md->causal ? "true" : "false"));
  require_declared_features(params, cfg_.features, kWhere);
  const ForwardViews views = check_forward_tensors(q, k, v, out, params.lse, cfg_, md->num_actual_tokens,
                                                   Device::CUDA, /*out_same_dtype=*/true, kWhere);
  kv_cache.require_device(kWhere, "kv_cache", Device::CUDA);
  require_same_gpu(out, "out", q.device_index, kWhere);
  require_same_gpu(kv_cache, "kv_cache", q.device_index, kWhere);
  for (const auto* a : {&md->query_start_loc, &md->seq_lens, &md->block_table})
    require_same_gpu(*a, "metadata array", q.device_index, kWhere);
  const KVCacheSpec spec = cache_spec_of(kv_cache, cfg_, kWhere);
  ATTNKIT_REQUIRE(md->max_block_id < spec.num_blocks, kWhere, "block id", md->max_block_id,
                  "must be < the cache's num_blocks = " + std::to_string(spec.num_blocks));
  AttentionParams p = params;
  p.lse = views.lse;
  p.validate(kWhere, cfg_.num_heads, cfg_.num_kv_heads, md->num_actual_tokens, Device::CUDA);
  Workspace ws;
  if (md->split.num_splits > 1) ws = workspace_for(md->workspace_bytes, md->split.num_splits);
  if (md->num_actual_tokens == 0) return;  // e.g. an all-padding CUDA-graph batch
#ifdef ATTNKIT_WITH_CUDA
  if (ws.ptr != nullptr && !workspace_ready_) {  // (a CPU build throws at the launch below)
    varlen_workspace_init(ws.ptr, ws.bytes, stream);
    workspace_ready_ = true;
  }
#endif

  VarlenArgs a;
  a.q = views.q;
  a.cache = spec.view(kv_cache);
  a.out = views.out;
  a.cu_seqlens_q = md->query_start_loc.ptr<const int32_t>();
  a.seqused_k = md->seq_lens.ptr<const int32_t>();
  a.block_table = md->block_table.ptr<const int32_t>();
  a.max_blocks_per_req = md->max_blocks_per_req;
  a.num_reqs = md->num_reqs;
  a.max_query_len = md->max_query_len;
  a.max_seq_len = md->max_seq_len;
  a.num_heads = cfg_.num_heads;
  a.params = p;
  a.num_splits = md->split.num_splits;
  a.generation = generation_;
  a.workspace = ws.ptr;
  a.workspace_bytes = ws.bytes;
  a.stream = stream;
  run_varlen_attention(a);
}

}  // namespace attnkit::flash_attn
