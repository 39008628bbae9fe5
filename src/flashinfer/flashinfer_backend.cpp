#include "flashinfer/flashinfer_backend.h"

#include <algorithm>
#include <string>

#include "attnkit/error.h"
#include "core/cuda_archs.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/tile_set.h"
#include "flashinfer/flashinfer_impl.h"
#include "flashinfer/metadata_builder.h"

namespace attnkit {
namespace flashinfer {

int group_size(const AttentionConfig& cfg) {
  if (cfg.num_heads <= 0 || cfg.num_kv_heads <= 0 || cfg.num_heads % cfg.num_kv_heads != 0) return 0;
  return cfg.num_heads / cfg.num_kv_heads;
}

std::vector<int> block_sizes_for(const AttentionConfig& cfg) {
  std::vector<int> sizes(std::begin(kSmallPageSizes), std::end(kSmallPageSizes));
  if (group_size(cfg) > 1 && !cfg.device.cpu && cfg.device.cc() >= kLargePageMinCC)
    sizes.insert(sizes.end(), std::begin(kLargePageSizes), std::end(kLargePageSizes));
  return sizes;
}

bool decode_uses_tensor_cores(int group) { return group > 1; }

bool flashinfer_kernels_built() {
#ifdef ATTNKIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

bool is_large_page(int block_size) {
  return std::find(std::begin(kLargePageSizes), std::end(kLargePageSizes), block_size) !=
         std::end(kLargePageSizes);
}

class FlashInferBackend final : public AttentionBackend {
  // Builders and impls are made only for configurations check() accepts.
  // Builders and impls need only the configuration rules (not kernels in this build), so the
  // host side (page tables, plans) stays usable and testable before the kernels exist.
  void require_serves(const AttentionConfig& cfg, std::string_view where) const {
    const auto why = configuration_refusals(cfg);
    if (why.empty()) return;
    std::string all;
    for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
    throw Error(std::string(where), "configuration " + cfg.describe(),
                "the flashinfer backend must serve it: " + all);
  }

 public:
  std::string_view name() const override { return "flashinfer"; }

  // The block-size list is the union over configurations (what the kernels take at all);
  // check() narrows it per configuration: large pages need GQA on sm90+.
  Capabilities capabilities() const override {
    Capabilities c;
    c.dtypes = {DType::f16, DType::bf16};
    c.cache_dtypes = {DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4};
    c.head_sizes = {64, 128, 256};
    std::vector<int> sizes(std::begin(kSmallPageSizes), std::end(kSmallPageSizes));
    sizes.insert(sizes.end(), std::begin(kLargePageSizes), std::end(kLargePageSizes));
    c.block_sizes = BlockSizeRule::List(std::move(sizes));
    c.layouts = {KVLayout::NHD, KVLayout::HND};
    c.features.sinks = true;
    c.features.alibi = false;
    c.features.softcap = true;
    c.features.sliding_window = true;
    c.features.non_causal = true;  // served by the prefill path
    c.features.lse = true;
    c.runs_on_cpu = false;
    c.min_cc = 80;
    return c;
  }

  // What the selector sees: the configuration rules, and on a GPU the rules of its kernels
  // (in this build, reading this cache dtype), so no engine is handed a backend whose kernels
  // cannot run.
  std::vector<std::string> check(const AttentionConfig& cfg) const override {
    auto why = configuration_refusals(cfg);
    if (cfg.device.cpu) return why;
    if (!flashinfer_kernels_built())
      why.push_back("its GPU kernels are not in this build (attnkit was built without CUDA)");
    else if (cfg.device.cc() >= 80 && !gpu_code_refusal(cfg.device.cc()).empty())
      why.push_back(gpu_code_refusal(cfg.device.cc()));
    if (why.empty()) {  // (its planned kernels' tiles must fit the device's shared memory)
      const flash_attn::CacheKind kind = flash_attn::cache_kind_of(cfg.cache_dtype);
      const int dim = flash_attn::kernel_head_dim(cfg.head_size, kind, /*planned=*/true);
      if (std::string fit = dim > 0 ? flash_attn::tile_smem_refusal(dim, kind, cfg.device.cc()) : ""; !fit.empty())
        why.push_back(fit);
    }
    const bool cache16 = cfg.cache_dtype == DType::f16 || cfg.cache_dtype == DType::bf16;
    if (cache16 && cfg.cache_dtype != cfg.dtype)
      why.push_back("a 16-bit KV cache must have the model dtype on the GPU (cache " +
                    std::string(dtype_name(cfg.cache_dtype)) + ", model " + std::string(dtype_name(cfg.dtype)) + ")");
    return why;
  }


  std::string variant(const AttentionConfig& cfg) const override {
    const int g = group_size(cfg);
    std::string v = decode_uses_tensor_cores(g)
                        ? "decode on tensor cores (GQA group of " + std::to_string(g) +
                              " packed into the query tile)"
                        : "decode on CUDA cores (MHA: one query row per head)";
    v += cfg.cache_dtype == DType::nvfp4
             ? "; prefill: planned 16-row tiles over the paged cache (the decode tile reads NVFP4)"
             : "; prefill: planned tiles of 16 / 64 / 128 packed rows over the paged cache";
    if (cfg.features.non_causal) v += "; non-causal batches run wholly on the prefill path";
    return v;
  }

  // Pages above 256 tokens: the FlashInfer-style plan chunks each request by whole pages and
  // balances the chunks over the SMs, and engines (vLLM) hand such caches to FlashInfer; its
  // decode at page 128 measured 0.99-1.15x its page 16 (bench/RESULTS.md). NVFP4 caches are
  // read by its planned kernels only.
  std::string preference(const AttentionConfig& cfg) const override {
    if (cfg.cache_dtype == DType::nvfp4) return "an NVFP4 cache: read by the FlashInfer-style planned kernels only";
    if (cfg.block_size > kPreferAbovePageSize)
      return "pages of " + std::to_string(cfg.block_size) + " tokens (> " + std::to_string(kPreferAbovePageSize) +
             "): the FlashInfer-style plan chunks requests by whole pages and balances them over the SMs";
    return {};
  }

  // ALWAYS for GQA/MQA: both parts run the tensor-core tile kernels over persistent slot
  // lists (grid = num_slots x num_kv_heads, fixed), from plans in fixed-capacity buffers with
  // the tile fixed at creation in graph mode (BuilderLimits::cuda_graph), so one captured
  // launch replays for any batch mix that fits the limits. MHA decodes run the CUDA-core
  // kernel, a separate design (one query row per item); until it is shown to replay across
  // batch mixes it is offered for uniform batches only, as vLLM offers FA2 (UNIFORM_BATCH).
  CudagraphSupport cudagraph_support(const AttentionConfig& cfg) const override {
    return group_size(cfg) > 1 ? CudagraphSupport::ALWAYS : CudagraphSupport::UNIFORM_BATCH;
  }

  // Default limits (metadata_builder.h); engines that know theirs construct
  // FlashInferMetadataBuilder directly.
  std::unique_ptr<MetadataBuilder> make_builder(const AttentionConfig& cfg) const override {
    require_serves(cfg, "flashinfer make_builder");
    return std::make_unique<FlashInferMetadataBuilder>(cfg, BuilderLimits{});
  }

  std::unique_ptr<AttentionImpl> make_impl(const AttentionConfig& cfg) const override {
    require_serves(cfg, "flashinfer make_impl");
    return make_flashinfer_impl(cfg);
  }
};

}  // namespace

std::vector<std::string> configuration_refusals(const AttentionConfig& cfg) {
  auto why = flashinfer_backend().AttentionBackend::check(cfg);
  if (!is_large_page(cfg.block_size)) return why;
  const int g = group_size(cfg);
  if (g == 1)
    why.push_back("block size " + std::to_string(cfg.block_size) +
                  " needs a GQA/MQA model (num_heads / num_kv_heads > 1, here " +
                  std::to_string(cfg.num_heads) + " / " + std::to_string(cfg.num_kv_heads) +
                  "): pages of 128..1024 tokens are read only by the kernels that pack a "
                  "query-head group into one tile; MHA takes 16, 32 or 64");
  if (!cfg.device.cpu && cfg.device.cc() < kLargePageMinCC)
    why.push_back("block size " + std::to_string(cfg.block_size) +
                  " needs sm90 or newer (the device is " + cfg.device.describe() +
                  "): pages of 128..1024 tokens are served by the Hopper kernels only");
  return why;
}

}  // namespace flashinfer

const AttentionBackend& flashinfer_backend() {
  static const flashinfer::FlashInferBackend b;
  return b;
}

}  // namespace attnkit
