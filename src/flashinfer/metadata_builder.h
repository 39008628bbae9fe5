// The FlashInfer-style metadata builder (docs/architecture.md section 6): checks the batch is ordered
// decodes first, splits it into a decode part and a prefill part, converts each part's block
// table rows to the page-table form, and plans each part (plan.h). All buffers are the
// builder's and are sized once, at creation, from its limits; build() re-fills them.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "attnkit/backend.h"
#include "flashinfer/gpu_planned.h"
#include "flashinfer/page_table.h"
#include "flashinfer/plan.h"

namespace attnkit::flashinfer {

// The largest batch a builder serves; its buffers are sized from these.
struct BuilderLimits {
  int max_reqs = 256;          // vLLM's default max_num_seqs
  int max_tokens = 8192;       // query tokens per batch (vLLM's default max_num_batched_tokens)
  int max_seq_len = 131072;    // longest request (KV tokens): page capacity max_reqs * pages
  int num_sms = 0;             // 0: cfg.device.sms_or_default()
  bool cuda_graph = false;     // fix the query tile per part (largest) so launches never change
  int window_left = -1;        // the layer's sliding window, planned in (-1 = unbounded); the
  int window_right = -1;       // impl refuses a call whose window reaches further
};

// Everything build() writes; one per builder, shared with the metadata it hands out.
struct PlanState {
  PageTable decode_pages, prefill_pages;
  PlanBuffers decode_plan, prefill_plan;
  std::vector<int32_t> prefill_qo_indptr;  // the prefill part's query offsets, from 0
  // The decode part as it was planned (copies: the GPU path uploads them with the plan).
  std::vector<int32_t> decode_qo_indptr, decode_kv_lens;
  int decode_window_left = -1, decode_window_right = -1;
  PlanBatch decode_batch() const {
    return {std::span<const int32_t>(decode_qo_indptr.data(), decode_plan.num_reqs + 1),
            std::span<const int32_t>(decode_kv_lens.data(), decode_plan.num_reqs), true, decode_window_left,
            decode_window_right};
  }
  // The prefill part as it was planned (its lengths copied, as the decode part's).
  std::vector<int32_t> prefill_kv_lens;
  bool prefill_causal = true;
  PlanBatch prefill_batch() const {
    return {std::span<const int32_t>(prefill_qo_indptr.data(), prefill_plan.num_reqs + 1),
            std::span<const int32_t>(prefill_kv_lens.data(), prefill_plan.num_reqs), prefill_causal,
            decode_window_left, decode_window_right};
  }
  uint64_t generation = 0;                 // bumped by every build()
  // The decode plan's device copy (GPU forwards), over the caller's buffer
  // (FlashInferMetadataBuilder::set_device_buffer): staged by every build() (host only) and
  // copied by the next forward, so a forward captured in a CUDA graph replays the builder's
  // later plans (DevicePlan::copy_staged).
  mutable std::unique_ptr<DevicePlan> device;
  mutable std::unique_ptr<DevicePlan> prefill_device;  // the prefill plan's, alike
  void stage_device_copies() const;  // both plans into their device copies' staging, where they exist
};

struct FlashInferMetadata final : BackendMetadata {
  int num_reqs = 0, num_actual_tokens = 0;
  int num_decodes = 0, num_prefills = 0;
  int num_decode_tokens = 0, num_prefill_tokens = 0;  // decodes are tokens [0, num_decode_tokens)
  bool causal = true;
  int window_left = -1, window_right = -1;  // what the plans assumed
  std::shared_ptr<const PlanState> state;
  uint64_t generation = 0;  // state->generation when built; differs once the builder re-plans
  bool stale() const { return !state || state->generation != generation; }
};

// The longest query a decode request may have: 1 on CUDA cores (MHA), else as many tokens as
// fit one 16-row decode tile with their GQA group (16 / group, at least 1).
int decode_query_len(const AttentionConfig& cfg);

// The device workspace (split tiles' partials) that the plans of a builder made with `limits`
// can need, for batches of up to max_tokens query tokens (clamped to limits.max_tokens).
size_t plan_workspace_bytes(const AttentionConfig& cfg, const BuilderLimits& limits, int64_t max_tokens);

class FlashInferMetadataBuilder final : public MetadataBuilder {
 public:
  FlashInferMetadataBuilder(const AttentionConfig& cfg, const BuilderLimits& limits);
  // Decodes must come first: engines apply decode_first_order (metadata.h) with this threshold.
  // A decode is a request of at most decode_query_len(cfg) query tokens (speculative decoding:
  // the tensor-core decode packs a request's tokens x its GQA group into one 16-row tile).
  int reorder_batch_threshold() const override { return decode_len_; }
  // Validates `common`, splits, converts and plans. Error naming the offending request when a
  // decode follows a prefill, and on any capacity overflow. Non-causal batches go wholly to the
  // prefill path (the decode kernels do not express bidirectional attention). The metadata
  // stays valid until the next build().
  std::unique_ptr<BackendMetadata> build(const CommonAttentionMetadata& common) override;

  // The decode and prefill plans' device copies (DevicePlanLayout of each part's capacity, each
  // 16-byte aligned). set_device_buffer makes them over the caller's buffer and stages the
  // current plans; a GPU forward before it is an Error.
  size_t device_buffer_bytes() const override;
  void set_device_buffer(void* device_ptr, size_t bytes) override;

  const BuilderLimits& limits() const { return limits_; }
  const PlanState& state() const { return *state_; }

 private:
  AttentionConfig cfg_;
  BuilderLimits limits_;
  int decode_len_ = 1;  // decode_query_len(cfg_)
  std::shared_ptr<PlanState> state_;
};

}  // namespace attnkit::flashinfer
