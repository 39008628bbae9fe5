// One varlen paged attention problem for the GPU tests: its description (Case), random
// construction, the device problem (q, paged cache with a shuffled block table whose padding
// entries are invalid block ids, parameters), runs of the kernel under test, of the CPU
// reference and of the GPU fp32 reference, and the comparisons.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_launch.h"
#include "gpu_reference.h"

namespace attnkit::test {

struct Case {
  DType dtype = DType::bf16;        // q / out
  DType cache_dtype = DType::bf16;  // == dtype or fp8
  KVLayout layout = KVLayout::NHD;
  int head_size = 128, num_kv_heads = 2, group = 4, block_size = 16;
  std::vector<int> q_lens, seq_lens;
  bool causal = true;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool alibi = false, sinks = false;
  bool alibi_per_seq = false;  // with alibi: slopes [num_reqs, num_heads] (one row per request)
  bool per_head_kv_scale = false;
  float scale = 0.f;  // 0 = default
  float q_amp = 1.f;  // |q| <= q_amp; K/V values lie in [-1, 1]
  int num_splits = 1;
  bool want_lse = true;  // false: the launch gets no LSE tensor
  // Preferred kernel generation (VarlenArgs::generation); hopper falls back to mma_sync where
  // no hopper kernel serves the launch.
  flash_attn::Generation generation = flash_attn::Generation::hopper;
  // The launch's tuning switches (launch_plan.h; the defaults: the library's choices).
  flash_attn::LaunchTuning tuning;
  // q / out / LSE rows past the batch's last token (CUDA-graph padding): the launch must
  // leave them unwritten.
  int pad_tokens = 0;
  // V read with the other layout's strides over the same bytes (NHD <-> HND within a block):
  // K and V strides differ, as separate key / value tensors may.
  bool v_other_layout = false;
  // K/V as contiguous rows [total_k, num_kv_heads, head_size] with cu_seqlens_k (no block
  // table): the same values as the paged cache (gathered from it), so the reference is the same.
  bool contiguous_kv = false;
  uint64_t seed = 1;

  int num_heads() const { return num_kv_heads * group; }
  int64_t num_tokens() const;  // the batch's tokens (without pad_tokens)
  int max_query_len() const;
  int max_seq_len() const;
  std::string describe() const;
};

// Output of one run: out [num_tokens, num_heads, head_size] and lse [num_heads, num_tokens]
// (the batch's tokens only); whether the padding rows kept their poison.
struct Result {
  std::vector<float> out, lse;
  bool padding_untouched = true;
};

class Problem {
 public:
  explicit Problem(const Case& c);
  const Case& spec() const { return c_; }
  void set_generation(flash_attn::Generation g) { c_.generation = g; }
  void set_tuning(const flash_attn::LaunchTuning& t) { c_.tuning = t; }

  // What choose_launch decides for this case on this device (launch_plan.h).
  flash_attn::LaunchPlan launch_plan(int num_splits, const flash_attn::LaunchTuning& tuning) const;
  // True when the hopper kernel serves the unsplit launch here (both generations are tested).
  bool hopper_serves() const;
  // The tunings the GPU tests run a case with (the case's own first): where the plan fills
  // stages by TMA, cp.async too; where a split launch reads K/V evict-first, plain copies too;
  // where its splits merge in a cluster, through the workspace too.
  struct Variant {
    std::string name;
    flash_attn::LaunchTuning tuning;
  };
  std::vector<Variant> launch_variants(int num_splits) const;

  // The kernel under test (out, lse and workspace poisoned with NaN first, then the workspace's
  // counters zeroed). Throws Error.
  Result run_kernel(int num_splits) const;
  // The launch arguments run_kernel uses, over caller buffers: out [num_tokens + pad_tokens,
  // num_heads, head_size], lse [num_heads, num_tokens + pad_tokens].
  flash_attn::VarlenArgs make_args(void* out, void* lse, void* workspace, size_t workspace_bytes,
                                   int num_splits) const;
  // The CPU reference over the whole batch (allow_query_longer_than_keys = true).
  Result run_cpu_reference() const;
  // The GPU fp32 reference on the given rows: out [rows, head_size], lse [rows].
  void run_gpu_reference(const std::vector<RefRow>& rows, std::vector<float>& out,
                         std::vector<float>& lse) const;
  // Rows to check on shapes too large for the CPU: every head of the first, the last and
  // `random_tokens` random tokens of every request.
  std::vector<RefRow> sample_rows(int random_tokens, uint64_t seed) const;
  // The rows' output ([rows, head_size]) and LSE ([rows]; left empty when r has none) of a run.
  void gather_rows(const Result& r, const std::vector<RefRow>& rows, std::vector<float>& out,
                   std::vector<float>& lse) const;

