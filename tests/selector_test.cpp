// The selector: a table of configurations with the backend chosen (or the error), the
// variant it reports and the reasons every other backend gives; then properties over a grid.
#include <gtest/gtest.h>

#include "flash_attn/generation.h"
#include "flashinfer/flashinfer_backend.h"

#include "test_util.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "attnkit/selector.h"
#include "core/cuda_archs.h"

namespace attnkit {
namespace {

AttentionConfig base(DeviceSpec device) {
  return test::model_config(32, 8, 16, device);
}
const DeviceSpec kSm80 = DeviceSpec::Cuda(8, 0), kSm90 = DeviceSpec::Cuda(9, 0),
                 kSm100 = DeviceSpec::Cuda(10, 0), kCpu = DeviceSpec::Cpu();

struct Row {
  const char* name;
  DeviceSpec device;
  std::function<void(AttentionConfig&)> mutate;
  std::optional<std::string> preferred;
  std::string chosen;  // empty: select_backend throws
  std::vector<std::string> variant_mentions;  // substrings of Selection::variant
  // backend -> substrings that its refusal reasons must contain (one backend listed with no
  // substrings must still be refused); backends not listed must not be refused.
  std::map<std::string, std::vector<std::string>> refused;
  std::vector<std::string> error_mentions;  // substrings of the Error, when chosen is empty
};

void none(AttentionConfig&) {}

std::vector<Row> table() {
  const std::string oracle = "runs on the CPU only; it is the test oracle";
  const std::string gpu_only = "runs on CUDA GPUs only";
  // An sm90 hot shape runs the hopper generation when this build has its kernels (sm_90a).
  const std::vector<std::string> sm90_hot = flash_attn::hopper_generation_built()
                                                ? std::vector<std::string>{"hopper generation"}
                                                : std::vector<std::string>{"mma_sync generation", "hopper", "not built"};
  // The FlashInfer-style backend serves GPUs where this build has its (planned) kernels.
  const bool fi = flashinfer::flashinfer_kernels_built();
  const std::string fi_chosen = fi ? "flashinfer" : "";
  const std::vector<std::string> fi_variant = fi ? std::vector<std::string>{"prefill: planned"} : std::vector<std::string>{};
  auto fi_error = [&](std::vector<std::string> m) { return fi ? std::vector<std::string>{} : m; };
  // A device none of the build's GPU code runs on (CMake ATTNKIT_CUDA_ARCHS; a build without
  // CUDA says nothing of it): the GPU backends refuse it, naming the device.
  auto on_device = [&](int cc, Row served) {
    if (gpu_code_refusal(cc).empty()) return served;
    const std::string no_code = "no GPU code that runs on sm" + std::to_string(cc);
    served.chosen = "";
    served.variant_mentions = {};
    served.refused = {{"flash_attn", {no_code}}, {"flashinfer", {no_code}}, {"reference", {oracle}}};
    served.error_mentions = {no_code};
    return served;
  };
  return {
      {"bf16 GQA on sm90", kSm90, none, {}, "flash_attn", sm90_hot,
       {{"reference", {oracle}}}, {}},
      on_device(80, {"FP8 cache on sm80: hopper generation refused", kSm80,
                     [](AttentionConfig& c) { c.cache_dtype = DType::fp8_e4m3; }, {}, "flash_attn",
                     {"mma_sync generation", "hopper generation refused", "needs sm90"},
                     {{"reference", {oracle}}}, {}}),
      {"FP8 e5m2 cache on sm90", kSm90, [](AttentionConfig& c) { c.cache_dtype = DType::fp8_e5m2; }, {},
       "flash_attn", sm90_hot, {{"reference", {oracle}}}, {}},
      {"head size 520 on sm90: nobody", kSm90, [](AttentionConfig& c) { c.head_size = 520; }, {}, "", {},
       {{"flash_attn", {"head size 520", "head size is 520"}}, {"flashinfer", {"head size 520"}},
        {"reference", {oracle}}},
       {"no backend can serve", "head size 520"}},
      {"head size 520 on the CPU", kCpu, [](AttentionConfig& c) { c.head_size = 520; }, {}, "reference",
       {"CPU"}, {{"flash_attn", {gpu_only}}, {"flashinfer", {gpu_only, "head size 520"}}}, {}},
      {"head size 96: flash_attn only", kSm90, [](AttentionConfig& c) { c.head_size = 96; }, {}, "flash_attn",
       {"hopper", "the head-dim-96 kernels"}, {{"flashinfer", {"head size 96"}}, {"reference", {oracle}}}, {}},
      {"head size 512: mma_sync", kSm90, [](AttentionConfig& c) { c.head_size = 512; }, {}, "flash_attn",
       {"mma_sync", "head-dim-512 kernels"}, {{"flashinfer", {"head size 512"}}, {"reference", {oracle}}}, {}},
      {"head size 112: padded to 128", kSm90, [](AttentionConfig& c) { c.head_size = 112; }, {}, "flash_attn",
       {"head-dim-128 kernels (head size 112 zero-padded)"}, {{"flashinfer", {"head size 112"}}, {"reference", {oracle}}}, {}},
      {"block size 24: nobody", kSm90, [](AttentionConfig& c) { c.block_size = 24; }, {}, "", {},
       {{"flash_attn", {"block size 24", "multiple of 16"}}, {"flashinfer", {"block size 24"}},
        {"reference", {"block size 24", oracle}}},
       {"block size 24"}},
      {"block size 48: flash_attn", kSm90, [](AttentionConfig& c) { c.block_size = 48; }, {}, "flash_attn", {},
       {{"flashinfer", {"block size 48"}}, {"reference", {oracle}}}, {}},
      {"block size 256 GQA on sm90", kSm90, [](AttentionConfig& c) { c.block_size = 256; }, {}, "flash_attn", {},
       {{"reference", {oracle}}}, {}},
      // The FlashInfer-style backend accepts block 256 for GQA on sm90 (its configuration rules,
      // tested in flashinfer_backend_test) where this build has its GPU kernels.
      {"block size 256 with the FlashInfer-style backend", kSm90, [](AttentionConfig& c) { c.block_size = 256; },
       "flashinfer", fi_chosen, fi_variant, {{"reference", {oracle}}},
       fi_error({"preferred backend = flashinfer", "not in this build"})},
      {"block size 256 MHA, flashinfer preferred", kSm90,
       [](AttentionConfig& c) {
         c.block_size = 256;
         c.num_kv_heads = 32;
       },
       "flashinfer", "", {}, {}, {"flashinfer", "block size 256", "GQA"}},
      {"block size 256 on sm80, flashinfer preferred", kSm80, [](AttentionConfig& c) { c.block_size = 256; },
       "flashinfer", "", {}, {}, {"flashinfer", "sm90"}},
      {"ALiBi", kSm90, [](AttentionConfig& c) { c.features.alibi = true; }, {}, "flash_attn",
       sm90_hot,
       {{"flashinfer", {"ALiBi"}}, {"reference", {oracle}}}, {}},
      {"ALiBi, flashinfer preferred", kSm90, [](AttentionConfig& c) { c.features.alibi = true; }, "flashinfer", "",
       {}, {}, {"preferred backend = flashinfer", "ALiBi"}},
      {"sinks", kSm90, [](AttentionConfig& c) { c.features.sinks = true; }, {}, "flash_attn", sm90_hot,
       {{"reference", {oracle}}}, {}},
      {"non-causal", kSm90, [](AttentionConfig& c) { c.features.non_causal = true; }, {}, "flash_attn", sm90_hot,
       {{"reference", {oracle}}}, {}},
      // (non-causal batches run wholly on its prefill path)
      {"non-causal, flashinfer preferred", kSm90, [](AttentionConfig& c) { c.features.non_causal = true; },
       "flashinfer", fi_chosen, fi ? std::vector<std::string>{"non-causal batches run wholly on the prefill path"}
                                   : std::vector<std::string>{},
       {{"reference", {oracle}}}, fi_error({"preferred backend = flashinfer", "not in this build"})},
      {"softcap + window + LSE", kSm90,
       [](AttentionConfig& c) { c.features.softcap = c.features.sliding_window = c.features.lse = true; }, {},
       "flash_attn", sm90_hot, {{"reference", {oracle}}}, {}},
      {"CPU-only machine", kCpu, none, {}, "reference", {"CPU reference"},
       {{"flash_attn", {gpu_only}}, {"flashinfer", {gpu_only}}}, {}},
      {"CPU, flash_attn preferred", kCpu, none, "flash_attn", "", {}, {}, {"flash_attn", gpu_only}},
      {"GPU, reference preferred", kSm90, none, "reference", "", {}, {}, {"reference", oracle}},
      {"fp32 on the CPU", kCpu, [](AttentionConfig& c) { c.dtype = c.cache_dtype = DType::f32; }, {}, "reference",
       {}, {{"flash_attn", {"dtype f32"}}, {"flashinfer", {"dtype f32"}}}, {}},
      {"fp32 on sm90: nobody", kSm90, [](AttentionConfig& c) { c.dtype = c.cache_dtype = DType::f32; }, {}, "", {},
       {{"flash_attn", {"dtype f32 is not supported"}}, {"flashinfer", {"dtype f32"}}, {"reference", {oracle}}},
       {"dtype f32"}},
      {"NVFP4 cache on sm90: flashinfer (its planned decode reads it)", kSm90,
       [](AttentionConfig& c) { c.cache_dtype = DType::nvfp4; }, {}, fi_chosen, fi_variant,
       {{"flash_attn", {"nvfp4"}}, {"reference", {oracle}}}, fi_error({"nvfp4"})},
      {"f16 cache for a bf16 model: nobody in this build", kSm90,
       [](AttentionConfig& c) { c.cache_dtype = DType::f16; }, {}, "", {},
       {{"flash_attn", {"model dtype"}}, {"flashinfer", {"model dtype"}}, {"reference", {oracle}}}, {"model dtype"}},
      {"HND layout", kSm90, [](AttentionConfig& c) { c.layout = KVLayout::HND; }, {}, "flash_attn", {},
       {{"reference", {oracle}}}, {}},
      on_device(100, {"sm100", kSm100, none, {}, "flash_attn", {"mma_sync", "the device is sm100"},
                      {{"reference", {oracle}}}, {}}),
      {"sm75: nobody", DeviceSpec::Cuda(7, 5), none, {}, "", {},
       {{"flash_attn", {"8.0 or newer"}}, {"flashinfer", {"8.0 or newer"}}, {"reference", {oracle}}}, {"sm75"}},
      {"preferred flash_attn honoured", kSm90, none, "flash_attn", "flash_attn", {}, {{"reference", {oracle}}}, {}},
  };
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "[" + x + "] ";
  return s;
}

TEST(Selector, Table) {
  const bool fi_built = flashinfer::flashinfer_kernels_built();
  for (const Row& row : table()) {
    SCOPED_TRACE(row.name);
    AttentionConfig cfg = base(row.device);
    row.mutate(cfg);
    // refusals() reports the same reasons whichever way select_backend goes.
    const std::vector<Refusal> all = refusals(cfg);
    std::map<std::string, std::vector<std::string>> by_name;
    for (const auto& r : all) by_name[r.backend] = r.reasons;
    if (row.chosen.empty()) {
      try {
        const Selection s = select_backend(cfg, row.preferred);
        ADD_FAILURE() << "chose " << s.backend;
      } catch (const Error& e) {
        for (const auto& m : row.error_mentions)
          EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << m << " not in " << e.what();
      }
    } else {
      const Selection s = select_backend(cfg, row.preferred);
      EXPECT_EQ(s.backend, row.chosen);
      EXPECT_FALSE(s.variant.empty());
      for (const auto& m : row.variant_mentions)
        EXPECT_NE(s.variant.find(m), std::string::npos) << m << " not in " << s.variant;
      std::map<std::string, std::vector<std::string>> sel_refused;
      for (const auto& r : s.refused) sel_refused[r.backend] = r.reasons;
      EXPECT_EQ(sel_refused, by_name) << "Selection::refused and refusals() disagree";
      EXPECT_EQ(by_name.count(s.backend), 0u);
    }
    if (!row.preferred || !row.chosen.empty()) {
      // Exactly the listed backends are refused, each with the listed reasons; on a GPU the
      // FlashInfer-style backend is always refused too, until its kernels ship.
      auto expected = row.refused;
      if (!row.device.cpu && !fi_built) expected["flashinfer"].push_back("GPU kernels are not in this build");
      for (const auto& [name, reasons] : by_name)
        EXPECT_TRUE(expected.count(name)) << name << " refused unexpectedly: " << joined(reasons);
      for (const auto& [name, mentions] : expected) {
        auto it = by_name.find(name);
        ASSERT_NE(it, by_name.end()) << name << " was not refused";
        for (const auto& m : mentions)
          EXPECT_TRUE(std::any_of(it->second.begin(), it->second.end(),
                                  [&](const std::string& r) { return r.find(m) != std::string::npos; }))
              << name << ": " << m << " not in " << joined(it->second);
      }
    }
  }
}

// The FlashInfer-style backend claims pages above 256 tokens (and NVFP4 caches) where it serves
// them; the caller's preferred backend still wins, and the reason says which rule chose.
TEST(Selector, APreferenceWinsOverTheRegistryOrder) {
  AttentionConfig cfg = base(kSm90);
  cfg.block_size = 512;
  const Selection s = select_backend(cfg);
  if (flashinfer::flashinfer_kernels_built() && gpu_code_refusal(90).empty()) {
    EXPECT_EQ(s.backend, "flashinfer");
    EXPECT_NE(s.reason.find("pages of 512 tokens (> 256)"), std::string::npos) << s.reason;
  } else {
    EXPECT_EQ(s.backend, "flash_attn") << s.reason;
  }
  const Selection fa = select_backend(cfg, "flash_attn");
  EXPECT_EQ(fa.backend, "flash_attn");
  EXPECT_EQ(fa.reason, "the caller's preferred backend");
  cfg.block_size = 256;
  const Selection at256 = select_backend(cfg);
  EXPECT_EQ(at256.backend, "flash_attn");
  EXPECT_EQ(at256.reason, "the first backend in the registry's order that serves it");
  cfg.block_size = 512;
  cfg.num_kv_heads = 32;  // MHA: the large pages are not the FlashInfer-style backend's
  EXPECT_EQ(select_backend(cfg).backend, "flash_attn");
}

TEST(Selector, MalformedConfigurationsAndUnknownNamesAreErrors) {
  AttentionConfig cfg = base(kSm90);
  cfg.num_kv_heads = 6;
  EXPECT_THROW(select_backend(cfg), Error);
  EXPECT_THROW(refusals(cfg), Error);
  cfg = base(kSm90);
  cfg.head_size = 0;
  EXPECT_THROW(select_backend(cfg), Error);
  try {
    select_backend(base(kSm90), "flashattention");
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attn, flashinfer, reference"), std::string::npos) << e.what();
  }
}

// Over a grid of configurations: the choice is the first backend in registry order whose
// check passes; every backend before it is refused with reasons; a preference is honoured
// exactly when its check passes.
TEST(Selector, FirstServableBackendInPreferenceOrder) {
  int chosen_count = 0, none_count = 0;
  for (DeviceSpec dev : {kCpu, DeviceSpec::Cuda(7, 5), kSm80, DeviceSpec::Cuda(8, 9), kSm90, kSm100})
    for (int hs : {64, 80, 96, 128, 256, 512})
      for (DType cache : {DType::bf16, DType::f16, DType::fp8_e4m3, DType::nvfp4})
        for (int bs : {16, 24, 64, 256, 1024})
          for (int kv : {8, 32})
            for (int feature = 0; feature < 4; ++feature) {
              AttentionConfig cfg = base(dev);
              cfg.head_size = hs;
              cfg.cache_dtype = cache;
              cfg.block_size = bs;
              cfg.num_kv_heads = kv;
              cfg.features.alibi = feature == 1;
              cfg.features.sinks = feature == 2;
              cfg.features.non_causal = feature == 3;
              // The first server that claims the configuration (a preference), else the first server.
              const AttentionBackend *first = nullptr, *claimed = nullptr;
              for (const AttentionBackend* b : backends())
                if (b->check(cfg).empty()) {
                  if (!first) first = b;
                  if (!claimed && !b->preference(cfg).empty()) claimed = b;
                }
              if (!first) {
                ++none_count;
                EXPECT_THROW(select_backend(cfg), Error) << cfg.describe();
                EXPECT_EQ(refusals(cfg).size(), backends().size());
                continue;
              }
              ++chosen_count;
              const Selection s = select_backend(cfg);
              ASSERT_EQ(s.backend, (claimed ? claimed : first)->name()) << cfg.describe();
              EXPECT_EQ(s.reason, claimed ? claimed->preference(cfg) : "the first backend in the registry's order that serves it")
                  << cfg.describe();
              for (const auto& r : s.refused) EXPECT_FALSE(r.reasons.empty()) << r.backend;
              for (const AttentionBackend* b : backends()) {
                const bool ok = b->check(cfg).empty();
                if (ok) {
                  EXPECT_EQ(select_backend(cfg, b->name()).backend, b->name());
                } else {
                  EXPECT_THROW(select_backend(cfg, b->name()), Error) << b->name() << " " << cfg.describe();
                }
                if (b == first) break;
                EXPECT_FALSE(ok) << b->name() << " precedes " << first->name() << " and could serve";
              }
            }
  // The grid covers both outcomes richly.
  EXPECT_GT(chosen_count, 500);
  EXPECT_GT(none_count, 500);
}

}  // namespace
}  // namespace attnkit
