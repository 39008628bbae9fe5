// Decode throughput: batch 1..256 x KV 1k..32k, 32 query heads over 8 KV heads, head size 128,
// block 16, bf16 and fp8 e4m3 caches. Each shape is timed as a CUDA graph of back-to-back
// run_varlen_attention calls (launch gaps hidden) rotating over R distinct KV instances (other
// blocks of one pool, shuffled) whose total is >= 8x the L2, so every call reads from HBM.
// GB/s counts the bytes a decode must move: its K/V rows, q and out. The fraction is of the
// read-only ceiling measured in the same run. A shape's bf16 and fp8 graphs are replayed in turns
// (time_interleaved: 9 rounds, medians), so their ratio is free of the SM clock's drift.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attention_setup.h"
#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flash_attn/split_kv.h"

namespace attnkit::bench {

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadSize = 128, kBlock = 16;

}  // namespace

void run_decode(Recorder& rec, cudaStream_t stream, double read_gbps, bool quick) {
  const auto& props = cuda::current_device_props();
  // One pool per cache dtype, so that each shape's bf16 and fp8 launches are timed in turns (the
  // fp8/bf16 ratio then compares the same seconds of the run, not two ends of the section). The
  // largest shape (256 x 32k) needs 34.4 GB in bf16 and half that in fp8; keep 8 GB free.
  DecodeBuffers buf16 = make_decode_buffers(int64_t{36} << 30, int64_t{26} << 30, 256, kHeads, kHeadSize, stream);
  DecodeBuffers buf8 = make_decode_buffers(int64_t{18} << 30, int64_t{8} << 30, 256, kHeads, kHeadSize, stream);
  if (buf16.pool_bytes <= 0 || buf8.pool_bytes <= 0) {
    rec.fail("decode", "decode pool", "not enough free device memory");
    return;
  }
  struct Pool {
    DType dtype;
    DecodeBuffers* buf;
    KVCacheSpec spec;
    PagedKV cache;
  };
  std::vector<Pool> pools;
  for (auto [cd, b] : {std::pair{DType::bf16, &buf16}, std::pair{DType::fp8_e4m3, &buf8}}) {
    const KVCacheSpec spec = decode_pool_spec(cd, b->pool_bytes, kBlock, kKvHeads, kHeadSize);
    fill_random(b->pool.get(), spec.total_bytes() / static_cast<int64_t>(dtype_size(cd)), cd, 41, stream);
    pools.push_back({cd, b, spec, pool_view(spec, b->pool.get())});
  }
  const std::vector<int> batches = quick ? std::vector<int>{1, 16} : std::vector<int>{1, 4, 16, 64, 256};
  const std::vector<int> kv_lens = quick ? std::vector<int>{4096} : std::vector<int>{1024, 4096, 8192, 32768};
  auto pct = [&](double g) { return read_gbps > 0 ? 100.0 * g / read_gbps : 0.0; };
  // One dtype's launch of a shape, ready to time.
  struct Prepared {
    std::string key;
    DecodeShape shape;
    int splits = 1;
    cuda::DeviceBuffer workspace;
  };
  for (int B : batches)
    for (int L : kv_lens) {
      std::vector<std::unique_ptr<Prepared>> shapes;
      for (const Pool& pool : pools) {
        const DType cd = pool.dtype;
        DecodeBuffers& buf = *pool.buf;  // (q / out / scale of this pool)
        const std::string key = "decode " + std::string(cd == DType::bf16 ? "bf16" : "fp8") + " b" +
                                std::to_string(B) + " kv" + std::to_string(L);
        if (!key_selected(key)) continue;
        try {
          auto d = std::make_unique<Prepared>();
          d->key = key;
          d->shape = make_decode_shape(B, L, pool.spec, pool.cache, buf.q.get(), buf.out.get(),
                                       cd == DType::bf16 ? nullptr : buf.scale.as<float>(), kHeads, props.l2_bytes,
                                       stream);
          d->splits = builder_num_splits(B, 1, L, kHeads, kKvHeads, cd, props.sm_count);
          d->workspace = split_workspace(flash_attn::varlen_workspace_bytes(B, kHeads, kHeadSize, d->splits), stream);
          for (auto& a : d->shape.args) {
            a.num_splits = d->splits;
            a.workspace = d->workspace.get();
            a.workspace_bytes = d->workspace.bytes();
          }
          shapes.push_back(std::move(d));
        } catch (const std::exception& e) {
          rec.fail("decode", key, e.what());
          cudaGetLastError();
        }
      }
      if (shapes.empty()) continue;
      // The shape's bf16 and fp8 launches timed in turns (time_interleaved): the SM clock drifts
      // along a run and fp8 follows it, so the fp8/bf16 ratio compares the same seconds.
      std::vector<double> ms;
      try {
        std::vector<TimedLaunch> launches;
        for (const auto& d : shapes) launches.push_back({d->shape.args, d->shape.calls});
        ms = time_interleaved(launches, stream);
      } catch (const std::exception& e) {
        for (const auto& d : shapes) rec.fail("decode", d->key, e.what());
        cudaGetLastError();
        continue;
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        Prepared& d = *shapes[i];
        const DecodeShape& shape = d.shape;
        const double gbps = shape.bytes / ms[i] / 1e6;
        char note[220];
        std::snprintf(note, sizeof note,
                      "CUDA graph of %d calls over %zu KV instances (%.2f GB), builder splits %d, %.0f%% of read BW%s",
                      shape.calls, shape.args.size(), shape.args.size() * shape.kv_bytes / 1e9, d.splits, pct(gbps),
                      shapes.size() > 1 ? "; in turns with the other dtype" : "");
        rec.add({"decode", d.key, "attnkit", "GB/s", gbps, ms[i], note});
      }
      // What the launch options give, same shapes, same run (LaunchTuning, launch_plan.h): K/V
      // stages filled by cp.async instead of TMA, the L2 prefetch before the PDL wait off, then
      // PDL itself off, TMA's K/V boxes of split launches read without the evict-first L2 policy,
      // 2-split launches merged through the workspace instead of the cluster,
      // and the transposed fp8 tile with 3 stages where the launch decision takes 2. Timed in
      // turns with the default launch.
      if (!((B == 1 || B == 16 || B == 64) && (L == 4096 || L == 32768)) && !(B == 256 && L == 4096) &&
          !(B <= 4 && L == 1024))
        continue;
      for (const auto& dp : shapes) {
        Prepared& d = *dp;
        try {
          const bool fp8 = is_fp8(d.shape.args.front().cache.dtype);
          const flash_attn::LaunchPlan plan = flash_attn::choose_launch(flash_attn::varlen_launch_facts(d.shape.args.front()));
          struct Variant {
            const char* name;
            flash_attn::LaunchTuning tuning;
          };
          std::vector<Variant> variants;
          auto add = [&](const char* name, auto&& set) {
            Variant v{name, {}};
            set(v.tuning);
            variants.push_back(v);
          };
          add("cp.async K/V", [](flash_attn::LaunchTuning& t) { t.cp_async_fill = true; });
          add("no L2 prefetch", [](flash_attn::LaunchTuning& t) { t.l2_prefetch = false; });
          add("no PDL", [](flash_attn::LaunchTuning& t) { t.l2_prefetch = t.pdl = false; });
          if (plan.kv_evict_first) add("no L2 policy", [](flash_attn::LaunchTuning& t) { t.kv_evict_first = false; });
          if (plan.cluster_merge) add("workspace merge", [](flash_attn::LaunchTuning& t) { t.cluster_merge = false; });
          if (fp8 && plan.tile == flash_attn::TileId::decode_transposed_two_stage)
            add("3-stage transposed", [](flash_attn::LaunchTuning& t) { t.transposed_stages = 3; });
          std::vector<TimedLaunch> launches = {{d.shape.args, d.shape.calls}};
          for (const Variant& v : variants) launches.push_back({d.shape.args, d.shape.calls, v.tuning});
          const std::vector<double> v_ms = time_interleaved(launches, stream);
          const double g0 = d.shape.bytes / v_ms[0] / 1e6;
          for (size_t v = 0; v < variants.size(); ++v) {
            const double g = d.shape.bytes / v_ms[v + 1] / 1e6;
            char ab[200];
            std::snprintf(ab, sizeof ab, "%s: %.0f%% of read BW, default launch %.0f%% in the same turns (%.4f ms)",
                          variants[v].name, pct(g), pct(g0), v_ms[0]);
            rec.add({"decode-ab", d.key + " " + variants[v].name, "attnkit", "GB/s", g, v_ms[v + 1], ab});
          }
        } catch (const std::exception& e) {
          rec.fail("decode-ab", d.key, e.what());
          cudaGetLastError();
        }
      }
    }
}

}  // namespace attnkit::bench
