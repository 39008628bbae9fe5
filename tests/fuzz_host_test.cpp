// Host fuzzing of the public host entry points: random metadata, shapes and values, valid and
// corrupted, fed to the reference attention, the KV write, the merge, the three backends'
// builders, the FlashInfer-style page table and plan, the selector and the DCP rule. Each call
// must either throw attnkit::Error or return a result that holds what the entry promises (finite
// outputs, -inf LSE only for rows without keys, plans that cover the batch); a crash or another
// exception fails. The counts are printed (and recorded as test properties).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/dcp.h"
#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/ops.h"
#include "attnkit/reference.h"
#include "attnkit/selector.h"
#include "core/cuda_archs.h"
#include "flashinfer/page_table.h"
#include "flashinfer/plan.h"
#include "test_util.h"

namespace attnkit {
namespace {

using Rng = std::mt19937_64;
int pick(Rng& rng, int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)); }

// Runs f: an attnkit::Error counts as a refusal, no exception as an accepted call (then `check`
// must hold); anything else fails the test.
struct Tally {
  int64_t cases = 0, refused = 0;
  template <class F>
  bool run(F&& f) {
    ++cases;
    try {
      f();
      return true;
    } catch (const Error&) {
      ++refused;
      return false;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << cases << ": not an attnkit::Error: " << e.what();
      return false;
    }
  }
  void report(const char* what) const {
    std::printf("fuzz %s: %lld cases, %lld refused with attnkit::Error, %lld accepted\n", what,
                static_cast<long long>(cases), static_cast<long long>(refused), static_cast<long long>(cases - refused));
    ::testing::Test::RecordProperty(std::string(what) + "_cases", std::to_string(cases));
  }
};

// A random batch (host arrays) over a cache of num_blocks blocks, then one corruption.
struct FuzzBatch {
  std::vector<int32_t> qsl{0}, seq, table;
  int max_blocks = 1;
};
FuzzBatch random_batch(Rng& rng, int block_size, int64_t num_blocks, bool corrupt) {
  FuzzBatch b;
  const int n = pick(rng, 0, 5);
  std::vector<int> need;
  for (int r = 0; r < n; ++r) {
    const int seq = pick(rng, 0, 200), q = seq ? pick(rng, 0, std::min(seq, 20)) : 0;
    b.seq.push_back(seq);
    b.qsl.push_back(b.qsl.back() + q);
    need.push_back((seq + block_size - 1) / block_size);
    b.max_blocks = std::max(b.max_blocks, need.back());
  }
  b.table.assign(static_cast<size_t>(n) * b.max_blocks, 0);
  for (auto& x : b.table) x = static_cast<int32_t>(rng() % num_blocks);
  if (!corrupt || n == 0) return b;
  const int r = pick(rng, 0, n - 1);
  switch (rng() % 7) {
    case 0: b.table[static_cast<size_t>(r) * b.max_blocks] = static_cast<int32_t>(num_blocks + pick(rng, 0, 5)); break;
    case 1: b.table[static_cast<size_t>(r) * b.max_blocks] = -pick(rng, 1, 9); break;
    case 2: b.seq[r] += pick(rng, 1, 3) * block_size * b.max_blocks; break;  // past the table
    case 3: b.seq[r] = -pick(rng, 1, 5); break;
    case 4: b.qsl[r + 1] = b.qsl[r] - 1; break;  // decreasing
    case 5: b.qsl[r + 1] += b.seq[r] + 1; break;  // query longer than its keys
    case 6: b.qsl.pop_back(); break;              // wrong length
  }
  return b;
}

