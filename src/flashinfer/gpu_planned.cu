#include "flashinfer/gpu_planned.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/plan_merge.h"
#include "flash_attn/varlen_launch.h"
#include "flashinfer/cpu_forward.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer planned part";
constexpr int kItemInts = 7;  // plan.h WorkItem, as the kernel reads it (PlanScheduler)
static_assert(sizeof(WorkItem) == kItemInts * sizeof(int32_t), "WorkItem is 7 int32");
static_assert(kRaggedPageRows == cuda::KvPages::kContiguousPageKeys, "ragged pages are the contiguous view's blocks");

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

DevicePlan::DevicePlan(const PlanCapacity& capacity, int group_size, int64_t max_pages, void* device, size_t bytes)
    : capacity_(capacity), group_(group_size), max_pages_(max_pages), device_(device) {
  ATTNKIT_REQUIRE(capacity.max_items > 0 && capacity.max_reqs > 0 && capacity.max_tokens >= 0 && group_size > 0 &&
                      max_pages >= 0,
                  kWhere, "device plan capacity", capacity.max_items, "must have items, requests and a group");
  at_ = DevicePlanLayout(capacity, group_size, max_pages);
  ATTNKIT_REQUIRE(device != nullptr && reinterpret_cast<uintptr_t>(device) % 16 == 0, kWhere, "device plan buffer",
                  device == nullptr ? "null" : "not 16-byte aligned", "must be a 16-byte aligned device pointer");
  ATTNKIT_REQUIRE(bytes >= at_.bytes(), kWhere, "device plan buffer bytes", bytes,
                  "must be >= " + std::to_string(at_.bytes()) + " (the plan capacity's device copy)");
  ATTNKIT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&staging_), at_.bytes()));
  std::memset(staging_, 0, at_.bytes());
  cudaEvent_t ev;
  ATTNKIT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  copied_ = ev;
}

DevicePlan::~DevicePlan() {
  if (copied_) cudaEventDestroy(static_cast<cudaEvent_t>(copied_));
  if (staging_) cudaFreeHost(staging_);
}

void DevicePlan::upload(const PlanBuffers& plan, const PageTable& pages, const PlanBatch& batch, void* stream) {
  stage(plan, pages, batch);
  copy(staged_, stream);
  copied_stage_ = stages_;
}

bool DevicePlan::copy_staged(void* stream) {
  const bool capturing = stream_capturing(stream);
  if (capturing) {
    cudaStreamCaptureStatus status;
    unsigned long long id = 0;
    ATTNKIT_CUDA_CHECK(cudaStreamGetCaptureInfo(as_stream(stream), &status, &id));
    if (id != capture_id_) {
      // The whole buffer: the replays' plans may use more pages than this one. No event: an
      // event recorded in a capture cannot be waited for by the host; a replay's copy is ordered
      // before the next stage by the engine's step (section 6 of docs/architecture.md).
      copy(at_.total, stream, /*record=*/false);
      capture_id_ = id;
    }
  } else if (copied_stage_ != stages_) {
    copy(staged_, stream);
    copied_stage_ = stages_;
  }
  return capturing;
}

void DevicePlan::copy(int64_t entries, void* stream, bool record) {
  ATTNKIT_CUDA_CHECK(
      cudaMemcpyAsync(device_, staging_, entries * sizeof(int32_t), cudaMemcpyHostToDevice, as_stream(stream)));
  if (record) ATTNKIT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(copied_), as_stream(stream)));
}

bool stream_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ATTNKIT_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream), &status));
  return status == cudaStreamCaptureStatusActive;
}

void DevicePlan::stage(const PlanBuffers& plan, const PageTable& pages, const PlanBatch& batch) {
  const int n = plan.num_reqs;
  ATTNKIT_REQUIRE(n <= capacity_.max_reqs && plan.num_items <= capacity_.max_items &&
                      plan.num_tokens <= capacity_.max_tokens && plan.config.group_size == group_,
                  kWhere, "plan", std::to_string(n) + " requests, " + std::to_string(plan.num_items) + " items",
                  "must fit the device plan's capacity (" + std::to_string(capacity_.max_reqs) + " requests, " +
                      std::to_string(capacity_.max_items) + " items, group " + std::to_string(group_) + ")");
  ATTNKIT_REQUIRE(pages.num_reqs == n && static_cast<int64_t>(batch.kv_lens.size()) == n &&
                      static_cast<int64_t>(batch.qo_indptr.size()) == n + 1,
                  kWhere, "page table / batch requests", pages.num_reqs, "must be the plan's " + std::to_string(n));
  ATTNKIT_REQUIRE(pages.num_pages <= max_pages_, kWhere, "pages", pages.num_pages,
                  "must fit the device plan's " + std::to_string(max_pages_));
  // The previous upload's copy may still be reading the staging buffer.
  ATTNKIT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(copied_)));
  std::memcpy(staging_ + at_.items, plan.items.data(), sizeof(WorkItem) * plan.num_items);
  staging_[at_.count] = plan.num_items;
  staging_[at_.count + 1] = plan.num_tokens * group_;
  std::copy(batch.qo_indptr.begin(), batch.qo_indptr.end(), staging_ + at_.qo);
  std::copy(batch.kv_lens.begin(), batch.kv_lens.end(), staging_ + at_.kv);
  std::copy(pages.indptr.begin(), pages.indptr.begin() + n + 1, staging_ + at_.indptr);
  const int64_t rows = int64_t{plan.num_tokens} * group_;
  std::copy(plan.merge_indptr.begin(), plan.merge_indptr.begin() + rows + 1, staging_ + at_.merge);
  std::copy(pages.indices.begin(), pages.indices.begin() + pages.num_pages, staging_ + at_.indices);
  staged_ = at_.indices + pages.num_pages;
  ++stages_;
}

