#include "flash_attn/generation.h"

#include <algorithm>

#include "flash_attn/tile_set.h"

namespace attnkit::flash_attn {

namespace {

constexpr int kMmaSyncMinCC = 80;  // mma.sync m16n8k16 bf16 and cp.async arrive with Ampere
constexpr int kHopperCC = 90;      // wgmma and TMA exist on sm90 only (sm100 has tcgen05)

template <size_t N>
std::string list(const int (&set)[N]) {
  std::string s;
  for (int x : set) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// The cache kind the FlashAttention-style kernels read a cache dtype as (nvfp4 and f32 caches are
// refused by the dtype rule below; their head sizes are then judged as 16-bit ones).
CacheKind fa_cache_kind(DType c) { return is_fp8(c) ? CacheKind::fp8 : CacheKind::b16; }

void common_rules(const AttentionConfig& cfg, std::vector<std::string>& why) {
  if (cfg.dtype != DType::f16 && cfg.dtype != DType::bf16)
    why.push_back("computes in f16 or bf16 only (dtype is " + std::string(dtype_name(cfg.dtype)) + ")");
  if (cfg.device.cpu) why.push_back("is a CUDA kernel (the device is the CPU)");
  const DType c = cfg.cache_dtype;
  if (c != DType::f16 && c != DType::bf16 && !is_fp8(c))
    why.push_back("reads f16, bf16 or FP8 caches only (cache dtype is " + std::string(dtype_name(c)) + ")");
}

std::vector<std::string> mma_sync_rules(const AttentionConfig& cfg) {
  std::vector<std::string> why;
  common_rules(cfg, why);
  if (!cfg.device.cpu && cfg.device.cc() < kMmaSyncMinCC)
    why.push_back("needs sm80 or newer for mma.sync bf16 tensor cores (the device is " +
                  cfg.device.describe() + ")");

  const DType c = cfg.cache_dtype;
  if (kernel_head_dim(cfg.head_size, fa_cache_kind(c)) == 0)
    why.push_back("serves head sizes that are multiples of 8 (16 with an fp8 cache) up to " +
                  std::to_string(kMaxHeadSize) + ", each on the next larger of its kernels' head dims " +
                  list(kMmaSyncHeadDims) + " (head size is " + std::to_string(cfg.head_size) + ")");
  const int dim = kernel_head_dim(cfg.head_size, fa_cache_kind(c));
  if (why.empty() && dim > 0) {
    if (std::string fit = tile_smem_refusal(dim, fa_cache_kind(c), cfg.device.cc()); !fit.empty()) why.push_back(fit);
  }
  return why;
}

std::vector<std::string> hopper_rules(const AttentionConfig& cfg, bool built) {
  std::vector<std::string> why;
  common_rules(cfg, why);
  if (!cfg.device.cpu && cfg.device.cc() != kHopperCC)
    why.push_back("needs sm90 (wgmma and TMA are Hopper instructions; the device is " +
                  cfg.device.describe() + ")");
  const CacheKind kind = fa_cache_kind(cfg.cache_dtype);
  if (!tile_instantiated(TileId::hopper, tile_head_dim(TileId::hopper, cfg.head_size, kind), CacheKind::b16)) {
    const int dim = kernel_head_dim(cfg.head_size, kind);
    why.push_back("has kernels for head dims 64 / 96 / 128 / 192 / 256 (96: 16-bit caches), serving head sizes up "
                  "to 256 on the next of them (head size " + std::to_string(cfg.head_size) +
                  (dim > 0 ? " runs on dim " + std::to_string(dim) + ")" : " has no kernel dim)"));
  }
  if (!built) why.push_back("its kernels are not built (this library has no sm_90a code)");
  return why;
}

}  // namespace

bool hopper_generation_built() {
#ifdef ATTNKIT_SM90A_BUILT
  return true;
#else
  return false;
#endif
}

std::string_view generation_name(Generation g) {
  return g == Generation::hopper ? "hopper" : "mma_sync";
}

std::vector<std::string> generation_refusals(Generation g, const AttentionConfig& cfg,
                                             bool hopper_kernels_built) {
  return g == Generation::hopper ? hopper_rules(cfg, hopper_kernels_built) : mma_sync_rules(cfg);
}

GenerationChoice choose_generation(const AttentionConfig& cfg, bool hopper_kernels_built) {
  GenerationChoice choice;
  for (Generation g : kGenerationPreference) {
    auto why = generation_refusals(g, cfg, hopper_kernels_built);
    if (why.empty() && !choice.chosen) {
      choice.chosen = g;
    } else if (!why.empty()) {
      choice.refused.push_back({g, std::move(why)});
    }
  }
  if (!choice.chosen) {
    choice.why = "no kernel generation serves this configuration";
    return choice;
  }
  const CacheKind kind = fa_cache_kind(cfg.cache_dtype);
  auto kernels = [&](int dim) {
    return dim == cfg.head_size ? "the head-dim-" + std::to_string(dim) + " kernels"
                                : "the head-dim-" + std::to_string(dim) + " kernels (head size " +
                                      std::to_string(cfg.head_size) + " zero-padded)";
  };
  const int dim = kernel_head_dim(cfg.head_size, kind);
  if (*choice.chosen == Generation::hopper) {
    const int hopper_dim = tile_head_dim(TileId::hopper, cfg.head_size, kind);
    choice.why = "sm90 hot shape: wgmma kernels for prefill-shaped launches, split ones too (decode-shaped "
                 "launches run the mma_sync kernels), " + kernels(hopper_dim);
    if (hopper_dim != dim) choice.why += "; the mma_sync launches on " + kernels(dim);
    return choice;
  }
  // mma_sync chosen: say whether hopper lost only because its kernels are not built.
  const auto hopper_would = generation_refusals(Generation::hopper, cfg, /*built=*/true);
  if (hopper_would.empty())
    choice.why = "the preferred hopper generation would serve this configuration but its kernels "
                 "are not built, so mma_sync (sm80+) serves it";
  else
    choice.why = "mma.sync kernels for sm80+ with the widest feature set";
  choice.why += ", " + kernels(dim);
  return choice;
}

std::string GenerationChoice::describe() const {
  std::string s = chosen ? std::string(generation_name(*chosen)) + " generation: " + why : why;
  for (const auto& r : refused) {
    s += ". " + std::string(generation_name(r.generation)) + " generation refused: ";
    for (size_t i = 0; i < r.reasons.size(); ++i) s += (i ? "; " : "") + r.reasons[i];
  }
  return s;
}

}  // namespace attnkit::flash_attn