TEST(HostFuzz, ReferenceAttention) {
  Tally tally;
  for (int i = 0; i < 1500; ++i) {
    Rng rng(i);
    const bool corrupt = rng() % 2;
    const int kv = pick(rng, 1, 2), group = pick(rng, 1, 3), H = kv * group, D = 8 * pick(rng, 1, 4), bs = 16;
    KVCacheSpec spec;
    spec.num_blocks = pick(rng, 1, 12);
    spec.block_size = bs;
    spec.num_kv_heads = kv;
    spec.head_size = D;
    spec.cache_dtype = rng() % 3 == 0 ? DType::fp8_e4m3 : DType::f32;
    std::vector<uint8_t> cache(spec.total_bytes());
    for (auto& x : cache) x = static_cast<uint8_t>(rng() % 0x7f);  // (finite fp8 codes / small floats)
    if (spec.cache_dtype == DType::f32)
      for (size_t j = 0; j < cache.size() / 4; ++j)
        reinterpret_cast<float*>(cache.data())[j] = static_cast<float>(rng() % 2001) / 1000.f - 1.f;
    FuzzBatch b = random_batch(rng, bs, spec.num_blocks, corrupt);
    const int64_t T = std::max<int64_t>(0, b.qsl.empty() ? 0 : b.qsl.back() + (rng() % 3 == 0 ? 1 : 0));
    std::vector<float> q(std::max<int64_t>(T, 1) * H * D, 0.25f), out(q.size()), lse(std::max<int64_t>(T, 1) * H);
    std::vector<float> scale(1, 0.5f), slopes(H, 0.1f);
    AttentionParams p;
    p.causal = rng() % 2;
    p.window_left = rng() % 4 == 0 ? pick(rng, -3, 50) : -1;
    p.softcap = rng() % 5 == 0 ? (rng() % 2 ? 5.f : -1.f) : 0.f;
    if (spec.cache_dtype != DType::f32) p.k_scale = p.v_scale = TensorView(scale.data(), DType::f32, {1});
    if (rng() % 5 == 0) p.alibi_slopes = TensorView(slopes.data(), DType::f32, {rng() % 4 == 0 ? H + 1 : H});
    p.lse = TensorView(lse.data(), DType::f32, {H, std::max<int64_t>(T, 1)});
    const int64_t qrows = T == 0 ? 1 : T;
    const TensorView qv(q.data(), DType::f32, {qrows, H, rng() % 9 == 0 ? D + 8 : D});
    const TensorView ov(out.data(), DType::f32, {qrows, H, D});
    const PagedKV kvv = spec.view(TensorView(cache.data(), spec.storage_dtype(),
                                              {static_cast<int64_t>(cache.size() / dtype_size(spec.storage_dtype()))}));
    const BatchView view{b.qsl, b.seq, b.table, b.max_blocks};
    if (tally.run([&] { reference_attention(qv, kvv, view, p, ov, rng() % 2); })) {
      for (size_t j = 0; j < out.size(); ++j) ASSERT_TRUE(std::isfinite(out[j])) << "case " << i << " out[" << j << "]";
      for (float x : lse) ASSERT_FALSE(std::isnan(x) || x == INFINITY) << "case " << i;
    }
  }
  tally.report("reference_attention");
  EXPECT_GT(tally.refused, 0);
  EXPECT_LT(tally.refused, tally.cases);
}

TEST(HostFuzz, BuildersOfEveryBackend) {
  Tally tally;
  for (int i = 0; i < 1500; ++i) {
    Rng rng(10000 + i);
    const char* names[] = {"flash_attn", "flashinfer", "reference"};
    const char* name = names[i % 3];
    const int bs = 16;
    AttentionConfig cfg = test::model_config(8, 2, bs, std::string(name) == "reference" ? DeviceSpec::Cpu() : DeviceSpec::Cuda(9, 0));
    std::unique_ptr<MetadataBuilder> builder;
    if (!tally.run([&] { builder = backend(name).make_builder(cfg); })) continue;
    FuzzBatch b = random_batch(rng, bs, 64, rng() % 2);
    CommonAttentionMetadata md;
    md.query_start_loc = b.qsl;
    md.seq_lens = b.seq;
    md.block_table = b.table;
    md.max_blocks_per_req = b.max_blocks;
    md.causal = rng() % 4 != 0;
    const bool sorted = rng() % 2;  // decodes first (the FlashInfer-style builder requires it)
    if (tally.run([&] {
          md.finalize();
          if (sorted) md = permute_requests(md, decode_first_order(md));
          md.slot_mapping.assign(std::max(md.num_actual_tokens, 0), 0);
          if (rng() % 6 == 0 && !md.slot_mapping.empty()) md.slot_mapping[0] = int64_t{1} << 40;
          if (rng() % 6 == 0) md.max_query_len += 1;  // a stale maximum
          (void)builder->build(md);
        })) {
      SUCCEED();
    }
  }
  tally.report("builders");
  EXPECT_GT(tally.refused, 0);
  EXPECT_LT(tally.refused, tally.cases);
}

