// The FlashInfer-style backend on the GPU: a planned batch part (plan.h; a decode or a prefill
// part, over a page table or ragged K/V's contiguous view: page_table.h ragged_pages) run by the
// planned kernels (the FlashAttention-style kernel skeleton with the plan's policies:
// flash_attn/varlen_launch.h run_planned_attention) and, for split tiles, the plan merge
// (cuda/plan_merge.h). The result equals run_plan_on_cpu's on the same plan (cpu_forward.h),
// except that query rows past the plan's tokens are not written.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"
#include "flash_attn/launch_plan.h"
#include "flashinfer/page_table.h"
#include "flashinfer/plan.h"

namespace attnkit::flashinfer {

// Where each section of a planned part's device copy sits (int32 entries from its start, each
// section 16-byte aligned; the page indices last, so an upload copies the fixed part and the
// used pages), for a plan capacity, GQA group and page capacity.
struct DevicePlanLayout {
  int64_t items = 0, count = 0, qo = 0, kv = 0, indptr = 0, merge = 0, indices = 0, total = 0;
  DevicePlanLayout() = default;
  DevicePlanLayout(const PlanCapacity& capacity, int group_size, int64_t max_pages) {
    auto section = [&](int64_t n) {
      const int64_t off = total;
      total += (n + 3) & ~int64_t{3};
      return off;
    };
    items = section(capacity.max_items * static_cast<int64_t>(sizeof(WorkItem) / sizeof(int32_t)));
    count = section(2);
    qo = section(int64_t{capacity.max_reqs} + 1);
    kv = section(capacity.max_reqs);
    indptr = section(int64_t{capacity.max_reqs} + 1);
    merge = section(int64_t{capacity.max_tokens} * group_size + 1);
    indices = section(std::max<int64_t>(max_pages, 1));
  }
  size_t bytes() const { return static_cast<size_t>(total) * sizeof(int32_t); }
};

// The device copy of one planned part: the plan's items and their count, the part's query
// offsets and KV lengths, its page table (indptr, indices) and merge map, each at a fixed offset
// (DevicePlanLayout) of one device buffer that the caller owns, sized for the plan's capacity
// and max_pages (the builder's set_device_buffer hands it over; the library allocates no device
// memory); upload() refreshes it from pinned staging with one asynchronous copy (no allocation,
// no device synchronisation), so a launch recorded once keeps reading the same addresses after
// a re-plan.
class DevicePlan {
 public:
  // `device`: DevicePlanLayout(capacity, group_size, max_pages).bytes() bytes or more, 16-byte
  // aligned, kept alive by the caller while the plan is used.
  DevicePlan(const PlanCapacity& capacity, int group_size, int64_t max_pages, void* device, size_t bytes);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  // Packs the current plan, page table and batch into the staging buffer (waiting, if needed,
  // for the previous upload's copy to finish reading it) and copies them on `stream`
  // (cudaStream_t). Error when they disagree with each other or exceed the capacity.
  void upload(const PlanBuffers& plan, const PageTable& pages, const PlanBatch& batch, void* stream);

  // upload() in two halves, for an engine whose forward may be captured in a CUDA graph: the
  // builder stages every batch it plans (host only), the forward copies what was staged. On a
  // stream that is not capturing, copy_staged copies the staged bytes once per stage (the first
  // forward after it; the other layers' forwards find it done). On a capturing stream it
  // records a copy of the whole buffer once per capture, so every replay carries whatever plan
  // the builder staged last (within the capacity). Returns whether `stream` is capturing.
  // (stage() waits for the last eager copy; a replay's copy must have run before the next
  // stage, as it has when the engine reads each step's sampled tokens before building the next.)
  void stage(const PlanBuffers& plan, const PageTable& pages, const PlanBatch& batch);
  bool copy_staged(void* stream);

  const int32_t* items() const { return base() + at_.items; }
  const int32_t* num_items() const { return base() + at_.count; }
  const int32_t* num_rows() const { return base() + at_.count + 1; }  // packed rows: tokens x group
  const int32_t* qo_indptr() const { return base() + at_.qo; }
  const int32_t* kv_lens() const { return base() + at_.kv; }
  const int32_t* page_indptr() const { return base() + at_.indptr; }
  const int32_t* page_indices() const { return base() + at_.indices; }
  const int32_t* merge_indptr() const { return base() + at_.merge; }
  int64_t max_items() const { return capacity_.max_items; }
  int64_t max_rows() const { return int64_t{capacity_.max_tokens} * group_; }

 private:
  const int32_t* base() const { return static_cast<const int32_t*>(device_); }
  PlanCapacity capacity_;
  int group_ = 1;
  int64_t max_pages_ = 0;
  DevicePlanLayout at_;
  // The first `entries` of staging to the device; record: stage() may then wait for it.
  void copy(int64_t entries, void* stream, bool record = true);
  void* device_ = nullptr;      // the caller's
  int32_t* staging_ = nullptr;  // pinned
  void* copied_ = nullptr;      // cudaEvent_t: the last copy of the staging buffer
  int64_t staged_ = 0;          // int32 entries of the last stage
  uint64_t stages_ = 0, copied_stage_ = 0;  // stage() calls; the last one copied (not capturing)
  unsigned long long capture_id_ = 0;       // the capture that last recorded a copy
};

// Whether `stream` (cudaStream_t) is capturing a CUDA graph.
bool stream_capturing(void* stream);

struct PlannedPartArgs {
  TensorView q;    // [>= plan.num_tokens, num_heads, head_size], CUDA, bf16 / f16: the part's tokens
  TensorView out;  // same shape and dtype
  PagedKV cache;   // CUDA, block_size = the plan's page size (16..1024), 16-bit, fp8 or NVFP4; or
                   // ragged K/V's contiguous_kv_view (pages of kRaggedPageRows)
  AttentionParams params;  // device tensors; lse (if defined) natural log [num_heads, q.size(0)]
  void* workspace = nullptr;  // >= plan.workspace_bytes() bytes when the plan splits, 16-byte aligned
  size_t workspace_bytes = 0;
  void* stream = nullptr;
  // The launches serve every plan of the device plan's capacity (what a CUDA graph captured
  // once replays after a re-plan): the merge always runs (bounded by the device-side row
  // count), and the workspace must hold the capacity's partials.
  bool graph_safe = false;
};

// Runs the uploaded plan (`dev` holds what upload() copied of plan / pages / batch). Checks the
// call against the plan first (check_planned_call) and throws Error before any launch.
void run_planned_part(const DevicePlan& dev, const PlanBuffers& plan, const PageTable& pages,
                      const PlanBatch& batch, const PlannedPartArgs& args,
                      const flash_attn::LaunchTuning& tuning = {});

}  // namespace attnkit::flashinfer
