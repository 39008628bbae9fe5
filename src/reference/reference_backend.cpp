// The reference backend: validates, then hands the batch to reference_attention.
#include "reference/reference_backend.h"

#include "attnkit/dcp.h"
#include "attnkit/error.h"
#include "attnkit/reference.h"
#include "core/backend_checks.h"
#include "core/backend_registry.h"

namespace attnkit::reference {

namespace {

constexpr std::string_view kBuild = "reference build";
constexpr std::string_view kForward = "reference forward";

class Builder final : public MetadataBuilder {
 public:
  explicit Builder(const AttentionConfig& cfg) : cfg_(cfg) {}
  std::unique_ptr<BackendMetadata> build(const CommonAttentionMetadata& common) override {
    validate_for_builder(common, cfg_.block_size, kBuild);
    auto md = std::make_unique<ReferenceMetadata>();
    md->common = common;
    md->max_block_id = max_block_id_read(common, cfg_.block_size);
    return md;
  }

 private:
  AttentionConfig cfg_;
};

class Impl final : public AttentionImpl {
 public:
  explicit Impl(const AttentionConfig& cfg) : cfg_(cfg) {}
  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& kv_cache, const BackendMetadata& metadata,
               const AttentionParams& params, const TensorView& out, void*) override {
    const auto* md = dynamic_cast<const ReferenceMetadata*>(&metadata);
    ATTNKIT_REQUIRE(md != nullptr, kForward, "metadata", "another backend's metadata",
                    "must come from the reference backend's builder");
    const CommonAttentionMetadata& common = md->common;
    ATTNKIT_REQUIRE(params.causal == common.causal, kForward, "params.causal", params.causal,
                    std::string("must equal the batch metadata's causal = ") + (common.causal ? "true" : "false"));
    const ForwardViews views = check_forward_tensors(q, k, v, out, params.lse, cfg_,
                                                     common.num_actual_tokens, Device::CPU,
                                                     /*out_same_dtype=*/false, kForward);
    kv_cache.require_device(kForward, "kv_cache", Device::CPU);
    const KVCacheSpec spec = cache_spec_of(kv_cache, cfg_, kForward);
    ATTNKIT_REQUIRE(md->max_block_id < spec.num_blocks, kForward, "block id", md->max_block_id,
                    "must be < the cache's num_blocks = " + std::to_string(spec.num_blocks));
    AttentionParams p = params;
    p.lse = views.lse;
    p.validate(kForward, cfg_.num_heads, cfg_.num_kv_heads, common.num_actual_tokens, Device::CPU);
    if (common.dcp_world_size > 1) {
      // One rank's shard (include/attnkit/dcp.h): its keys through its block table, the queries
      // at their global positions; the partial and its LSE (required) go to the combine, which
      // adds the sinks (given here, they are an error).
      const std::vector<int32_t> keys = common.key_seq_lens();
      BatchView local = common.batch();
      local.seq_lens = keys;
      reference_attention_dcp_shard(views.q, spec.view(kv_cache), local, common.seq_lens, p,
                                    DcpShard{common.dcp_world_size, common.dcp_rank, common.dcp_interleave},
                                    views.out, p.lse);
      return;
    }
    reference_attention(views.q, spec.view(kv_cache), common.batch(), p, views.out);
  }

 private:
  AttentionConfig cfg_;
};

void require_servable(const ReferenceBackend& b, const AttentionConfig& cfg, std::string_view where) {
  cfg.validate(where);
  const auto why = b.check(cfg);
  if (why.empty()) return;
  std::string all;
  for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
  throw Error(std::string(where), "configuration = " + cfg.describe(), "the reference backend " + all);
}

}  // namespace

Capabilities ReferenceBackend::capabilities() const {
  Capabilities c;
  c.dtypes = {DType::f32, DType::f16, DType::bf16};
  c.cache_dtypes = {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4};
  c.head_sizes = {};  // any multiple of 8 (16 for nvfp4: see check)
  c.head_size_multiple_of = 8;
  c.block_sizes = BlockSizeRule::MultipleOf(16);
  c.layouts = {KVLayout::NHD, KVLayout::HND};
  c.features = {.sinks = true, .alibi = true, .softcap = true, .sliding_window = true,
                .non_causal = true, .lse = true};
  c.runs_on_cpu = true;
  c.min_cc = 0;
  return c;
}

std::vector<std::string> ReferenceBackend::check(const AttentionConfig& cfg) const {
  auto why = capability_refusals(capabilities(), cfg);
  if (cfg.cache_dtype == DType::nvfp4 && cfg.head_size % kNvfp4BlockValues != 0)
    why.push_back("head size " + std::to_string(cfg.head_size) +
                  " does not fit an nvfp4 cache (it must be a multiple of 16, one scale per 16 values)");
  if (!cfg.device.cpu)
    why.push_back("the reference backend runs on the CPU only; it is the test oracle (the device is " +
                  cfg.device.describe() + ")");
  return why;
}

std::string ReferenceBackend::variant(const AttentionConfig&) const {
  return "CPU reference (double accumulation, every feature): the only backend that runs on the CPU";
}

std::unique_ptr<MetadataBuilder> ReferenceBackend::make_builder(const AttentionConfig& cfg) const {
  require_servable(*this, cfg, "reference make_builder");
  return std::make_unique<Builder>(cfg);
}

std::unique_ptr<AttentionImpl> ReferenceBackend::make_impl(const AttentionConfig& cfg) const {
  require_servable(*this, cfg, "reference make_impl");
  return std::make_unique<Impl>(cfg);
}

}  // namespace attnkit::reference

namespace attnkit {
const AttentionBackend& reference_backend() {
  static const reference::ReferenceBackend b;
  return b;
}
}  // namespace attnkit