TEST(HostFuzz, FlashInferPageTableAndPlan) {
  Tally tally;
  for (int i = 0; i < 2000; ++i) {
    Rng rng(20000 + i);
    const int page = 16 << pick(rng, 0, 3), n = pick(rng, 0, 6);
    std::vector<int32_t> indptr{0}, indices, last, qo{0}, kv;
    for (int r = 0; r < n; ++r) {
      const int pages = pick(rng, 0, 4);
      for (int j = 0; j < pages; ++j) indices.push_back(pick(rng, 0, 100));
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(pages ? pick(rng, 1, page) : 0);
    }
    switch (rng() % 8) {  // one corruption in half the cases
      case 0: if (n) indptr[1] = indptr[0] - 1; break;
      case 1: if (n) last[0] = page + 1; break;
      case 2: if (!indices.empty()) indices[0] = -2; break;
      case 3: indptr.pop_back(); break;
      default: break;
    }
    flashinfer::PageTable t(8, 32);
    if (!tally.run([&] { t.assign(indptr, indices, last, page); })) continue;
    int32_t max_id = -1;
    for (int64_t j = 0; j < t.num_pages; ++j) max_id = std::max(max_id, t.indices[j]);
    ASSERT_EQ(t.max_page_id, max_id) << "case " << i;
    for (int r = 0; r < t.num_reqs; ++r) {
      kv.push_back(static_cast<int32_t>(t.kv_len(r)));
      qo.push_back(qo.back() + (kv.back() ? pick(rng, 0, std::min(kv.back(), 3)) : 0));
    }
    flashinfer::PlanConfig cfg;
    cfg.kernel = flashinfer::PlanKernel::TensorCore;
    cfg.num_kv_heads = 2;
    cfg.group_size = pick(rng, 1, 4);
    cfg.head_size = 128;
    cfg.page_size = page;
    cfg.num_slots = pick(rng, 1, 40);
    if (rng() % 6 == 0 && !qo.empty()) qo.back() += 5;  // query longer than its keys
    flashinfer::PlanBuffers plan(cfg, flashinfer::PlanCapacity::for_limits(cfg, 8, 64));
    const flashinfer::PlanBatch batch{qo, kv, rng() % 3 != 0, rng() % 4 == 0 ? pick(rng, -2, 40) : -1, -1};
    if (tally.run([&] { flashinfer::plan_batch(batch, plan); })) {
      // Every packed row with keys is written once: directly or through its merge range.
      ASSERT_LE(plan.num_items, plan.capacity.max_items);
      for (int64_t g = 0; g < int64_t{plan.num_tokens} * cfg.group_size; ++g)
        ASSERT_LE(plan.merge_indptr[g], plan.merge_indptr[g + 1]) << "case " << i;
    }
  }
  tally.report("flashinfer_page_table_and_plan");
  EXPECT_GT(tally.refused, 0);
  EXPECT_LT(tally.refused, tally.cases);
}

