// Every validation path of the core entry points (KVCacheSpec, views, write_kv, metadata,
// split/reorder, AttentionParams, merge_states) throws attnkit::Error whose message names the
// offending value and the rule. One table, one row per rejected input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/ops.h"
#include "attnkit/params.h"
#include "test_util.h"

namespace attnkit {
namespace {

// ---- shared operands: a valid bf16 NHD cache (4 blocks of 16 slots, 2 heads of 32) and
// host buffers big enough for every view below. CUDA views reuse host pointers: nothing
// dereferences them before the device checks fire.
struct Fixture {
  KVCacheSpec spec;
  std::vector<uint8_t> cache_buf;
  PagedKV kv;
  std::vector<float> f32buf = std::vector<float>(8192, 0.5f);
  std::vector<int64_t> slots = {0, 5, -1, 63};
  std::vector<int32_t> i32buf = std::vector<int32_t>(64, 0);
  Fixture() {
    spec.num_blocks = 4;
    spec.block_size = 16;
    spec.num_kv_heads = 2;
    spec.head_size = 32;
    spec.cache_dtype = DType::bf16;
    cache_buf.resize(spec.total_bytes());
    kv = spec.view(TensorView(cache_buf.data(), DType::bf16, {spec.total_bytes() / 2}));
  }
  float* f() { return f32buf.data(); }
  TensorView key(int64_t t = 4, int64_t h = 2, int64_t d = 32, DType dt = DType::f32) {
    return TensorView(f(), dt, {t, h, d});
  }
  TensorView slot_view() { return TensorView(slots.data(), DType::i64, {4}); }
  TensorView scale(std::initializer_list<int64_t> shape, DType dt = DType::f32,
                   Device dev = Device::CPU) {
    return TensorView(f() + 4096, dt, shape, dev);
  }
};

Fixture& fx() {
  static Fixture f;
  return f;
}

PagedKV with_dtype(PagedKV kv, DType t) {
  kv.dtype = t;
  kv.k.scale_base = kv.v.scale_base = kv.k.base;
  return kv;
}

// A valid batch: decode (1 of 10), prefill (7 of 20), prefill (4 of 4).
CommonAttentionMetadata base_md() {
  CommonAttentionMetadata md;
  md.query_start_loc = {0, 1, 8, 12};
  md.seq_lens = {10, 20, 4};
  md.max_blocks_per_req = 4;
  md.block_table = {3, 0, 0, 0, 7, 8, 0, 0, 11, 0, 0, 0};
  md.slot_mapping.assign(12, 0);
  md.slot_mapping[0] = 3 * 16 + 9;
  md.finalize();
  return md;
}

void validate_md(const CommonAttentionMetadata& md) { md.validate(512, 16); }

template <class Mut>
std::function<void()> md_case(Mut mut) {
  return [mut] {
    auto md = base_md();
    mut(md);
    validate_md(md);
  };
}

template <class Mut>
std::function<void()> params_case(Mut mut, int heads = 8, int kv_heads = 2, int64_t tokens = 6) {
  return [mut, heads, kv_heads, tokens] {
    AttentionParams p;
    mut(p);
    p.validate("attention", heads, kv_heads, tokens, Device::CPU);
  };
}

// merge_states operands: T = 5 tokens, H = 4 heads, D = 8; each call overrides one.
struct MergeArgs {
  TensorView out_a, lse_a, out_b, lse_b, out, lse_out;
  MergeArgs() {
    float* f = fx().f();
    out_a = TensorView(f, DType::f32, {5, 4, 8});
    out_b = TensorView(f + 512, DType::f32, {5, 4, 8});
    out = TensorView(f + 1024, DType::f32, {5, 4, 8});
    lse_a = TensorView(f + 2048, DType::f32, {4, 5});
    lse_b = TensorView(f + 2048 + 64, DType::f32, {4, 5});
    lse_out = TensorView(f + 2048 + 128, DType::f32, {4, 5});
  }
  void run() const { merge_states(out_a, lse_a, out_b, lse_b, out, lse_out); }
};

template <class Mut>
std::function<void()> merge_case(Mut mut) {
  return [mut] {
    MergeArgs a;
    mut(a);
    a.run();
  };
}

template <class Mut>
std::function<void()> spec_case(Mut mut) {
  return [mut] {
    KVCacheSpec s = fx().spec;
    mut(s);
    s.validate();
  };
}

struct ErrorCase {
  std::string name;
  std::function<void()> fn;
  std::vector<std::string> want;
};

std::vector<ErrorCase> error_cases() {
  Fixture& F = fx();
  std::vector<ErrorCase> c;
  // -- KVCacheSpec
  c.push_back({"SpecBlockSizeNotMultipleOf16", spec_case([](KVCacheSpec& s) { s.block_size = 24; }),
               {"block_size = 24", "positive multiple of 16"}});
  c.push_back({"SpecBlockSizeZero", spec_case([](KVCacheSpec& s) { s.block_size = 0; }),
               {"block_size = 0"}});
  c.push_back({"SpecNumBlocksZero", spec_case([](KVCacheSpec& s) { s.num_blocks = 0; }),
               {"num_blocks = 0", "> 0"}});
  c.push_back({"SpecKVHeadsZero", spec_case([](KVCacheSpec& s) { s.num_kv_heads = 0; }),
               {"num_kv_heads = 0"}});
  c.push_back({"SpecHeadSizeNotMultipleOf8", spec_case([](KVCacheSpec& s) { s.head_size = 20; }),
               {"head_size = 20", "multiple of 8"}});
  c.push_back({"SpecNvfp4HeadSize", spec_case([](KVCacheSpec& s) {
                 s.cache_dtype = DType::nvfp4;
                 s.head_size = 24;
               }),
               {"head_size = 24", "multiple of 16 for an nvfp4 cache"}});
  c.push_back({"SpecCacheDType", spec_case([](KVCacheSpec& s) { s.cache_dtype = DType::i32; }),
               {"cache_dtype = i32"}});
  // -- KVCacheSpec::view
  c.push_back({"ViewWrongDType",
               [&F] { F.spec.view(TensorView(F.cache_buf.data(), DType::f16, {F.spec.total_bytes() / 2})); },
               {"cache.dtype = f16", "must be bf16"}});
  c.push_back({"ViewWrongNumel",
               [&F] { F.spec.view(TensorView(F.cache_buf.data(), DType::bf16, {100})); },
               {"cache.shape = [100]", "8192 elements"}});
  c.push_back({"ViewWrongShape",
               [&F] { F.spec.view(TensorView(F.cache_buf.data(), DType::bf16, {4, 2, 2, 16, 32})); },
               {"cache.shape = [4, 2, 2, 16, 32]", "physical [4, 2, 16, 2, 32]"}});
  c.push_back({"ViewNotContiguous",
               [&F] {
                 F.spec.view(TensorView(F.cache_buf.data(), DType::bf16, {4, 2, 16, 2, 32},
                                        {2048, 1024, 64, 1, 2}));
               },
               {"cache.strides = [2048, 1024, 64, 1, 2]", "contiguous"}});
  c.push_back({"ViewPhysicalStrided",
               [&F] {
                 F.spec.view(TensorView(F.cache_buf.data(), DType::bf16, {4, 2, 16, 2, 32},
                                        {4096, 1024, 64, 32, 1}));
               },
               {"cache.strides = [4096, 1024, 64, 32, 1]", "contiguous"}});
  c.push_back({"ViewNullData", [&F] { F.spec.view(TensorView(nullptr, DType::bf16, {8192})); },
               {"cache.data = nullptr"}});
  // -- paged_kv_from_views
  auto kc = [&F](DType t = DType::bf16) {
    return TensorView(F.cache_buf.data(), t, {4, 16, 2, 32}, {2048, 64, 32, 1});
  };
  c.push_back({"ViewsShapeMismatch",
               [&F, kc] {
                 paged_kv_from_views(kc(), TensorView(F.cache_buf.data(), DType::bf16, {4, 16, 1, 32},
                                                      {2048, 64, 32, 1}));
               },
               {"value_cache.shape = [4, 16, 1, 32]", "must be [4, 16, 2, 32]"}});
  c.push_back({"ViewsDTypeMismatch", [kc] { paged_kv_from_views(kc(), kc(DType::f16)); },
               {"value_cache.dtype = f16", "key_cache.dtype = bf16"}});
  c.push_back({"ViewsNvfp4Storage", [kc] { paged_kv_from_views(kc(DType::u8), kc(DType::u8)); },
               {"key_cache.dtype = u8"}});
  c.push_back({"ViewsLastDimStrided",
               [&F, kc] {
                 auto k = TensorView(F.cache_buf.data(), DType::bf16, {4, 16, 2, 32}, {4096, 128, 64, 2});
                 paged_kv_from_views(k, k);
               },
               {"key_cache.stride(-1) = 2"}});
  c.push_back({"ViewsStridesDiffer",
               [&F, kc] {
                 paged_kv_from_views(kc(), TensorView(F.cache_buf.data(), DType::bf16, {4, 16, 2, 32},
                                                      {1024, 64, 32, 1}));
               },
               {"value_cache.stride(0) = 1024", "key_cache.stride(0) = 2048"}});
  c.push_back({"ViewsDeviceMismatch",
               [&F, kc] {
                 paged_kv_from_views(kc(), TensorView(F.cache_buf.data(), DType::bf16, {4, 16, 2, 32},
                                                      {2048, 64, 32, 1}, Device::CUDA));
               },
               {"value_cache.device = cuda:0", "key_cache.device = cpu:0"}});
  c.push_back({"ViewsBlockSize8",
               [&F] {
                 auto k = TensorView(F.cache_buf.data(), DType::bf16, {8, 8, 2, 32});
                 paged_kv_from_views(k, k);
               },
               {"block_size = 8", "multiple of 16"}});
  c.push_back({"ViewsNot4D",
               [&F] {
                 auto k = TensorView(F.cache_buf.data(), DType::bf16, {4, 16, 64});
                 paged_kv_from_views(k, k);
               },
               {"key_cache.shape = [4, 16, 64]", "4 dims"}});
  // -- write_kv
  c.push_back({"WriteSlotBeyondCache",
               [&F] {
                 std::vector<int64_t> s = {0, 1, 9000, 2};
                 write_kv(F.key(), F.key(), F.kv, TensorView(s.data(), DType::i64, {4}));
               },
               {"slot_mapping[2] = 9000", "< num_blocks * block_size = 64"}});
  c.push_back({"WriteSlotJustBeyondCache",
               [&F] {
                 std::vector<int64_t> s = {64, 1, 2, 3};
                 write_kv(F.key(), F.key(), F.kv, TensorView(s.data(), DType::i64, {4}));
               },
               {"slot_mapping[0] = 64"}});
  c.push_back({"WriteKeyHeadsMismatch",
               [&F] { write_kv(F.key(4, 3), F.key(), F.kv, F.slot_view()); },
               {"key.shape = [4, 3, 32]", "must be [4, 2, 32]"}});
  c.push_back({"WriteValueTokensMismatch",
               [&F] { write_kv(F.key(), F.key(5), F.kv, F.slot_view()); },
               {"value.shape = [5, 2, 32]", "must be [4, 2, 32]"}});
  c.push_back({"WriteKeyHeadSizeMismatch",
               [&F] { write_kv(F.key(4, 2, 64), F.key(), F.kv, F.slot_view()); },
               {"key.shape = [4, 2, 64]"}});
  c.push_back({"WriteKeyDType",
               [&F] { write_kv(F.key(4, 2, 32, DType::i32), F.key(), F.kv, F.slot_view()); },
               {"key.dtype = i32", "f32, f16 or bf16"}});
  c.push_back({"WriteValueDTypeDiffers",
               [&F] { write_kv(F.key(), F.key(4, 2, 32, DType::f16), F.kv, F.slot_view()); },
               {"value.dtype = f16", "key.dtype = f32"}});
  c.push_back({"WriteSlotMappingDType",
               [&F] {
                 write_kv(F.key(), F.key(), F.kv, TensorView(F.i32buf.data(), DType::i32, {4}));
               },
               {"slot_mapping.dtype = i32", "must be i64"}});
  c.push_back({"WriteSlotMapping2D",
               [&F] {
                 write_kv(F.key(), F.key(), F.kv, TensorView(F.slots.data(), DType::i64, {2, 2}));
               },
               {"slot_mapping.shape = [2, 2]", "1 dims"}});
  c.push_back({"WriteKeyLastDimStrided",
               [&F] {
                 write_kv(TensorView(F.f(), DType::f32, {4, 2, 32}, {128, 64, 2}), F.key(), F.kv,
                          F.slot_view());
               },
               {"key.stride(-1) = 2"}});
  c.push_back({"WriteKeyOnOtherDevice",
               [&F] {
                 write_kv(TensorView(F.f(), DType::f32, {4, 2, 32}, Device::CUDA), F.key(), F.kv,
                          F.slot_view());
               },
               {"key.device = cuda:0", "cache's device cpu:0"}});
  c.push_back({"WriteSlotMappingOnOtherDevice",
               [&F] {
                 write_kv(F.key(), F.key(), F.kv,
                          TensorView(F.slots.data(), DType::i64, {4}, Device::CUDA, 1));
               },
               {"slot_mapping.device = cuda:1"}});
  auto fp8 = with_dtype(F.kv, DType::fp8_e4m3);
  auto nvfp4 = with_dtype(F.kv, DType::nvfp4);
  c.push_back({"WriteScaleDType",
               [&F, fp8] {
                 write_kv(F.key(), F.key(), fp8, F.slot_view(), {F.scale({1}, DType::f16), {}});
               },
               {"k_scale.dtype = f16", "must be f32"}});
  c.push_back({"WriteScaleShape",
               [&F, fp8] { write_kv(F.key(), F.key(), fp8, F.slot_view(), {F.scale({3}), {}}); },
               {"k_scale.shape = [3]", "[num_kv_heads = 2]"}});
  c.push_back({"WriteNvfp4PerHeadScale",
               [&F, nvfp4] { write_kv(F.key(), F.key(), nvfp4, F.slot_view(), {{}, F.scale({2})}); },
               {"v_scale.shape = [2]", "one global scale"}});
  c.push_back({"WriteScaleOnOtherDevice",
               [&F, fp8] {
                 write_kv(F.key(), F.key(), fp8, F.slot_view(),
                          {F.scale({1}, DType::f32, Device::CUDA), {}});
               },
               {"k_scale.device = cuda:0"}});
  c.push_back({"WriteScaleZero",
               [&F, fp8] {
                 std::vector<float> s = {0.f};
                 write_kv(F.key(), F.key(), fp8, F.slot_view(),
                          {TensorView(s.data(), DType::f32, {1}), {}});
               },
               {"k_scale[0] = 0", "finite and > 0"}});
  c.push_back({"WriteScaleNaN",
               [&F, fp8] {
                 std::vector<float> s = {1.f, NAN};
                 write_kv(F.key(), F.key(), fp8, F.slot_view(),
                          {{}, TensorView(s.data(), DType::f32, {2})});
               },
               {"v_scale[1] = nan", "finite and > 0"}});
  c.push_back({"WriteCacheBlockSize",
               [&F] {
                 PagedKV kv = F.kv;
                 kv.block_size = 8;
                 write_kv(F.key(), F.key(), kv, F.slot_view());
               },
               {"block_size = 8"}});
  c.push_back({"WriteCacheNullBase",
               [&F] {
                 PagedKV kv = F.kv;
                 kv.v.base = nullptr;
                 write_kv(F.key(), F.key(), kv, F.slot_view());
               },
               {"cache.base = nullptr"}});
  c.push_back({"WriteCacheDType",
               [&F] { write_kv(F.key(), F.key(), with_dtype(F.kv, DType::i64), F.slot_view()); },
               {"cache_dtype = i64"}});
#ifndef ATTNKIT_WITH_CUDA
  c.push_back({"WriteCudaInCpuBuild",
               [&F] {
                 PagedKV kv = F.kv;
                 kv.device = Device::CUDA;
                 const TensorView k(F.f(), DType::f32, {4, 2, 32}, Device::CUDA);
                 write_kv(k, k, kv, TensorView(F.slots.data(), DType::i64, {4}, Device::CUDA));
               },
               {"write_kv", "built without CUDA"}});
  c.push_back({"MergeCudaInCpuBuild", merge_case([](MergeArgs& a) {
                 for (TensorView* t : {&a.out_a, &a.lse_a, &a.out_b, &a.lse_b, &a.out, &a.lse_out})
                   t->device = Device::CUDA;
               }),
               {"merge_states", "built without CUDA"}});
#endif
  // -- metadata
  c.push_back({"QueryLongerThanSeq", md_case([](auto& md) {
                 md.seq_lens = {10, 20, 5};
                 md.query_start_loc = {0, 1, 2, 9};
                 md.slot_mapping.assign(9, 0);
                 md.finalize();
               }),
               {"seq_lens[2] = 5", "query_len (7) <= seq_len"}});
  c.push_back({"BlockIdBeyondCache", md_case([](auto& md) {
                 md.seq_lens[1] = 64;
                 md.block_table[4 + 2] = 1;
                 md.block_table[4 + 3] = 900;
                 md.finalize();
               }),
               {"block_table[1][3] = 900", "block id < num_blocks = 512"}});
  c.push_back({"BlockIdNegative", md_case([](auto& md) { md.block_table[0] = -1; }),
               {"block_table[0][0] = -1"}});
  c.push_back({"TooFewBlocksPerRequest", md_case([](auto& md) {
                 md.seq_lens[0] = 65;
                 md.finalize();
               }),
               {"seq_lens[0] = 65", "= 5 blocks but max_blocks_per_req = 4"}});
  c.push_back({"MetadataSlotBeyondCache", md_case([](auto& md) { md.slot_mapping[4] = 9000; }),
               {"slot_mapping[4] = 9000", "< num_blocks * block_size = 8192"}});
  c.push_back({"QueryStartNotZero", md_case([](auto& md) { md.query_start_loc[0] = 1; }),
               {"query_start_loc[0] = 1", "must be 0"}});
  c.push_back({"QueryStartDecreasing", md_case([](auto& md) { md.query_start_loc[2] = 0; }),
               {"query_start_loc[2] = 0", "non-decreasing"}});
  c.push_back({"QueryStartSize", md_case([](auto& md) { md.query_start_loc.pop_back(); }),
               {"query_start_loc.size() = 3", "num_reqs + 1 = 4"}});
  c.push_back({"NumActualTokens", md_case([](auto& md) { md.num_actual_tokens = 5; }),
               {"num_actual_tokens = 5", "query_start_loc[num_reqs] = 12"}});
  c.push_back({"MaxQueryLen", md_case([](auto& md) { md.max_query_len = 3; }),
               {"max_query_len = 3", "largest query_len = 7"}});
  c.push_back({"MaxSeqLen", md_case([](auto& md) { md.max_seq_len = 64; }),
               {"max_seq_len = 64", "largest seq_len = 20"}});
  c.push_back({"SlotMappingSize", md_case([](auto& md) { md.slot_mapping.resize(3); }),
               {"slot_mapping.size() = 3", "num_actual_tokens = 12"}});
  c.push_back({"BlockTableSize", md_case([](auto& md) { md.block_table.resize(5); }),
               {"block_table.size() = 5", "num_reqs * max_blocks_per_req = 12"}});
  c.push_back({"NumReqs", md_case([](auto& md) { md.num_reqs = 4; }),
               {"num_reqs = 4", "seq_lens.size() = 3"}});
  c.push_back({"NegativeSeqLen", md_case([](auto& md) {
                 md.seq_lens[0] = -1;
                 md.finalize();
               }),
               {"seq_lens[0] = -1", ">= 0"}});
  c.push_back({"MetadataBlockSize", [] { base_md().validate(512, 24); },
               {"block_size = 24", "positive multiple of 16"}});
  c.push_back({"DeviceCopyDType", md_case([&F](auto& md) {
                 md.seq_lens_dev = TensorView(F.i32buf.data(), DType::i64, {3}, Device::CUDA);
               }),
               {"seq_lens_dev.dtype = i64", "must be i32"}});
  c.push_back({"DeviceCopyShape", md_case([&F](auto& md) {
                 md.query_start_loc_dev = TensorView(F.i32buf.data(), DType::i32, {3}, Device::CUDA);
               }),
               {"query_start_loc_dev.shape = [3]", "must be [4]"}});
  c.push_back({"SplitDecodeAfterPrefill",
               [] {
                 auto md = base_md();
                 md.query_start_loc = {0, 1, 8, 9};
                 md.slot_mapping.resize(9);
                 md.finalize();
                 split_decodes_and_prefills(md);
               },
               {"query_len[2] = 1", "after prefill request 1", "decode_first_order"}});
  c.push_back({"SplitThreshold", [] { split_decodes_and_prefills(base_md(), 0); },
               {"decode_threshold = 0", ">= 1"}});
  c.push_back({"PermuteOutOfRange",
               [] { permute_requests(base_md(), std::vector<int>{0, 5, 1}); },
               {"perm[1] = 5", "[0, num_reqs = 3)"}});
  c.push_back({"PermuteDuplicate",
               [] { permute_requests(base_md(), std::vector<int>{0, 1, 0}); },
               {"perm[2] = 0", "appears twice (also at perm[0])"}});
  c.push_back({"PermuteSize", [] { permute_requests(base_md(), std::vector<int>{0, 1}); },
               {"perm.size() = 2", "num_reqs = 3"}});
  c.push_back({"PermuteSlotMappingSize",
               [] {
                 auto md = base_md();
                 md.slot_mapping.pop_back();
                 permute_requests(md, std::vector<int>{2, 1, 0});
               },
               {"slot_mapping.size() = 11", "= 12"}});
  // -- AttentionParams
  c.push_back({"HeadsNotDivisible", params_case([](auto&) {}, 12, 5),
               {"num_heads = 12", "divisible by num_kv_heads = 5"}});
  c.push_back({"KVHeadsZero", params_case([](auto&) {}, 8, 0), {"num_kv_heads = 0"}});
  c.push_back({"ScaleInf", params_case([](auto& p) { p.scale = INFINITY; }),
               {"scale = inf", "finite"}});
  c.push_back({"ScaleNaN", params_case([](auto& p) { p.scale = NAN; }), {"scale = nan"}});
  c.push_back({"SoftcapNegative", params_case([](auto& p) { p.softcap = -1.f; }),
               {"softcap = -1", ">= 0"}});
  c.push_back({"WindowLeft", params_case([](auto& p) { p.window_left = -2; }),
               {"window_left = -2", ">= -1"}});
  c.push_back({"WindowRight", params_case([](auto& p) { p.window_right = -5; }),
               {"window_right = -5"}});
  c.push_back({"AlibiShape", params_case([&F](auto& p) { p.alibi_slopes = F.scale({4}); }),
               {"alibi_slopes.shape = [4]", "num_heads = 8"}});
  c.push_back({"AlibiDType",
               params_case([&F](auto& p) { p.alibi_slopes = F.scale({8}, DType::f16); }),
               {"alibi_slopes.dtype = f16", "must be f32"}});
  c.push_back({"SinksDevice",
               params_case([&F](auto& p) { p.sinks = F.scale({8}, DType::f32, Device::CUDA); }),
               {"sinks.device = cuda", "must be cpu"}});
  c.push_back({"ParamsKScaleShape", params_case([&F](auto& p) { p.k_scale = F.scale({3}); }),
               {"k_scale.shape = [3]", "[num_kv_heads = 2]"}});
  c.push_back({"ParamsVScaleDType",
               params_case([&F](auto& p) { p.v_scale = F.scale({2}, DType::bf16); }),
               {"v_scale.dtype = bf16"}});
  c.push_back({"LseShape", params_case([&F](auto& p) { p.lse = F.scale({8, 5}); }),
               {"lse.shape = [8, 5]", "[num_heads = 8, num_tokens = 6]"}});
  c.push_back({"LseNotContiguous",
               params_case([&F](auto& p) {
                 p.lse = TensorView(F.f(), DType::f32, {8, 6}, {1, 8});
               }),
               {"lse.strides = [1, 8]", "contiguous"}});
  c.push_back({"ResolvedScaleHeadSize", [] { AttentionParams().resolved_scale(0); },
               {"head_size = 0"}});
  // -- merge_states
  c.push_back({"MergeOutBShape",
               merge_case([](MergeArgs& a) { a.out_b = TensorView(a.out_b.data, DType::f32, {5, 4, 16}); }),
               {"out_b.shape = [5, 4, 16]", "must be [5, 4, 8]"}});
  c.push_back({"MergeOutDType", merge_case([](MergeArgs& a) { a.out.dtype = DType::i32; }),
               {"out.dtype = i32", "f32, f16 or bf16"}});
  c.push_back({"MergeOutA2D",
               merge_case([](MergeArgs& a) { a.out_a = TensorView(a.out_a.data, DType::f32, {5, 32}); }),
               {"out_a.shape = [5, 32]", "3 dims"}});
  c.push_back({"MergeLseDType", merge_case([](MergeArgs& a) { a.lse_a.dtype = DType::f16; }),
               {"lse_a.dtype = f16", "must be f32"}});
  c.push_back({"MergeLseTransposed",
               merge_case([](MergeArgs& a) { a.lse_b = TensorView(a.lse_b.data, DType::f32, {5, 4}); }),
               {"lse_b.shape = [5, 4]", "[num_heads = 4, num_tokens = 5]"}});
  c.push_back({"MergeLseOutShape",
               merge_case([](MergeArgs& a) { a.lse_out = TensorView(a.lse_out.data, DType::f32, {4}); }),
               {"lse_out.shape = [4]"}});
  c.push_back({"MergeDeviceMismatch", merge_case([](MergeArgs& a) { a.out_b.device = Device::CUDA; }),
               {"out_b.device = cuda:0", "out_a's device cpu:0"}});
  c.push_back({"MergeLastDimStrided",
               merge_case([](MergeArgs& a) {
                 a.out = TensorView(a.out.data, DType::f32, {5, 4, 8}, {64, 16, 2});
               }),
               {"out.stride(-1) = 2"}});
  return c;
}

class ValidationErrors : public ::testing::TestWithParam<size_t> {};

TEST_P(ValidationErrors, ThrowsErrorNamingValueAndRule) {
  const auto cases = error_cases();
  const ErrorCase& c = cases[GetParam()];
  EXPECT_TRUE(test::throws_error_with(c.fn, c.want)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Table, ValidationErrors, ::testing::Range<size_t>(0, error_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return error_cases()[i.param].name;
                         });

// The unmodified operands of the table pass, so each row fails for its own reason.
TEST(ValidationBaseline, UnmodifiedOperandsAreAccepted) {
  Fixture& F = fx();
  EXPECT_NO_THROW(F.spec.validate());
  EXPECT_NO_THROW(validate_md(base_md()));
  EXPECT_NO_THROW(params_case([](auto&) {})());
  EXPECT_NO_THROW(merge_case([](MergeArgs&) {})());
  std::vector<uint8_t> fp8buf(F.spec.total_bytes() / 2);
  KVCacheSpec s8 = F.spec;
  s8.cache_dtype = DType::fp8_e4m3;
  const PagedKV fp8 = s8.view(TensorView(fp8buf.data(), DType::fp8_e4m3, {s8.total_bytes()}));
  std::vector<float> scale = {1.f, 2.f};
  EXPECT_NO_THROW(write_kv(F.key(), F.key(), fp8, F.slot_view(),
                           {TensorView(scale.data(), DType::f32, {2}),
                            TensorView(scale.data(), DType::f32, {1})}));
  AttentionParams p;
  p.alibi_slopes = F.scale({8});
  p.sinks = F.scale({8});
  p.k_scale = F.scale({2});
  p.v_scale = F.scale({1});
  p.lse = F.scale({8, 6});
  p.window_left = 127;
  p.window_right = 0;
  p.softcap = 30.f;
  EXPECT_NO_THROW(p.validate("attention", 8, 2, 6, Device::CPU));
  EXPECT_FLOAT_EQ(p.resolved_scale(128), 1.f / std::sqrt(128.f));
  p.scale = 0.25f;
  EXPECT_EQ(p.resolved_scale(128), 0.25f);
}

}  // namespace
}  // namespace attnkit
