// Prefill throughput: 16k new tokens per batch as seqlen 512..16k (batch = 16k / seqlen), 32
// query heads with 8 KV heads (GQA) and 32 (MHA), head sizes 64/128/192/256, causal and not, bf16;
// head sizes 80/96/112/512 GQA causal.
// Ours reads K/V from a paged cache (block 16, blocks shuffled) through run_varlen_attention;
// FLOPs = 4 * tokens * seqlen * head_size * heads, halved for causal (the FlashAttention
// convention, which bench/peers.py uses too). Keys match bench/peers.py's. Section
// prefill-grid: head size 128 causal shapes again with the hopper launch forced persistent and
// forced one CTA per item, and with one and two Q buffers, and the output rows by TMA stores
// against the threads' copy; the hopper-served causal shapes at 192 / 256 with the mma_sync
// tile in turns with the hopper kernel: the data behind the launcher's choices.
// Section prefill-contig: the head size 128, 32/8 heads shapes with K/V as contiguous rows
// [16k tokens, 8, 128] (cu_seqlens_k, no block table) next to the paged rows above.
// Section prefill-fp8: the GQA causal shapes at head sizes 64..256 with an fp8 e4m3 cache, in
// turns with the bf16 cache, with the fp8 cache on the mma_sync kernel and with the same cache
// read as e5m2.
// Section prefill-split: short chunked prefills over long contexts (head size 128, 32/8 heads),
// where the split rule may split, timed at forced split counts next to the rule's, each on the
// launch rule's kernel in turns with the mma_sync one (eager calls: the hopper split launch's
// combine kernel included).
#include <cuda_runtime.h>

#include <climits>
#include <cstdio>
#include <functional>
#include <algorithm>
#include <utility>
#include <string>
#include <vector>

#include "attention_setup.h"
#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flash_attn/generation.h"
#include "flash_attn/hopper_traits.h"