TEST(HostFuzz, WriteKvMergeStatesSelectorAndDcp) {
  Tally kvw, merge, sel, dcp;
  for (int i = 0; i < 1500; ++i) {
    Rng rng(30000 + i);
    // KV write (CPU): random slots (negative = padding, past the cache = Error) and shapes.
    {
      KVCacheSpec spec;
      spec.num_blocks = pick(rng, 1, 4);
      spec.block_size = 16;
      spec.num_kv_heads = pick(rng, 1, 2);
      spec.head_size = 16 * pick(rng, 1, 2);
      const DType dts[] = {DType::f32, DType::bf16, DType::fp8_e4m3, DType::nvfp4};
      spec.cache_dtype = dts[rng() % 4];
      std::vector<uint8_t> cache(spec.total_bytes());
      const int tokens = pick(rng, 0, 6);
      std::vector<float> key(std::max(tokens, 1) * spec.num_kv_heads * spec.head_size, 0.5f), scale(1, rng() % 6 ? 0.5f : -1.f);
      std::vector<int64_t> slots(std::max(tokens, 1));
      for (auto& s : slots) s = static_cast<int64_t>(rng() % (spec.num_blocks * spec.block_size + 3)) - 1;
      const TensorView kt(key.data(), DType::f32, {tokens, spec.num_kv_heads, rng() % 9 ? spec.head_size : spec.head_size + 16});
      const PagedKV kvv = spec.view(TensorView(cache.data(), spec.storage_dtype(),
                                                {static_cast<int64_t>(cache.size() / dtype_size(spec.storage_dtype()))}));
      KVScales sc;
      if (rng() % 2) sc.k_scale = sc.v_scale = TensorView(scale.data(), DType::f32, {1});
      kvw.run([&] { write_kv(kt, kt, kvv, TensorView(slots.data(), DType::i64, {tokens}), sc); });
    }
    // merge_states (CPU): shapes and dtypes, LSEs with every special value.
    {
      const int64_t T = pick(rng, 0, 4), H = pick(rng, 1, 3), D = 4 * pick(rng, 1, 3);
      std::vector<float> a(std::max<int64_t>(T, 1) * H * D, 1.f), b(a.size(), 2.f), o(a.size()), la(std::max<int64_t>(T, 1) * H), lb(la.size()), lo(la.size());
      const float specials[] = {0.f, -INFINITY, INFINITY, NAN, 3.f};
      for (auto& x : la) x = specials[rng() % 5];
      for (auto& x : lb) x = specials[rng() % 5];
      const int64_t Tb = rng() % 8 == 0 ? T + 1 : T;
      if (merge.run([&] {
            merge_states(TensorView(a.data(), DType::f32, {T, H, D}), TensorView(la.data(), DType::f32, {H, T}),
                         TensorView(b.data(), DType::f32, {Tb, H, D}), TensorView(lb.data(), DType::f32, {H, Tb}),
                         TensorView(o.data(), DType::f32, {T, H, D}), TensorView(lo.data(), DType::f32, {H, T}));
          }))
        for (int64_t j = 0; j < T * H * D; ++j) ASSERT_TRUE(std::isfinite(o[j])) << "merge case " << i;
    }
    // The selector: random (possibly malformed) configurations.
    {
      AttentionConfig cfg = test::model_config(pick(rng, 0, 64), pick(rng, 0, 16), 16 * pick(rng, 0, 70),
                                               rng() % 3 ? DeviceSpec::Cuda(pick(rng, 7, 10), 0) : DeviceSpec::Cpu());
      cfg.head_size = pick(rng, 0, 600);
      const DType caches[] = {DType::bf16, DType::f16, DType::fp8_e4m3, DType::nvfp4, DType::f32, DType::i32};
      cfg.cache_dtype = caches[rng() % 6];
      cfg.features.alibi = rng() % 4 == 0;
      cfg.features.non_causal = rng() % 4 == 0;
      const char* pref[] = {nullptr, "flash_attn", "flashinfer", "reference", "nope"};
      const char* p = pref[rng() % 5];
      sel.run([&] { (void)select_backend(cfg, p ? std::optional<std::string_view>(p) : std::nullopt); });
      sel.run([&] { (void)refusals(cfg); });
    }
    // DCP: random shards and lengths.
    {
      const DcpShard s{pick(rng, -1, 9), pick(rng, -2, 9), pick(rng, -1, 70)};
      std::vector<int32_t> lens(pick(rng, 0, 4));
      for (auto& l : lens) l = pick(rng, -3, 5000);
      std::vector<int32_t> local;
      if (dcp.run([&] { local = dcp_local_seq_lens(lens, s); })) {
        int64_t sum = 0;
        for (size_t r = 0; r < lens.size(); ++r) ASSERT_LE(local[r], lens[r]);
        for (int r = 0; r < s.world_size; ++r) sum += dcp_local_len(lens.empty() ? 0 : lens[0], {s.world_size, r, s.interleave});
        ASSERT_EQ(sum, lens.empty() ? 0 : lens[0]);
      }
    }
  }
  kvw.report("write_kv");
  merge.report("merge_states");
  sel.report("selector");
  dcp.report("dcp");
  for (const Tally* t : {&kvw, &merge, &sel, &dcp}) {
    EXPECT_GT(t->refused, 0);
    EXPECT_LT(t->refused, t->cases);
  }
}

