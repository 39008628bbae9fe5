#include "flash_attn/flash_attn_backend.h"

#include "attnkit/error.h"
#include "core/backend_registry.h"
#include "core/cuda_archs.h"
#include "flash_attn/generation.h"
#include "flash_attn/impl.h"
#include "flash_attn/metadata_builder.h"

namespace attnkit::flash_attn {

Capabilities FlashAttnBackend::capabilities() const {
  // The union over the kernel generations (the mma_sync generation has all of it).
  Capabilities c;
  c.dtypes = {DType::f16, DType::bf16};
  c.cache_dtypes = {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2};
  c.head_sizes = {};  // any multiple of 8 the kernels' dims cover (generation.cpp says which serves it)
  c.head_size_multiple_of = 8;
  c.block_sizes = BlockSizeRule::MultipleOf(16);  // the page is resolved per 16-row slice
  c.layouts = {KVLayout::NHD, KVLayout::HND};
  c.features = {.sinks = true, .alibi = true, .softcap = true, .sliding_window = true,
                .non_causal = true, .lse = true};
  c.runs_on_cpu = false;
  c.min_cc = 80;
  return c;
}

std::vector<std::string> FlashAttnBackend::check(const AttentionConfig& cfg) const {
  auto why = AttentionBackend::check(cfg);
  const bool cache16 = cfg.cache_dtype == DType::f16 || cfg.cache_dtype == DType::bf16;
  if (cache16 && cfg.cache_dtype != cfg.dtype)
    why.push_back("a 16-bit KV cache must have the model dtype (cache " +
                  std::string(dtype_name(cfg.cache_dtype)) + ", model " +
                  std::string(dtype_name(cfg.dtype)) + ")");
  if (why.empty()) {
    const GenerationChoice g = choose_generation(cfg);
    if (!g.chosen) why.push_back("no kernel generation serves it: " + g.describe());
  }
  // (the build's GPU code must run on the device: core/cuda_archs.h)
  if (!cfg.device.cpu && cfg.device.cc() >= 80 && !gpu_code_refusal(cfg.device.cc()).empty())
    why.push_back(gpu_code_refusal(cfg.device.cc()));
  return why;
}

std::string FlashAttnBackend::variant(const AttentionConfig& cfg) const {
  return choose_generation(cfg).describe();
}

void require_servable(const AttentionConfig& cfg, std::string_view where) {
  cfg.validate(where);
  const auto why = flash_attn_backend().check(cfg);
  if (why.empty()) return;
  std::string all;
  for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
  throw Error(std::string(where), "configuration = " + cfg.describe(), "flash_attn " + all);
}

std::unique_ptr<MetadataBuilder> FlashAttnBackend::make_builder(const AttentionConfig& cfg) const {
  require_servable(cfg, "flash_attn make_builder");
  return std::make_unique<FlashAttnMetadataBuilder>(cfg);
}

std::unique_ptr<AttentionImpl> FlashAttnBackend::make_impl(const AttentionConfig& cfg) const {
  require_servable(cfg, "flash_attn make_impl");
  return std::make_unique<FlashAttnImpl>(cfg);
}

}  // namespace attnkit::flash_attn

namespace attnkit {
const AttentionBackend& flash_attn_backend() {
  static const flash_attn::FlashAttnBackend b;
  return b;
}
}  // namespace attnkit