void run_planned_part(const DevicePlan& dev, const PlanBuffers& plan, const PageTable& pages, const PlanBatch& batch,
                        const PlannedPartArgs& a, const flash_attn::LaunchTuning& tuning) {
  check_planned_call(a.q, a.cache, pages, plan, batch, a.params, kWhere);
  a.q.require_device(kWhere, "q", Device::CUDA);
  const PlanConfig& cfg = plan.config;
  ATTNKIT_REQUIRE(plan.num_items <= dev.max_items(), kWhere, "plan items", plan.num_items,
                  "must fit the device plan's capacity " + std::to_string(dev.max_items()));
  if (!a.graph_safe && (plan.num_tokens == 0 || plan.num_items == 0)) return;
  const size_t need = plan.workspace_bytes();
  const bool partials = a.workspace != nullptr && a.workspace_bytes >= need;
  if (plan.split_kv || a.graph_safe) {
    ATTNKIT_REQUIRE(partials && (reinterpret_cast<uintptr_t>(a.workspace) & 15u) == 0, kWhere, "workspace_bytes",
                    a.workspace_bytes,
                    std::string(a.graph_safe ? "a graph-safe run" : "a split plan") +
                        " needs a 16-byte aligned workspace of PlanBuffers::workspace_bytes() = " +
                        std::to_string(need) + " bytes");
  }
  int max_q = 0, max_kv = 0;
  for (int r = 0; r < plan.num_reqs; ++r) {
    max_q = std::max(max_q, batch.qo_indptr[r + 1] - batch.qo_indptr[r]);
    max_kv = std::max(max_kv, batch.kv_lens[r]);
  }
  flash_attn::VarlenArgs v;
  v.q = a.q;
  v.cache = a.cache;
  v.out = a.out;
  v.cu_seqlens_q = dev.qo_indptr();
  v.seqused_k = dev.kv_lens();
  v.block_table = dev.page_indices();
  v.max_blocks_per_req = static_cast<int>(std::min<int64_t>(pages.num_pages, 0x7fffffff));
  v.num_reqs = plan.num_reqs;
  v.max_query_len = max_q;
  v.max_seq_len = max_kv;
  v.num_heads = cfg.num_kv_heads * cfg.group_size;
  v.params = a.params;
  v.stream = a.stream;
  v.generation = flash_attn::Generation::hopper;  // (where the launch decision finds it serves: 128-row prefill plans)
  // Partial rows: o [rows][kv heads][head_size] then lse [rows][kv heads] (PlanBuffers::workspace_bytes).
  const int64_t part_rows = plan.capacity.max_partial_rows * cfg.num_kv_heads;
  flash_attn::PlannedLaunch pl;
  pl.items = dev.items();
  pl.num_items = dev.num_items();
  // The grid covers the plan's items now, or, graph-safe, every plan a replay may bring (the
  // capacity, often 10x the items: empty CTAs that only read the count cost each launch).
  pl.grid_items = a.graph_safe ? dev.max_items() : plan.num_items;
  pl.planned_items = plan.num_items;
  pl.tile_q = plan.tile_q;
  pl.page_indptr = dev.page_indptr();
  if (partials) {
    pl.part_o = static_cast<float*>(a.workspace);
    pl.part_lse = pl.part_o + part_rows * cfg.head_size;
  }
  if (a.graph_safe) pl.planned_items = std::max<int64_t>(pl.planned_items, 1);  // (the launch happens)
  flash_attn::run_planned_attention(v, pl, tuning);
  if (!plan.split_kv && !a.graph_safe) return;
  cuda::PlanMergeArgs m;
  m.part_o = pl.part_o;
  m.part_lse = pl.part_lse;
  m.merge_indptr = dev.merge_indptr();
  m.num_rows = static_cast<int>(a.graph_safe ? dev.max_rows() : int64_t{plan.num_tokens} * cfg.group_size);
  if (a.graph_safe) m.num_rows_dev = dev.num_rows();
  m.num_kv_heads = cfg.num_kv_heads;
  m.group = cfg.group_size;
  m.head_size = cfg.head_size;
  m.out = a.out.data;
  m.out_dtype = a.out.dtype;
  m.out_stride_token = a.out.stride(0);
  m.out_stride_head = a.out.stride(1);
  if (a.params.lse.defined()) {
    m.lse = a.params.lse.ptr<float>();
    m.lse_stride_head = a.params.lse.stride(0);
    m.lse_stride_token = a.params.lse.stride(1);
  }
  if (a.params.sinks.defined()) {
    m.sinks = a.params.sinks.ptr<const float>();
    m.sinks_stride = a.params.sinks.stride(0);
  }
  cuda::merge_plan_partials(m, as_stream(a.stream));
}

}  // namespace attnkit::flashinfer