// NVFP4 caches from separate tensors (FlashInfer's form) and the build's architecture lists:
// random shapes, strides, dtypes and strings. An accepted view is an nvfp4 cache of a head size
// that is a multiple of 16; an accepted list runs its code wherever it says it does.
TEST(HostFuzz, Nvfp4ViewsAndCudaArchs) {
  Rng rng(41);
  Tally views, archs;
  std::vector<uint8_t> pool(1 << 16, 0x3a);
  for (int i = 0; i < 3000; ++i) {
    const int64_t nb = pick(rng, 0, 4), bs = 16 * pick(rng, 1, 2), h = pick(rng, 1, 3);
    const int64_t d = 16 * pick(rng, 0, 8) + (rng() % 6 == 0 ? pick(rng, 1, 15) : 0);
    int64_t cd = d / 2, sd = d / 16;
    int64_t dims[4][4] = {{nb, bs, h, cd}, {nb, bs, h, cd}, {nb, bs, h, sd}, {nb, bs, h, sd}};
    if (rng() % 5 == 0) dims[rng() % 4][rng() % 4] += pick(rng, 1, 2);  // a shape that disagrees
    TensorView t[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t last = std::max<int64_t>(dims[k][3], 1);
      const int64_t s2 = last, s1 = h * last, s0 = bs * s1;
      DType dt = rng() % 9 == 0 ? DType::f16 : DType::u8;
      t[k] = TensorView(pool.data(), dt, {dims[k][0], dims[k][1], dims[k][2], dims[k][3]},
                        {s0, s1, s2, rng() % 11 == 0 ? 2 : 1});
    }
    views.run([&] {
      const PagedKV kv = paged_kv_nvfp4_from_views(t[0], t[1], t[2], t[3]);
      ASSERT_EQ(kv.dtype, DType::nvfp4);
      ASSERT_EQ(kv.head_size % 16, 0);
      ASSERT_GT(kv.head_size, 0);
    });
  }
  const char* parts[] = {"80", "86", "89", "90", "90a", "100", "-real", "-virtual", ";", ",", "sm_", "x", ""};
  for (int i = 0; i < 3000; ++i) {
    std::string list;
    for (int k = pick(rng, 0, 5); k > 0; --k) list += parts[rng() % std::size(parts)];
    archs.run([&] {
      const BuiltCudaArchs a = parse_cuda_archs(list);
      for (int cc : {75, 80, 86, 89, 90, 100})
        if (cuda_archs_run_on(a, cc)) ASSERT_GT(cuda_code_cc(a, cc), 0) << list;
    });
  }
  views.report("nvfp4_views");
  archs.report("cuda_archs");
}

}  // namespace
}  // namespace attnkit

namespace attnkit {
namespace {

// The DCP combine's host checks (dcp_combine) and its workspace size, on random shapes, dtypes,
// devices and shards: an attnkit::Error or, for the workspace size, a value (never a crash). No
// call may reach a collective: the communicator is always null, so every combine is refused.
TEST(HostFuzz, DcpCombineChecks) {
  Tally t;
  Rng rng(77);
  void* fake = reinterpret_cast<void*>(uintptr_t{0x10000});
  constexpr DType kTypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32};
  for (int i = 0; i < 3000; ++i) {
    const int N = pick(rng, 0, 9), T = pick(rng, -2, 70), H = pick(rng, 0, 33), D = pick(rng, 0, 130);
    const auto path = static_cast<DcpCombinePath>(pick(rng, 0, 2));
    t.run([&] { (void)dcp_combine_workspace_bytes(T, H, D, N, path); });
    DcpCombineArgs a;
    a.shard = {N, pick(rng, -1, N), 1};
    a.path = path;
    const Device dev = rng() % 8 == 0 ? Device::CPU : Device::CUDA;
    const int hs = N > 0 ? H / N : H;
    a.partial_out = TensorView(fake, kTypes[rng() % 4], {std::max(T, 0), H, D}, dev);
    a.partial_lse = TensorView(fake, rng() % 6 ? DType::f32 : DType::f16, {H, std::max(T, 0) + (rng() % 6 == 0)}, Device::CUDA);
    a.out = TensorView(fake, kTypes[rng() % 4], {std::max(T, 0), hs + (rng() % 8 == 0), D}, Device::CUDA);
    if (rng() % 2) a.out_lse = TensorView(fake, DType::f32, {hs, std::max(T, 0)}, Device::CUDA);
    if (rng() % 3 == 0) a.sinks = TensorView(fake, DType::f32, {H + (rng() % 5 == 0)}, Device::CUDA);
    a.nccl_comm = nullptr;  // (never a collective)
    a.workspace = rng() % 2 ? fake : nullptr;
    a.workspace_bytes = rng() % 1000000;
    if (t.run([&] { dcp_combine(a); })) ADD_FAILURE() << "case " << i << ": a null communicator was accepted";
  }
  t.report("dcp_combine");
}

}  // namespace
}  // namespace attnkit