namespace attnkit::bench {

std::string prefill_key(int head_size, int hq, int hkv, bool causal, int seqlen, int batch) {
  return "prefill d" + std::to_string(head_size) + " h" + std::to_string(hq) + "/" +
         std::to_string(hkv) + (causal ? " causal" : " full") + " s" + std::to_string(seqlen) +
         "x" + std::to_string(batch);
}

void run_prefill(Recorder& rec, cudaStream_t stream, bool quick) {
  constexpr int kTokens = 16384, kHeads = 32, kBlock = 16;
  const int max_hd = quick ? 128 : 512;
  const int64_t qo_bytes = int64_t{kTokens} * kHeads * max_hd * 2;
  KVCacheSpec max_spec;
  max_spec.num_blocks = kTokens / kBlock;
  max_spec.block_size = kBlock;
  max_spec.num_kv_heads = kHeads;
  max_spec.head_size = max_hd;
  cuda::DeviceBuffer q(qo_bytes), out(qo_bytes), pool(max_spec.total_bytes());
  fill_random(q.get(), qo_bytes / 2, DType::bf16, 21, stream);
  fill_random(pool.get(), max_spec.total_bytes() / 2, DType::bf16, 22, stream);
  // 80 / 96 / 112: the head sizes of Phi-2 / StableLM, Phi-3, and one padded to 128 (GQA causal
  // only: their rows are for the padding-cost targets); 512 (GQA causal).
  const std::vector<int> head_sizes =
      quick ? std::vector<int>{128} : std::vector<int>{64, 80, 96, 112, 128, 192, 256, 512};
  for (int hd : head_sizes)
    for (int hkv : {8, 32})
      for (bool causal : {true, false}) {
        if ((quick || hd % 64 != 0 || hd > 256) && (hkv != 8 || !causal)) continue;
        KVCacheSpec spec = max_spec;
        spec.num_kv_heads = hkv;
        spec.head_size = hd;
        const PagedKV cache = pool_view(spec, pool.get());
        for (int seqlen = 512; seqlen <= kTokens; seqlen *= 2) {
          const int batch = kTokens / seqlen;
          const std::string key = prefill_key(hd, kHeads, hkv, causal, seqlen, batch);
          if (!key_selected(key)) continue;
          try {
            const UniformBatch b = make_uniform_batch(batch, seqlen, seqlen, kBlock, 0, seqlen + hd, stream);
            flash_attn::VarlenArgs args = varlen_args(b, cache, q.get(), out.get(), kHeads, hd, causal, stream);
            // The builder's split-KV rule (it splits only when the q tiles leave SMs idle).
            args.num_splits = builder_num_splits(batch, seqlen, seqlen, kHeads, hkv, DType::bf16,
                                                 cuda::current_device_props().sm_count, hd);
            cuda::DeviceBuffer workspace =
                split_workspace(flash_attn::varlen_workspace_bytes(kTokens, kHeads, hd, args.num_splits), stream);
            args.workspace = workspace.get();
            args.workspace_bytes = workspace.bytes();
            const double ms = time_ms([&] { flash_attn::run_varlen_attention(args); }, stream, 1, 5);
            ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
            const double flops = 4.0 * kTokens * seqlen * hd * kHeads * (causal ? 0.5 : 1.0);
            rec.add({"prefill", key, "attnkit", "TFLOP/s", flops / ms / 1e9, ms,
                     "paged KV, block 16" + (args.num_splits > 1 ? ", splits " + std::to_string(args.num_splits) : std::string())});
            // Two launches of this shape in turns (3 rounds of eager calls, medians), a prefill-grid
            // row each: "<what> <key> <a>" with a's note, the ratio b / a and a's note suffix, and
            // "<what> <key> <b>" with b's note.
            auto in_turns = [&](const std::string& what, const char* a, const std::function<void()>& run_a,
                                const std::string& a_note, const std::string& a_suffix, const char* b,
                                const std::function<void()>& run_b, const std::string& b_note) {
              const std::vector<double> t = eager_in_turns({[&](int) { run_a(); }, [&](int) { run_b(); }}, 3, stream);
              char ratio[32];
              std::snprintf(ratio, sizeof ratio, "%.3fx", t[1] / t[0]);
              rec.add({"prefill-grid", what + " " + key + " " + a, "attnkit", "TFLOP/s", flops / t[0] / 1e9, t[0],
                       a_note + ratio + a_suffix});
              rec.add({"prefill-grid", what + " " + key + " " + b, "attnkit", "TFLOP/s", flops / t[1] / 1e9, t[1], b_note});
            };
            // The hopper launcher's choices, each way in the same run: one CTA per SM looping
            // over the items vs one CTA per item, and (up to 4k keys, persistent) two vs one Q
            // buffers in turns (64 .. 192); the output rows by TMA stores vs the threads' copy;
            // (the mma_sync generation in turns with it: below).
            if (hd % 64 == 0 && hd <= 256 && causal && args.num_splits == 1 && flash_attn::hopper_kernels_available() &&
                flash_attn::choose_launch(flash_attn::varlen_launch_facts(args)).generation ==
                    flash_attn::Generation::hopper) {
              const int sms = cuda::current_device_props().sm_count;
              struct GridChoice {
                const char* name;
                int ctas;
              };
              for (const auto& [name, ctas] : {GridChoice{"persistent", sms}, GridChoice{"per-item", INT_MAX}}) {
                flash_attn::LaunchTuning tuning;
                tuning.max_ctas = ctas;
                const double t = time_ms([&] { flash_attn::run_varlen_attention(args, tuning); }, stream, 1, 5);
                rec.add({"prefill-grid", "hopper grid " + key + " " + name, "attnkit", "TFLOP/s", flops / t / 1e9, t,
                         std::string(name) + " launch (LaunchTuning::max_ctas " + std::to_string(ctas) + ")"});
              }
              if (hd != 256 && seqlen <= 4096) {  // (persistent up to 4k keys; no second Q buffer at 256)
                flash_attn::LaunchTuning two_q, one_q;
                two_q.max_ctas = one_q.max_ctas = sms;
                two_q.q_buffers = 2;
                one_q.q_buffers = 1;
                in_turns("q buffers", "two", [&] { flash_attn::run_varlen_attention(args, two_q); },
                         "persistent, two Q buffers (LaunchTuning::q_buffers 2), in turns with one: one / two time ", "",
                         "one", [&] { flash_attn::run_varlen_attention(args, one_q); },
                         "persistent, one Q buffer (LaunchTuning::q_buffers 1)");
              }
              if (flash_attn::choose_launch(flash_attn::varlen_launch_facts(args)).tma_output) {
                flash_attn::LaunchTuning threads;
                threads.thread_output = true;
                in_turns("hopper output", "tma", [&] { flash_attn::run_varlen_attention(args); },
                         "output rows by TMA stores (the rule's), in turns with the threads' copy: threads / TMA ", "",
                         "threads", [&] { flash_attn::run_varlen_attention(args, threads); },
                         "output rows copied by the threads (LaunchTuning::thread_output)");
              }
            }
            // The launches the hopper kernel took over from the mma_sync prefill tile (head dims
            // 192 / 256, and 72 .. 96 padded to its 128: tile_head_dim), in turns with that tile.
            if (causal && hkv == 8 && args.num_splits == 1 && hd <= 256 && (hd >= 192 || hd % 64 != 0) &&
                flash_attn::hopper_kernels_available() &&
                flash_attn::choose_launch(flash_attn::varlen_launch_facts(args)).generation ==
                    flash_attn::Generation::hopper) {
              flash_attn::VarlenArgs mma = args;
              mma.generation = flash_attn::Generation::mma_sync;
              in_turns("generation", "hopper", [&] { flash_attn::run_varlen_attention(args); },
                       "the launch rule's hopper kernel, in turns with mma_sync: mma_sync / hopper ", "", "mma_sync",
                       [&] { flash_attn::run_varlen_attention(mma); }, "the mma_sync prefill tile (VarlenArgs::generation)");
            }
            // Head dim 64: two and three consumer warpgroups (128- and 192-row tiles) at the
            // rule's CTA count, in turns, causal and not, and for causal shapes of <= 4k keys three
            // per item against three persistent: the data behind hopper_wide's rule.
            if (hd == 64 && args.num_splits == 1 && flash_attn::hopper_kernels_available() &&
                flash_attn::choose_launch(flash_attn::varlen_launch_facts(args)).generation ==
                    flash_attn::Generation::hopper) {
              flash_attn::LaunchTuning two, three;
              two.consumer_groups = 2;
              three.consumer_groups = 3;
              const std::string rule = flash_attn::choose_launch(flash_attn::varlen_launch_facts(args)).config.name;
              in_turns("warpgroups", "three", [&] { flash_attn::run_varlen_attention(args, three); },
                       "three consumer warpgroups, 192 rows (LaunchTuning::consumer_groups 3), in turns with two: "
                       "two / three time ",
                       "; the rule's tile: " + rule, "two", [&] { flash_attn::run_varlen_attention(args, two); },
                       "two consumer warpgroups, 128 rows (LaunchTuning::consumer_groups 2)");
              if (causal && seqlen <= 4096) {  // (the rule's keys for a persistent launch)
                flash_attn::LaunchTuning three_walk = three;
                three_walk.max_ctas = cuda::current_device_props().sm_count;
                in_turns("warpgroups", "three per-item", [&] { flash_attn::run_varlen_attention(args, three); },
                         "three consumer warpgroups, one CTA per item (causal), in turns with the persistent walk: "
                         "persistent / per-item time ",
                         "", "three persistent", [&] { flash_attn::run_varlen_attention(args, three_walk); },
                         "three consumer warpgroups, one CTA per SM walking the items (LaunchTuning::max_ctas)");
              }
            }
          } catch (const std::exception& e) {
            rec.fail("prefill", key, e.what());
            cudaGetLastError();
          }
        }
      }

  // Contiguous K/V (fresh prefills: keys are the new tokens, cu_seqlens_k = cu_seqlens_q).
  {
    constexpr int kContigKv = 8, kContigHd = 128;
    const int64_t rows_bytes = int64_t{kTokens} * kContigKv * kContigHd * 2;
    cuda::DeviceBuffer k_rows(rows_bytes), v_rows(rows_bytes);
    fill_random(k_rows.get(), rows_bytes / 2, DType::bf16, 23, stream);
    fill_random(v_rows.get(), rows_bytes / 2, DType::bf16, 24, stream);
    const TensorView kt(k_rows.get(), DType::bf16, {kTokens, kContigKv, kContigHd}, Device::CUDA);
    const TensorView vt(v_rows.get(), DType::bf16, {kTokens, kContigKv, kContigHd}, Device::CUDA);
    const PagedKV rows = flash_attn::contiguous_kv_view(kt, vt);
    for (bool causal : {true, false})
      for (int seqlen = 512; seqlen <= kTokens; seqlen *= 2) {
        const int batch = kTokens / seqlen;
        const std::string key = "prefill-contig" + prefill_key(kContigHd, kHeads, kContigKv, causal, seqlen, batch).substr(7);
        if (!key_selected(key)) continue;
        try {
          const UniformBatch b = make_uniform_batch(batch, seqlen, seqlen, kBlock, 0, seqlen + 7, stream);
          flash_attn::VarlenArgs args = varlen_args(b, rows, q.get(), out.get(), kHeads, kContigHd, causal, stream);
          args.cu_seqlens_k = b.cu_seqlens_q.as<const int32_t>();  // (q_len == kv_len: the same offsets)
          args.block_table = nullptr;
          args.max_blocks_per_req = 0;
          const double ms = time_ms([&] { flash_attn::run_varlen_attention(args); }, stream, 1, 5);
          ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
          const double flops = 4.0 * kTokens * seqlen * kContigHd * kHeads * (causal ? 0.5 : 1.0);
          rec.add({"prefill-contig", key, "attnkit", "TFLOP/s", flops / ms / 1e9, ms,
                   "contiguous K/V rows (cu_seqlens_k), no block table; the paged row of the same shape is in "
                   "section prefill"});
        } catch (const std::exception& e) {
          rec.fail("prefill-contig", key, e.what());
          cudaGetLastError();
        }
      }
  }

  // fp8 e4m3 caches (per-tensor scales): the GQA causal shapes at head sizes 64 / 128 / 192 / 256,
  // the launch rule's kernel on the fp8 cache in turns with the bf16 cache of the same shape and
  // with the mma_sync kernel on the fp8 cache (the generation fp8 prefills ran on before).
  {
    constexpr int kFp8Kv = 8;
    KVCacheSpec fspec = max_spec;
    fspec.num_kv_heads = kFp8Kv;
    fspec.head_size = quick ? 128 : 256;
    fspec.cache_dtype = DType::fp8_e4m3;
    cuda::DeviceBuffer fpool(fspec.total_bytes()), scale(4);
    fill_random(fpool.get(), fspec.total_bytes(), DType::fp8_e4m3, 25, stream);
    const float one = 1.f;
    ATTNKIT_CUDA_CHECK(cudaMemcpy(scale.get(), &one, 4, cudaMemcpyHostToDevice));
    for (int hd : quick ? std::vector<int>{128} : std::vector<int>{64, 128, 192, 256})
      for (int seqlen = 512; seqlen <= kTokens; seqlen *= 2) {
        const int batch = kTokens / seqlen;
        const std::string key = "prefill-fp8 " + prefill_key(hd, kHeads, kFp8Kv, true, seqlen, batch).substr(8);
        if (!key_selected(key)) continue;
        try {
          KVCacheSpec s16 = max_spec, s8 = fspec;
          s16.num_kv_heads = kFp8Kv;
          s16.head_size = s8.head_size = hd;
          const UniformBatch b = make_uniform_batch(batch, seqlen, seqlen, kBlock, 0, seqlen + hd, stream);
          const flash_attn::VarlenArgs b16 =
              varlen_args(b, pool_view(s16, pool.get()), q.get(), out.get(), kHeads, hd, true, stream);
          flash_attn::VarlenArgs f8 = varlen_args(b, pool_view(s8, fpool.get()), q.get(), out.get(), kHeads, hd, true, stream);
          f8.params.k_scale = f8.params.v_scale = TensorView(scale.get(), DType::f32, {1}, Device::CUDA);
          flash_attn::VarlenArgs f8_mma = f8;
          f8_mma.generation = flash_attn::Generation::mma_sync;
          // The same codes read as e5m2 (a byte move per value, where e4m3 takes a conversion
          // instruction): what the e4m3 conversion costs.
          KVCacheSpec s5 = s8;
          s5.cache_dtype = DType::fp8_e5m2;
          flash_attn::VarlenArgs f5 = varlen_args(b, pool_view(s5, fpool.get()), q.get(), out.get(), kHeads, hd, true, stream);
          f5.params.k_scale = f5.params.v_scale = f8.params.k_scale;
          const std::vector<double> t = eager_in_turns({[&](int) { flash_attn::run_varlen_attention(f8); },
                                                        [&](int) { flash_attn::run_varlen_attention(b16); },
                                                        [&](int) { flash_attn::run_varlen_attention(f8_mma); },
                                                        [&](int) { flash_attn::run_varlen_attention(f5); }},
                                                       3, stream);
          const double flops = 4.0 * kTokens * seqlen * hd * kHeads * 0.5;
          const auto plan = flash_attn::choose_launch(flash_attn::varlen_launch_facts(f8));
          char ratio[96];
          std::snprintf(ratio, sizeof ratio, "in turns: bf16 / fp8 time %.3fx, mma_sync fp8 / fp8 %.3fx", t[1] / t[0],
                        t[2] / t[0]);
          rec.add({"prefill-fp8", key + " fp8", "attnkit", "TFLOP/s", flops / t[0] / 1e9, t[0],
                   "fp8 e4m3 cache, block 16, " + std::string(flash_attn::generation_name(plan.generation)) + " " +
                       plan.config.name + "; " + ratio});
          rec.add({"prefill-fp8", key + " bf16", "attnkit", "TFLOP/s", flops / t[1] / 1e9, t[1], "bf16 cache, block 16"});
          rec.add({"prefill-fp8", key + " fp8 mma_sync", "attnkit", "TFLOP/s", flops / t[2] / 1e9, t[2],
                   "fp8 e4m3 cache on the mma_sync prefill tile (VarlenArgs::generation)"});
          rec.add({"prefill-fp8", key + " fp8 e5m2", "attnkit", "TFLOP/s", flops / t[3] / 1e9, t[3],
                   "the same cache read as fp8 e5m2, the launch rule's kernel"});
        } catch (const std::exception& e) {
          rec.fail("prefill-fp8", key, e.what());
          cudaGetLastError();
        }
      }
  }

  // Chunked prefills whose work items leave SMs idle: the split rule's count against forced ones.
  struct Chunk {
    int reqs, q_len, kv_len;
  };
  constexpr int kSplitHd = 128, kSplitKv = 8;
  KVCacheSpec spec = max_spec;
  spec.num_kv_heads = kSplitKv;
  spec.head_size = kSplitHd;
  const PagedKV cache = pool_view(spec, pool.get());
  for (const Chunk& c : {Chunk{1, 128, 8192}, Chunk{2, 64, 8192}, Chunk{4, 32, 4096}, Chunk{1, 512, 16384},
                         Chunk{1, 16, 16384}, Chunk{2, 16, 8192}}) {
    const std::string key = "prefill-split d128 h32/8 causal q" + std::to_string(c.q_len) + "x" + std::to_string(c.reqs) +
                            " kv" + std::to_string(c.kv_len);
    if (!key_selected(key)) continue;
    try {
      const UniformBatch b = make_uniform_batch(c.reqs, c.q_len, c.kv_len, kBlock, 0, 77 + c.q_len, stream);
      flash_attn::VarlenArgs args = varlen_args(b, cache, q.get(), out.get(), kHeads, kSplitHd, true, stream);
      const int rule = builder_num_splits(c.reqs, c.q_len, c.kv_len, kHeads, kSplitKv, DType::bf16,
                                          cuda::current_device_props().sm_count, kSplitHd);
      const double flops = 4.0 * c.reqs * c.q_len * (c.kv_len - c.q_len / 2.0) * kSplitHd * kHeads;
      // Each count on the launch rule's kernel (hopper on sm90) and on the mma_sync one, in turns.
      for (int splits : {1, 2, 4, 8, 16}) {
        args.num_splits = splits;
        cuda::DeviceBuffer workspace = split_workspace(
            flash_attn::varlen_workspace_bytes(int64_t{c.reqs} * c.q_len, kHeads, kSplitHd, splits), stream);
        args.workspace = workspace.get();
        args.workspace_bytes = workspace.bytes();
        flash_attn::VarlenArgs mma = args;
        mma.generation = flash_attn::Generation::mma_sync;
        const std::vector<double> t = eager_in_turns(
            {[&](int) { flash_attn::run_varlen_attention(args); }, [&](int) { flash_attn::run_varlen_attention(mma); }}, 3,
            stream);
        ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto plan = flash_attn::choose_launch(flash_attn::varlen_launch_facts(args));
        const std::string count =
            std::string(splits == rule ? "the split rule's count" : "forced") + " (rule: " + std::to_string(rule) + ")";
        char ratio[64];
        std::snprintf(ratio, sizeof ratio, "; in turns: mma_sync / this %.3fx", t[1] / t[0]);
        rec.add({"prefill-split", key + " splits " + std::to_string(splits), "attnkit", "TFLOP/s", flops / t[0] / 1e9,
                 t[0], count + ", " + std::string(flash_attn::generation_name(plan.generation)) + " " + plan.config.name + ratio});
        rec.add({"prefill-split", key + " splits " + std::to_string(splits) + " mma_sync", "attnkit", "TFLOP/s",
                 flops / t[1] / 1e9, t[1], count + ", the mma_sync kernel (VarlenArgs::generation)"});
      }
    } catch (const std::exception& e) {
      rec.fail("prefill-split", key, e.what());
      cudaGetLastError();
    }
  }
}

}  // namespace attnkit::bench
