// FlashInfer-style decode (section decode-fi): the planned decode (src/flashinfer/gpu_planned.h)
// on the decode bench's shapes (batch 1..256 x KV 1k..32k, 32 / 8 heads, head size 128, bf16, fp8
// and NVFP4 caches), pages of 16 and 128 tokens. Each KV instance of a shape is a page table planned
// by plan_batch into its own device plan; the graph of back-to-back calls rotates over them as
// the decode section does, in turns with the FlashAttention-style launch of the same instances
// (its builder's split count): the ratio column of the section (NVFP4 rows have none: only the
// FlashInfer-style backend reads that cache). Also: the skewed batch (1 x 32k + 63 x 1k), eager
// calls against graph replay at batch 1 x 1k and 16 x 4k. Also: the host plan time of a
// 256-request decode batch (plan_batch alone, median of 201).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
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
#include "flashinfer/gpu_planned.h"

namespace attnkit::bench {

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadSize = 128;

}  // namespace

void run_decode_flashinfer(Recorder& rec, cudaStream_t stream, double read_gbps, bool quick) {
  const auto& props = cuda::current_device_props();
  auto pct = [&](double g) { return read_gbps > 0 ? 100.0 * g / read_gbps : 0.0; };

  // Host plan time: 256 decode requests of 4k keys, pages of 16.
  {
    const flashinfer::PlanConfig cfg = planned_config(kKvHeads, kHeads / kKvHeads, kHeadSize, 16);
    flashinfer::PlanBuffers plan(cfg, flashinfer::PlanCapacity::for_limits(cfg, 256, 256));
    std::vector<int32_t> qo(257), kv(256, 4096);
    for (int r = 0; r <= 256; ++r) qo[r] = r;
    flashinfer::PlanBatch batch{qo, kv, true, -1, -1};
    std::vector<double> us;
    for (int i = 0; i < 201; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      flashinfer::plan_batch(batch, plan);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    rec.add({"decode-fi", "decode-fi host plan b256 kv4096", "attnkit", "us", us[us.size() / 2], us[us.size() / 2] / 1e3,
             "plan_batch of 256 one-token requests (host, median of 201); " + std::to_string(plan.num_items) + " items"});
  }

  DecodeBuffers buf16 = make_decode_buffers(int64_t{36} << 30, int64_t{26} << 30, 256, kHeads, kHeadSize, stream);
  DecodeBuffers buf8 = make_decode_buffers(int64_t{18} << 30, int64_t{8} << 30, 256, kHeads, kHeadSize, stream);
  DecodeBuffers buf4 = make_decode_buffers(int64_t{10} << 30, int64_t{8} << 30, 256, kHeads, kHeadSize, stream);
  if (buf16.pool_bytes <= 0 || buf8.pool_bytes <= 0 || buf4.pool_bytes <= 0) {
    rec.fail("decode-fi", "decode pool", "not enough free device memory");
    return;
  }
  const std::vector<int> batches = quick ? std::vector<int>{1, 16} : std::vector<int>{1, 4, 16, 64, 256};
  const std::vector<int> kv_lens = quick ? std::vector<int>{4096} : std::vector<int>{1024, 4096, 8192, 32768};
  cuda::DeviceBuffer workspace(size_t{1} << 30);  // the split tiles' partials (any plan here fits)
  for (int page : {16, 128})
    for (auto [cd, b] : {std::pair{DType::bf16, &buf16}, std::pair{DType::fp8_e4m3, &buf8}, std::pair{DType::nvfp4, &buf4}}) {
      const KVCacheSpec spec = decode_pool_spec(cd, b->pool_bytes, page, kKvHeads, kHeadSize);
      // (nvfp4: random fp8 codes are valid e2m1 pairs and finite block scales)
      const DType fill = cd == DType::nvfp4 ? DType::fp8_e4m3 : cd;
      fill_random(b->pool.get(), spec.total_bytes() / static_cast<int64_t>(dtype_size(fill)), fill, 43, stream);
      const PagedKV cache = pool_view(spec, b->pool.get());
      const bool fp4 = cd == DType::nvfp4;  // (no FlashAttention-style kernel reads it: no ratio)
      for (int B : batches)
        for (int L : kv_lens) {
          const std::string key = "decode-fi " + std::string(cd == DType::bf16 ? "bf16" : fp4 ? "nvfp4" : "fp8") +
                                  " p" + std::to_string(page) + " b" + std::to_string(B) + " kv" + std::to_string(L);
          if (!key_selected(key)) continue;
          try {
            DecodeShape shape = make_decode_shape(B, L, spec, cache, b->q.get(), b->out.get(),
                                                  cd == DType::bf16 ? nullptr : b->scale.as<float>(), kHeads,
                                                  props.l2_bytes, stream);
            std::vector<std::unique_ptr<PlannedPart>> inst;
            for (size_t i = 0; i < shape.instances.size(); ++i)
              inst.push_back(plan_part(*shape.instances[i], shape.args[i], page, /*ragged=*/false, workspace, stream));
            // The FlashAttention-style launch of the same instances, its builder's split count.
            const int splits = fp4 ? 1 : builder_num_splits(B, 1, L, kHeads, kKvHeads, cd, props.sm_count);
            cuda::DeviceBuffer fa_ws = split_workspace(flash_attn::varlen_workspace_bytes(B, kHeads, kHeadSize, splits), stream);
            for (auto& a : shape.args) {
              a.num_splits = splits;
              a.workspace = fa_ws.get();
              a.workspace_bytes = fa_ws.bytes();
            }
            TimedLaunch fi{shape.args, shape.calls};
            fi.call = [&](int i) {
              inst[i % inst.size()]->run();
            };
            const std::vector<double> ms =
                fp4 ? time_interleaved({fi}, stream) : time_interleaved({fi, TimedLaunch{shape.args, shape.calls}}, stream);
            const double g = shape.bytes / ms[0] / 1e6, g_fa = fp4 ? 0.0 : shape.bytes / ms[1] / 1e6;
            const flashinfer::PlanBuffers& pl = inst.front()->plan;
            char note[260];
            const int n = std::snprintf(note, sizeof note, "%.1f us/call; %.0f%% of read BW; plan: %d items, chunk %lld, %s",
                                        ms[0] * 1e3, pct(g), pl.num_items, static_cast<long long>(pl.kv_chunk_tokens),
                                        pl.split_kv ? "split" : "unsplit");
            if (!fp4)
              std::snprintf(note + n, sizeof note - n, "; FlashAttention-style in the same turns %.1f GB/s (%d splits): %.2fx",
                            g_fa, splits, g / g_fa);
            rec.add({"decode-fi", key, "attnkit", "GB/s", g, ms[0], note});
            // Graph replay against eager calls (the latency-bound shapes).
            if (cd == DType::bf16 && page == 16 && ((B == 1 && L == 1024) || (B == 16 && L == 4096))) {
              const double eager = eager_in_turns({fi.call}, shape.calls, stream)[0];
              char enote[200];
              std::snprintf(enote, sizeof enote, "eager calls (host plan checks + launches each call) %.1f us vs %.1f us per call replayed in a CUDA graph: %.2fx",
                            eager * 1e3, ms[0] * 1e3, eager / ms[0]);
              rec.add({"decode-fi", key + " eager", "attnkit", "us", eager * 1e3, eager, enote});
            }
          } catch (const std::exception& e) {
            rec.fail("decode-fi", key, e.what());
            cudaGetLastError();
          }
        }
    }

  // The skewed batch: one request of 32k keys among 63 of 1k (bf16, pages of 16). The instances
  // are uniform 64 x 32k batches (block tables of 2048 pages per request) whose seqused_k says
  // 32k for request 0 and 1k for the others; the FlashAttention-style launch takes its builder's
  // split count for these lengths.
  const std::string skew_key = "decode-fi bf16 p16 skewed 1x32768+63x1024";
  if (key_selected(skew_key)) {
    try {
      constexpr int kReqs = 64, kLong = 32768, kShort = 1024, kPage = 16;
      const KVCacheSpec spec = decode_pool_spec(DType::bf16, buf16.pool_bytes, kPage, kKvHeads, kHeadSize);
      fill_random(buf16.pool.get(), spec.total_bytes() / 2, DType::bf16, 43, stream);
      const PagedKV cache = pool_view(spec, buf16.pool.get());
      std::vector<int32_t> lens(kReqs, kShort), qo(kReqs + 1);
      lens[0] = kLong;
      for (int r = 0; r <= kReqs; ++r) qo[r] = r;
      const int64_t blocks = int64_t{kReqs} * (kLong / kPage);
      const int n_inst = static_cast<int>(std::min<int64_t>(3, spec.num_blocks / blocks));
      if (n_inst < 1) throw std::runtime_error("pool too small for the skewed batch");
      std::vector<std::unique_ptr<UniformBatch>> batches_u;
      std::vector<flash_attn::VarlenArgs> args;
      std::vector<std::unique_ptr<PlannedPart>> inst;
      for (int i = 0; i < n_inst; ++i) {
        batches_u.push_back(std::make_unique<UniformBatch>(
            make_uniform_batch(kReqs, 1, kLong, kPage, i * blocks, 2000 + i, stream)));
        ATTNKIT_CUDA_CHECK(cudaMemcpy(batches_u.back()->seqused_k.get(), lens.data(), lens.size() * 4,
                                      cudaMemcpyHostToDevice));
        args.push_back(varlen_args(*batches_u.back(), cache, buf16.q.get(), buf16.out.get(), kHeads, kHeadSize, true, stream));
        inst.push_back(plan_part(*batches_u.back(), args.back(), kPage, /*ragged=*/false, workspace, stream));
      }
      flash_attn::SplitKVInput in;
      in.query_start_loc = qo;
      in.seq_lens = lens;
      in.num_heads = kHeads;
      in.num_kv_heads = kKvHeads;
      in.num_sms = props.sm_count;
      in.head_size = kHeadSize;
      in.cc_major = props.cc_major;
      in.hopper_kernels = flash_attn::hopper_kernels_available();
      const int splits = flash_attn::decide_num_splits(in).num_splits;
      cuda::DeviceBuffer fa_ws = split_workspace(flash_attn::varlen_workspace_bytes(kReqs, kHeads, kHeadSize, splits), stream);
      for (auto& a : args) {
        a.num_splits = splits;
        a.workspace = fa_ws.get();
        a.workspace_bytes = fa_ws.bytes();
      }
      double keys = 0;
      for (int32_t l : lens) keys += l;
      const double bytes = keys * kKvHeads * kHeadSize * 2 * 2 + 2.0 * kReqs * kHeads * kHeadSize * 2;
      const int calls = static_cast<int>(std::clamp<int64_t>(std::llround(4.0 / (bytes / 4.0e9)), 3, 256));
      TimedLaunch fi{args, calls};
      fi.call = [&](int i) {
        inst[i % inst.size()]->run();
      };
      const std::vector<double> ms = time_interleaved({fi, TimedLaunch{args, calls}}, stream);
      const double g = bytes / ms[0] / 1e6, g_fa = bytes / ms[1] / 1e6;
      const flashinfer::PlanBuffers& pl = inst.front()->plan;
      char note[260];
      std::snprintf(note, sizeof note,
                    "%.1f us/call; %.0f%% of read BW; plan: %d items, chunk %lld, %s; FlashAttention-style in the "
                    "same turns %.1f GB/s (%d splits): %.2fx",
                    ms[0] * 1e3, pct(g), pl.num_items, static_cast<long long>(pl.kv_chunk_tokens),
                    pl.split_kv ? "split" : "unsplit", g_fa, splits, g / g_fa);
      rec.add({"decode-fi", skew_key, "attnkit", "GB/s", g, ms[0], note});
    } catch (const std::exception& e) {
      rec.fail("decode-fi", skew_key, e.what());
      cudaGetLastError();
    }
  }
}

}  // namespace attnkit::bench