  // Overwrites the device copies of the batch's metadata (cu_seqlens_q, seqused_k, the block
  // table; same sizes) and leaves the host copies, which the references read: what the tests of
  // the device-side guards corrupt.
  void overwrite_device_metadata(const std::vector<int32_t>& cu, const std::vector<int32_t>& seq,
                                 const std::vector<int32_t>& table) const;

  const std::vector<int32_t>& cu_seqlens() const { return cu_; }
  const std::vector<int32_t>& seq_lens() const { return seq_; }
  // The host block table [num_reqs, max_blocks()] (entries past a request's blocks are invalid ids).
  const std::vector<int32_t>& block_table() const { return table_; }
  int max_blocks() const { return max_blocks_; }

 private:
  AttentionParams params_on(bool device) const;
  PagedKV cache_view(void* data, Device device) const;  // with v_other_layout applied

  Case c_;
  std::vector<int32_t> cu_, seq_, table_;
  int max_blocks_ = 0;
  KVCacheSpec spec_;
  void fill_nvfp4_scales(const std::vector<int>& need, std::mt19937_64& rng);
  cuda::DeviceBuffer d_q_, d_cache_, d_cu_, d_seq_, d_table_, d_params_;
  cuda::DeviceBuffer d_k_rows_, d_v_rows_, d_cu_k_;  // contiguous_kv
  int64_t total_k_ = 0;
  PagedKV d_kv_;
  // Host copies for the CPU reference (filled lazily: large caches never come back).
  mutable std::vector<uint8_t> h_q_, h_cache_;
  std::vector<float> h_params_;  // alibi [H] | sinks [H] | k_scale [n] | v_scale [n] | alibi [reqs, H]
  int scale_count_ = 1;
};

// n device elements of `dtype` as floats (a synchronous copy).
std::vector<float> download_as_float(const void* src, DType dtype, int64_t n);

// Whether the plan runs both GEMMs on the fp8 wgmma (the hopper kernel on an fp8 cache:
// docs/architecture.md section 9): its logits carry the tensor core's fp8 accumulation error
// (products summed at about 13 bits: at head size 192 / 256 the outputs came out up to 0.011
// off, an LSE of 27 0.015 off), its outputs the rounding of P to e4m3 (each P within 2^-4
// relative: an output within 2^-4 of the P-weighted mean |v|; the largest seen on the tests'
// V in [-1.5, 1.5] 0.036).
bool fp8_wgmma(const flash_attn::LaunchPlan& plan, DType cache);

// Comparisons with a reference (shape: the row-major shape for reporting coordinates).
// Output: |a - e| <= tol + tol |e| with tol 1e-2 (bf16) or 2e-3 (f16); with fp8 GEMMs (fp8:
// fp8_wgmma) 5e-2 + 2e-2 |e|; LSE: 2e-3 + 1e-4 |e|, 2e-3 + 1e-3 |e| with fp8 GEMMs. NaN never
// passes; a failure reports the worst element with its coordinates (all_close).
::testing::AssertionResult outputs_match(DType dtype, const std::vector<float>& actual,
                                         const std::vector<float>& expected,
                                         const std::vector<int64_t>& shape, bool fp8 = false);
::testing::AssertionResult lse_match(const std::vector<float>& actual,
                                     const std::vector<float>& expected,
                                     const std::vector<int64_t>& shape, bool fp8 = false);

// Random case builders used by the grids (deterministic in the seed; random_cases.cpp).
Case random_small_case(uint64_t seed);
// Batches of 1..32 requests, up to ~1k query tokens and 3.5k keys (still CPU-checkable).
Case random_medium_case(uint64_t seed);
// Decode-only fp8 batches of <= 8 packed rows per request at head size 128 (the transposed
// decode tile), every group size 1..8, random features, block sizes and splits.
// Head sizes other than the compiled dims (padded up to the next one) and the dim 80.
Case random_head_size_case(uint64_t seed);
Case random_transposed_decode_case(uint64_t seed);
// Decode-only 16-bit batches whose grids hold one to two CTAs per SM of an H200 (the 2-stage
// TMA decode tile, DecodeTwoStageTraits), head size 64 / 128.
Case random_two_stage_decode_case(uint64_t seed);
Case random_large_case(uint64_t seed);

}  // namespace attnkit::test
