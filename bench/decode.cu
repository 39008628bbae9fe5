// Decode throughput: batch 1..256 x KV 1k..32k, 32 query heads over 8 KV heads, head size 128,
// block 16, bf16 and fp8 e4m3 caches. Each shape is timed as a CUDA graph of back-to-back
// run_varlen_attention calls (launch gaps hidden) rotating over R distinct KV instances (other
// blocks of one pool, shuffled) whose total is >= 8x the L2, so every call reads from HBM.
// GB/s counts the bytes a decode must move: its K/V rows, q and out. The fraction is of the
// read-only ceiling measured in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
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
  // One pool per cache dtype, so that each shape's bf16 and fp8 rows run back to back (the
  // fp8/bf16 ratio then compares the same minute of the run, not two ends of the section). The
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
  for (int B : batches)
    for (int L : kv_lens)
      for (const Pool& pool : pools) {
        const DType cd = pool.dtype;
        const KVCacheSpec& spec = pool.spec;
        const PagedKV& cache = pool.cache;
        DecodeBuffers& buf = *pool.buf;  // (q / out / scale of this pool)
        const std::string key = "decode " + std::string(cd == DType::bf16 ? "bf16" : "fp8") + " b" +
                                std::to_string(B) + " kv" + std::to_string(L);
        if (!key_selected(key)) continue;
        try {
          DecodeShape shape = make_decode_shape(B, L, spec, cache, buf.q.get(), buf.out.get(),
                                                cd == DType::bf16 ? nullptr : buf.scale.as<float>(), kHeads,
                                                props.l2_bytes, stream);
          const int splits = builder_num_splits(B, 1, L, kHeads, kKvHeads, cd, props.sm_count);
          cuda::DeviceBuffer workspace =
              split_workspace(flash_attn::varlen_workspace_bytes(B, kHeads, kHeadSize, splits), stream);
          for (auto& a : shape.args) {
            a.num_splits = splits;
            a.workspace = workspace.get();
            a.workspace_bytes = workspace.bytes();
          }
          const GraphTiming t = time_rotating(shape.args, shape.calls, stream);
          const double gbps = shape.bytes / t.ms_per_call / 1e6;
          auto pct = [&](double g) { return read_gbps > 0 ? 100.0 * g / read_gbps : 0.0; };
          char note[200];
          std::snprintf(note, sizeof note, "%s of %d calls over %zu KV instances (%.2f GB), builder splits %d, %.0f%% of read BW",
                        t.graph ? "CUDA graph" : "eager launches", shape.calls, shape.args.size(),
                        shape.args.size() * shape.kv_bytes / 1e9, splits, pct(gbps));
          rec.add({"decode", key, "attnkit", "GB/s", gbps, t.ms_per_call, note});
          // What the launch options give, same shapes, same run: K/V stages filled by cp.async or by
          // TMA on every grid (kv_fill; the default picks by grid size), split merge through the
          // workspace instead of the cluster, the L2 prefetch before the PDL wait off, then PDL
          // itself off (VarlenArgs::cluster_split_merge / l2_prefetch / enable_pdl). Timed in
          // turns with the default launch (time_interleaved): the ratios are free of clock drift.
          if ((B == 1 || B == 16 || B == 64) && (L == 4096 || L == 32768)) {
            using flash_attn::KvFill;
            using Variant = std::tuple<const char*, bool, bool, bool, KvFill>;  // name, L2 prefetch, PDL, cluster merge, K/V fill
            std::vector<Variant> variants;
            for (const Variant& v :
                 {Variant{"cp.async K/V", true, true, true, KvFill::cp_async}, Variant{"TMA K/V", true, true, true, KvFill::tma},
                  Variant{"workspace merge", true, true, false, KvFill::automatic},
                  Variant{"no L2 prefetch", false, true, true, KvFill::automatic},
                  Variant{"no PDL", false, false, true, KvFill::automatic}})
              if (std::get<3>(v) || splits > 1) variants.push_back(v);
            std::vector<std::vector<flash_attn::VarlenArgs>> configs = {shape.args};
            for (const auto& [name, prefetch, pdl, cluster, fill] : variants) {
              configs.push_back(shape.args);
              for (auto& a : configs.back()) {
                a.l2_prefetch = prefetch;
                a.enable_pdl = pdl;
                a.cluster_split_merge = cluster;
                a.kv_fill = fill;
              }
            }
            const std::vector<double> ms = time_interleaved(configs, shape.calls, stream);
            const double g0 = shape.bytes / ms[0] / 1e6;
            for (size_t v = 0; v < variants.size(); ++v) {
              const double g = shape.bytes / ms[v + 1] / 1e6;
              char ab[200];
              std::snprintf(ab, sizeof ab, "%s: %.0f%% of read BW, default launch %.0f%% in the same turns (%.4f ms)",
                            std::get<0>(variants[v]), pct(g), pct(g0), ms[0]);
              rec.add({"decode-ab", key + " " + std::get<0>(variants[v]), "attnkit", "GB/s", g, ms[v + 1], ab});
            }
          }
        } catch (const std::exception& e) {
          rec.fail("decode", key, e.what());
          cudaGetLastError();
        }
      }
}

}  // namespace attnkit::bench
