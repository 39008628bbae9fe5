#include "flash_attn/impl.h"

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "flash_attn/flash_attn_backend.h"
#include "flash_attn/metadata_builder.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn forward";

}  // namespace

FlashAttnImpl::FlashAttnImpl(const AttentionConfig& cfg) : cfg_(cfg) {
  require_servable(cfg, "flash_attn impl");
  generation_ = *choose_generation(cfg).chosen;  // require_servable guarantees one
}

FlashAttnImpl::~FlashAttnImpl() = default;

size_t FlashAttnImpl::max_workspace_bytes(int64_t max_tokens) const {
  ATTNKIT_REQUIRE(max_tokens >= 0, "flash_attn max_workspace_bytes", "max_tokens", max_tokens, "must be >= 0");
  return varlen_workspace_bytes(max_tokens, cfg_.num_heads, cfg_.head_size, kMaxSplits);
}

size_t FlashAttnImpl::workspace_bytes_for(const BackendMetadata& metadata) const {
  const auto* md = dynamic_cast<const FlashAttnMetadata*>(&metadata);
  ATTNKIT_REQUIRE(md != nullptr, "flash_attn workspace_bytes_for", "metadata", "another backend's metadata",
                  "must come from the flash_attn builder");
  return md->split.num_splits > 1 ? md->workspace_bytes : 0;
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
  if (md->dcp_world_size > 1) {
    // A DCP shard's partial: over the rank's keys with every key visible (the builder's rule);
    // a window or ALiBi would need global positions, a sink joins once in the combine.
    const std::string shard = "in a DCP shard (dcp_world_size " + std::to_string(md->dcp_world_size) + ")";
    ATTNKIT_REQUIRE(params.window_left < 0 && params.window_right < 0, kWhere, "params.window",
                    std::to_string(params.window_left) + ", " + std::to_string(params.window_right),
                    "must be unbounded " + shard + ": a window is of global positions, not built for a rank's keys");
    ATTNKIT_REQUIRE(!params.alibi_slopes.defined(), kWhere, "params.alibi_slopes", "defined",
                    "must be undefined " + shard + ": ALiBi distances are of global positions");
    ATTNKIT_REQUIRE(!params.sinks.defined(), kWhere, "params.sinks", "defined",
                    "must be undefined " + shard + ": the sink joins once, in the combine of the ranks' partials");
    ATTNKIT_REQUIRE(params.lse.defined(), kWhere, "params.lse", "undefined",
                    "must be given " + shard + ": the combine of the ranks' partials needs each one's LSE");
  }
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
  // The split partials' workspace: the caller's (set_workspace), checked before any launch.
  const size_t need = workspace_bytes_for(metadata);
  if (need > 0) {
    ATTNKIT_REQUIRE(workspace_ != nullptr, kWhere, "workspace", "none",
                    "a launch with " + std::to_string(md->split.num_splits) + " KV splits needs " +
                        std::to_string(need) + " bytes of device workspace: call set_workspace with workspace_bytes("
                        "max_tokens) bytes (the impl allocates none)");
    ATTNKIT_REQUIRE(workspace_bytes_ >= need, kWhere, "workspace bytes", workspace_bytes_,
                    "a launch with " + std::to_string(md->split.num_splits) + " KV splits needs " +
                        std::to_string(need) + " bytes (see workspace_bytes / max_workspace_bytes)");
  }
  if (md->num_actual_tokens == 0) return;  // e.g. an all-padding CUDA-graph batch
#ifdef ATTNKIT_WITH_CUDA
  if (need > 0 && !workspace_ready_) {  // (a CPU build throws at the launch below)
    varlen_workspace_init(workspace_, workspace_bytes_, stream);
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
  a.workspace = need > 0 ? workspace_ : nullptr;
  a.workspace_bytes = need > 0 ? workspace_bytes_ : 0;
  a.stream = stream;
  run_varlen_attention(a);
}

}  // namespace attnkit::flash_attn
