// FlashInfer-style prefill (section prefill-fi): the planned kernels (src/flashinfer/gpu_planned.h
// run_planned_part, which runs prefill plans too) on the prefill bench's shapes, 16k new
// tokens as 512 x 32 .. 16k x 1, head size 128, 32 / 8 heads, causal and not:
//  - paged (pages of 16 and 128 tokens, the batch's block table as FlashInfer's page table);
//  - ragged (K/V as contiguous rows, read through the contiguous view's page table);
//  - the skewed batch 1 x 16k + 31 x 512 (pages of 16);
// each timed in turns with the FlashAttention-style launch of the same batch (its builder's
// split count; hopper generation where it serves): the ratio column. Also one mixed engine step,
// 64 decodes over 4k keys + 2 chunked prefills of 2k tokens over 8k, through each backend's
// builder and forward (the engine path), eager calls in turns (an engine runs mixed batches
// eagerly; captured in a graph, the FlashInfer-style forward takes its graph-safe launches).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "attention_setup.h"
#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flashinfer/gpu_planned.h"

namespace attnkit::bench {

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadSize = 128, kTokens = 16384;

double causal_flops(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, bool causal) {
  double f = 0;
  for (size_t r = 0; r < kv.size(); ++r) {
    const double q = qo[r + 1] - qo[r];
    f += 4.0 * q * (causal ? kv[r] - q / 2.0 : kv[r]) * kHeadSize * kHeads;
  }
  return f;
}

// The planned part against the FlashAttention-style launch of the same batch, in turns.
void time_pair(Recorder& rec, const std::string& key, const PlannedPart& part, flash_attn::VarlenArgs fa, cudaStream_t stream) {
  const int sms = cuda::current_device_props().sm_count;
  const int max_q = fa.max_query_len;
  fa.num_splits = builder_num_splits(fa.num_reqs, max_q, fa.max_seq_len, kHeads, kKvHeads, DType::bf16, sms, kHeadSize);
  cuda::DeviceBuffer fa_ws = split_workspace(
      flash_attn::varlen_workspace_bytes(fa.q.size(0), kHeads, kHeadSize, fa.num_splits), stream);
  fa.workspace = fa_ws.get();
  fa.workspace_bytes = fa_ws.bytes();
  TimedLaunch fi{{fa}, 1};
  fi.call = [&](int) { part.run(); };
  // (and the FlashAttention-style launch held to the mma_sync generation: the planned part's
  // tile family, which separates the tile's cost from the plan's)
  flash_attn::VarlenArgs fa_mma = fa;
  fa_mma.generation = flash_attn::Generation::mma_sync;
  const std::vector<double> ms = time_interleaved({fi, TimedLaunch{{fa}, 1}, TimedLaunch{{fa_mma}, 1}}, stream);
  const double flops = causal_flops(part.qo, part.kv, fa.params.causal);
  const double t = flops / ms[0] / 1e9, t_fa = flops / ms[1] / 1e9, t_mma = flops / ms[2] / 1e9;
  const flash_attn::LaunchPlan fa_plan = flash_attn::choose_launch(flash_attn::varlen_launch_facts(fa));
  char note[400];
  std::snprintf(note, sizeof note,
                "plan: tile_q %d, %d items, chunk %lld, %s; FlashAttention-style on mma_sync %.0f TFLOP/s (%.2fx); "
                "FlashAttention-style in the same turns %.0f TFLOP/s (%s, %d splits): %.2fx",
                part.plan.tile_q, part.plan.num_items, static_cast<long long>(part.plan.kv_chunk_tokens),
                part.plan.split_kv ? "split" : "unsplit", t_mma, t / t_mma, t_fa,
                fa_plan.generation == flash_attn::Generation::hopper ? "hopper" : "mma_sync", fa.num_splits, t / t_fa);
  rec.add({"prefill-fi", key, "attnkit", "TFLOP/s", t, ms[0], note});
}

// One engine step through a backend's builder and forward: `q_lens` new tokens over `kv_lens`
// keys (decodes first), the cache [num_blocks, 2, 16, kv heads, head size] bf16.
struct EngineStep {
  AttentionConfig cfg;
  CommonAttentionMetadata common;
  std::vector<cuda::DeviceBuffer> dev;  // the metadata's device copies
  TensorView q, out, cache;
};

TensorView upload_i32(std::vector<cuda::DeviceBuffer>& keep, const std::vector<int32_t>& h) {
  keep.emplace_back(std::max<size_t>(h.size() * 4, 16));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(keep.back().get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return TensorView(keep.back().get(), DType::i32, {static_cast<int64_t>(h.size())}, Device::CUDA);
}

}  // namespace

void run_prefill_flashinfer(Recorder& rec, cudaStream_t stream, bool quick) {
  const int64_t qo_bytes = int64_t{2 * kTokens} * kHeads * kHeadSize * 2;
  cuda::DeviceBuffer q(qo_bytes), out(qo_bytes), workspace(size_t{1} << 30);
  fill_random(q.get(), qo_bytes / 2, DType::bf16, 31, stream);
  // Paged: one batch of 16k tokens per shape over a pool of 16k tokens' blocks.
  for (int page : {16, 128}) {
    KVCacheSpec spec;
    spec.block_size = page;
    spec.num_blocks = kTokens / page;
    spec.num_kv_heads = kKvHeads;
    spec.head_size = kHeadSize;
    cuda::DeviceBuffer pool(spec.total_bytes());
    fill_random(pool.get(), spec.total_bytes() / 2, DType::bf16, 32, stream);
    const PagedKV cache = pool_view(spec, pool.get());
    for (bool causal : {true, false})
      for (int seqlen = 512; seqlen <= kTokens; seqlen *= 2) {
        if (quick && seqlen != 512 && seqlen != kTokens) continue;
        const int batch = kTokens / seqlen;
        const std::string key = "prefill-fi paged p" + std::to_string(page) + prefill_key(kHeadSize, kHeads, kKvHeads, causal, seqlen, batch).substr(7);
        if (!key_selected(key)) continue;
        try {
          const UniformBatch b = make_uniform_batch(batch, seqlen, seqlen, page, 0, seqlen + page, stream);
          const flash_attn::VarlenArgs a = varlen_args(b, cache, q.get(), out.get(), kHeads, kHeadSize, causal, stream);
          time_pair(rec, key, *plan_part(b, a, page, false, workspace, stream), a, stream);
        } catch (const std::exception& e) {
          rec.fail("prefill-fi", key, e.what());
          cudaGetLastError();
        }
      }
  }
  // Ragged: K/V as contiguous rows [16k, 8, 128] (keys are the new tokens).
  {
    const int64_t rows_bytes = int64_t{kTokens} * kKvHeads * kHeadSize * 2;
    cuda::DeviceBuffer k_rows(rows_bytes), v_rows(rows_bytes);
    fill_random(k_rows.get(), rows_bytes / 2, DType::bf16, 33, stream);
    fill_random(v_rows.get(), rows_bytes / 2, DType::bf16, 34, stream);
    const PagedKV rows = flash_attn::contiguous_kv_view(
        TensorView(k_rows.get(), DType::bf16, {kTokens, kKvHeads, kHeadSize}, Device::CUDA),
        TensorView(v_rows.get(), DType::bf16, {kTokens, kKvHeads, kHeadSize}, Device::CUDA));
    for (bool causal : {true, false})
      for (int seqlen = 512; seqlen <= kTokens; seqlen *= 2) {
        if (quick && seqlen != 512 && seqlen != kTokens) continue;
        const int batch = kTokens / seqlen;
        const std::string key = "prefill-fi ragged" + prefill_key(kHeadSize, kHeads, kKvHeads, causal, seqlen, batch).substr(7);
        if (!key_selected(key)) continue;
        try {
          const UniformBatch b = make_uniform_batch(batch, seqlen, seqlen, 16, 0, seqlen + 3, stream);
          flash_attn::VarlenArgs a = varlen_args(b, rows, q.get(), out.get(), kHeads, kHeadSize, causal, stream);
          const std::unique_ptr<PlannedPart> part = plan_part(b, a, 16, true, workspace, stream);
          a.cu_seqlens_k = b.cu_seqlens_q.as<const int32_t>();  // (q_len == kv_len: the same offsets)
          a.block_table = nullptr;
          a.max_blocks_per_req = 0;
          time_pair(rec, key, *part, a, stream);
        } catch (const std::exception& e) {
          rec.fail("prefill-fi", key, e.what());
          cudaGetLastError();
        }
      }
  }
  // The skewed batch: one 16k prompt among 31 of 512 tokens (fresh prefills, causal, pages of
  // 16): a uniform 32 x 16k batch's block table whose lengths say 16k for request 0, 512 for
  // the others.
  const std::string skew_key = "prefill-fi skewed p16 d128 h32/8 causal 1x16384+31x512";
  if (key_selected(skew_key)) {
    try {
      constexpr int kReqs = 32, kLong = 16384, kShort = 512;
      KVCacheSpec spec;
      spec.block_size = 16;
      spec.num_blocks = int64_t{kReqs} * kLong / 16;
      spec.num_kv_heads = kKvHeads;
      spec.head_size = kHeadSize;
      cuda::DeviceBuffer pool(spec.total_bytes());
      fill_random(pool.get(), spec.total_bytes() / 2, DType::bf16, 35, stream);
      const PagedKV cache = pool_view(spec, pool.get());
      UniformBatch b = make_uniform_batch(kReqs, kLong, kLong, 16, 0, 91, stream);
      std::vector<int32_t> lens(kReqs, kShort), qo{0};
      lens[0] = kLong;
      for (int32_t l : lens) qo.push_back(qo.back() + l);
      ATTNKIT_CUDA_CHECK(cudaMemcpy(b.seqused_k.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
      ATTNKIT_CUDA_CHECK(cudaMemcpy(b.cu_seqlens_q.get(), qo.data(), qo.size() * 4, cudaMemcpyHostToDevice));
      flash_attn::VarlenArgs a = varlen_args(b, cache, q.get(), out.get(), kHeads, kHeadSize, true, stream);
      a.q.shape[0] = a.out.shape[0] = qo.back();
      time_pair(rec, skew_key, *plan_part(b, a, 16, false, workspace, stream), a, stream);
    } catch (const std::exception& e) {
      rec.fail("prefill-fi", skew_key, e.what());
      cudaGetLastError();
    }
  }
  // One mixed engine step through each backend's builder and forward, in turns.
  const std::string step_key = "prefill-fi engine step 64x(1 over 4096) + 2x(2048 over 8192)";
  if (key_selected(step_key)) {
    try {
      EngineStep s;
      s.cfg.num_heads = kHeads;
      s.cfg.num_kv_heads = kKvHeads;
      s.cfg.head_size = kHeadSize;
      s.cfg.device = cuda_device_spec(0);
      std::vector<int32_t> q_lens(64, 1), kv_lens(64, 4096);
      q_lens.insert(q_lens.end(), {2048, 2048});
      kv_lens.insert(kv_lens.end(), {8192, 8192});
      CommonAttentionMetadata& c = s.common;
      c.max_blocks_per_req = 8192 / 16;
      c.query_start_loc = {0};
      int32_t next_block = 0;
      for (size_t r = 0; r < q_lens.size(); ++r) {
        c.query_start_loc.push_back(c.query_start_loc.back() + q_lens[r]);
        c.seq_lens.push_back(kv_lens[r]);
        for (int j = 0; j < c.max_blocks_per_req; ++j)
          c.block_table.push_back(j * 16 < kv_lens[r] ? next_block++ : 0);
        for (int t = kv_lens[r] - q_lens[r]; t < kv_lens[r]; ++t)
          c.slot_mapping.push_back(int64_t{c.block_table[r * c.max_blocks_per_req + t / 16]} * 16 + t % 16);
      }
      c.finalize();
      c.query_start_loc_dev = upload_i32(s.dev, c.query_start_loc);
      c.seq_lens_dev = upload_i32(s.dev, c.seq_lens);
      c.block_table_dev = TensorView(upload_i32(s.dev, c.block_table).data, DType::i32,
                                     {c.num_reqs, c.max_blocks_per_req}, Device::CUDA);
      s.dev.emplace_back(c.slot_mapping.size() * 8);
      ATTNKIT_CUDA_CHECK(cudaMemcpy(s.dev.back().get(), c.slot_mapping.data(), c.slot_mapping.size() * 8,
                                    cudaMemcpyHostToDevice));
      c.slot_mapping_dev = TensorView(s.dev.back().get(), DType::i64, {static_cast<int64_t>(c.slot_mapping.size())}, Device::CUDA);
      const int64_t blocks = next_block + 1;
      cuda::DeviceBuffer cache(static_cast<size_t>(blocks) * 2 * 16 * kKvHeads * kHeadSize * 2);
      fill_random(cache.get(), static_cast<int64_t>(cache.bytes() / 2), DType::bf16, 36, stream);
      const int64_t T = c.num_actual_tokens;
      s.q = TensorView(q.get(), DType::bf16, {T, kHeads, kHeadSize}, Device::CUDA);
      s.out = TensorView(out.get(), DType::bf16, {T, kHeads, kHeadSize}, Device::CUDA);
      s.cache = TensorView(cache.get(), DType::bf16, {blocks, 2, 16, kKvHeads, kHeadSize}, Device::CUDA);
      std::vector<std::function<void(int)>> launches;
      std::vector<std::unique_ptr<BackendMetadata>> mds;
      std::vector<std::unique_ptr<AttentionImpl>> impls;
      for (const char* name : {"flashinfer", "flash_attn"}) {
        const AttentionBackend& be = backend(name);
        auto builder = be.make_builder(s.cfg);
        if (const size_t plans = builder->device_buffer_bytes(); plans > 0) {  // (the caller's, as the workspace)
          s.dev.emplace_back(plans);
          builder->set_device_buffer(s.dev.back().get(), s.dev.back().bytes());
        }
        mds.push_back(builder->build(c));
        impls.push_back(be.make_impl(s.cfg));
        AttentionImpl* impl = impls.back().get();
        const BackendMetadata* md = mds.back().get();
        s.dev.emplace_back(std::max<size_t>(impl->workspace_bytes_for(*md), 16));  // (the caller's)
        impl->set_workspace(s.dev.back().get(), s.dev.back().bytes());
        AttentionParams params;
        params.causal = true;
        launches.push_back(
            [&s, impl, md, params, stream](int) { impl->forward(s.q, {}, {}, s.cache, *md, params, s.out, stream); });
      }
      const std::vector<double> ms = eager_in_turns(launches, 10, stream);
      const double flops = causal_flops(c.query_start_loc, c.seq_lens, true);
      char note[200];
      std::snprintf(note, sizeof note, "eager forwards: %.1f us per forward; flash_attn's forward in the same turns %.1f us: %.2fx",
                    ms[0] * 1e3, ms[1] * 1e3, ms[1] / ms[0]);
      rec.add({"prefill-fi", step_key, "attnkit", "TFLOP/s", flops / ms[0] / 1e9, ms[0], note});
    } catch (const std::exception& e) {
      rec.fail("prefill-fi", step_key, e.what());
      cudaGetLastError();
    }
  }
}

}  // namespace attnkit::bench
