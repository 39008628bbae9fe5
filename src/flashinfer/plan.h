// The FlashInfer-style plan (docs/architecture.md section 6, study 2.3): a host-side partition of one
// batch part (the decodes, or the prefills) into (request, query tile, KV chunk) work items,
// spread over a fixed number of CTA slots, plus the merge map for tiles split into several KV
// chunks. Everything lands in fixed-capacity buffers sized once at creation, so re-planning a
// new batch never reallocates and a captured `run` can be replayed after a re-plan.
//
// How a batch is planned:
//  1. Query tile. GQA packs a request's (query token, head in group) pairs into "packed rows"
//     (row = token * group + head_in_group); a tile is tile_q consecutive packed rows of one
//     request. Tensor-core kernels take tile_q = 128 / 64 / 16 by the average packed length
//     (cta_tile_q); the CUDA-core decode kernel takes one query token's group (tile_q = group).
//  2. Visible keys. Each tile only needs the keys its rows can see (causal bound, sliding
//     window): the range [lo, hi) of the union of its rows' visible keys.
//  3. KV chunk size C (a whole number of pages). Binary search for the smallest C >=
//     min_chunk whose number of work items (sum over tiles of ceil(visible / C)) fits the CTA
//     slots: one wave, one item per slot (FlashInfer's rule). If that needs chunks larger than
//     the balance chunk ceil(W / slots) (W = all visible keys), the balance chunk wins: a skewed
//     batch (one long request among many short ones) then gets more items than slots instead
//     of one CTA doing the long request alone.
//  4. Items: tile t is cut into n_t = ceil(visible / C) chunks. A tile with n_t == 1 writes its
//     output directly; a split tile writes one partial (o, lse) per chunk and row, and the merge
//     map says which partials make up each packed row.
//  5. Assignment: items go to slots longest-first, each to the least-loaded slot (LPT), with
//     cost = KV tokens + kTileRowCost * tile rows. The kernel grid is (num_slots, num_kv_heads);
//     slot s runs items slot_items[slot_indptr[s] .. slot_indptr[s+1]) in order.
//
// Balance bound (proved in plan.cpp, tested): with ideal = total cost / num_slots,
//   max slot load <= ideal + max item cost <= 2 * ideal + balance_slack(),
//   balance_slack() = min chunk tokens + kTileRowCost * tile_q.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace attnkit::flashinfer {

// ---- constants (study 2.3 / 2.8; FlashInfer include/flashinfer/attention/scheduler.cuh) ------
// Smallest KV chunk: max(128 / page_size, 1) pages, i.e. 128 tokens or one page when pages are
// larger ("min KV chunk" in both of FlashInfer's decode and prefill plans).
inline constexpr int kMinKVChunkTokens = 128;
// Concurrent CTAs per SM the plan budgets for: FlashInfer's prefill plan hard-codes 2 (its
// decode plan asks the occupancy API of a real kernel; ours do not exist yet, so both parts use
// the prefill budget).
inline constexpr int kCtasPerSm = 2;
// Cost of one query tile row, in KV-token units, for the balance: FlashInfer's SM90 scheduler
// costs a work item 2 * q rows + KV length.
inline constexpr int kTileRowCost = 2;
// CTA query tiles (FA2DetermineCtaTileQ, sm80+): 128 rows when the average packed query length
// exceeds 64 and head_size < 256, 64 rows when it exceeds 16, else 16.
inline constexpr int kTileQLarge = 128;
inline constexpr int kTileQMedium = 64;
inline constexpr int kTileQSmall = 16;
inline constexpr int kTileQLargeAbove = 64;
inline constexpr int kTileQMediumAbove = 16;
inline constexpr int kTileQLargeMaxHeadSize = 256;  // 128-row tiles only below this head size

// The tensor-core CTA tile for an average packed query length (query tokens * group size).
int cta_tile_q(double avg_packed_qo_len, int head_size);
// CTA slots per KV head on a GPU with num_sms SMs: max(1, num_sms * kCtasPerSm / num_kv_heads).
int num_slots_for(int num_sms, int num_kv_heads);

enum class PlanKernel : uint8_t {
  CudaCoreDecode,  // one query token (its whole head group) per item; query_len <= 1
  TensorCore,      // tiles of 16/64/128 packed rows (prefill, and decode for GQA)
};

// What the layer and the device fix for every batch the plan will see.
struct PlanConfig {
  PlanKernel kernel = PlanKernel::TensorCore;
  int num_kv_heads = 0;
  int group_size = 1;    // num_heads / num_kv_heads
  int head_size = 0;
  int page_size = 0;     // tokens per page; chunks are whole pages
  int num_slots = 0;     // CTA slots per KV head: the kernel grid is (num_slots, num_kv_heads)
  int fixed_tile_q = 0;  // > 0: every batch uses this tile (CUDA-graph mode); 0: per batch
  void validate(std::string_view where) const;
  // The tiles this configuration may pick (the capacity sizing uses the extremes).
  int min_tile_q() const;
  int max_tile_q() const;
  int64_t min_chunk_tokens() const;  // max(kMinKVChunkTokens / page_size, 1) pages
};

struct PlanCapacity {
  int max_reqs = 0;
  int max_tokens = 0;
  int64_t max_items = 0;
  int64_t max_partial_rows = 0;
  // Capacities no batch of <= max_reqs requests and <= max_tokens query tokens can exceed:
  // max_items = num_slots + total tiles bound, max_partial_rows = max_tokens * group +
  // max_tile_q * num_slots (derivation in plan.cpp).
  static PlanCapacity for_limits(const PlanConfig& cfg, int max_reqs, int max_tokens);
};

// One batch part as host arrays.
struct PlanBatch {
  std::span<const int32_t> qo_indptr;  // num_reqs + 1 query-token offsets, from 0
  std::span<const int32_t> kv_lens;    // num_reqs; query_len <= kv_len (new tokens are keys)
  bool causal = true;
  int window_left = -1, window_right = -1;  // -1 = unbounded (docs/architecture.md section 4)
};

struct WorkItem {
  int32_t request;       // part-local request
  int32_t q_tile;        // packed rows [q_tile * tile_q, min(+tile_q, query_len * group))
  int32_t kv_begin;      // keys [kv_begin, kv_end) of the request
  int32_t kv_end;
  int32_t chunk;         // this item's chunk among its tile's num_chunks
  int32_t num_chunks;    // 1: the item writes out / lse directly
  int32_t partial_base;  // split tile: tile row k, chunk j -> partial row base + k*num_chunks + j;
                         // -1 when num_chunks == 1
};

struct PlanBuffers {
  PlanConfig config;
  PlanCapacity capacity;

  // The current plan.
  int num_reqs = 0;
  int num_tokens = 0;
  int tile_q = 0;
  int64_t kv_chunk_tokens = 0;  // C
  int num_items = 0;
  int num_partial_rows = 0;
  bool split_kv = false;        // some tile writes partials that need merging

  // Fixed-capacity arrays; the first num_items / num_slots + 1 / num_tokens * group + 1 entries
  // are the plan.
  std::vector<WorkItem> items;         // capacity max_items
  std::vector<int32_t> slot_indptr;    // num_slots + 1
  std::vector<int32_t> slot_items;     // capacity max_items: item ids, per slot, in run order
  // Per packed row (part-local token * group + head_in_group): its partial rows are
  // [merge_indptr[row], merge_indptr[row + 1]); an empty range means written directly.
  std::vector<int32_t> merge_indptr;   // capacity max_tokens * group + 1

  PlanBuffers() = default;
  PlanBuffers(const PlanConfig& config, const PlanCapacity& capacity);

  // Bytes of float workspace for partial outputs and LSEs at full capacity: one (head_size
  // floats + 1 lse float) per partial row per KV head (a packed row already names the query
  // head within its group).
  size_t workspace_bytes() const { return workspace_bytes_for(config, capacity); }
  static size_t workspace_bytes_for(const PlanConfig& config, const PlanCapacity& capacity);
  // The additive term of the balance bound (see the top of this file).
  int64_t balance_slack() const;
};

// Cost of an item in KV-token units (what the balance minimises).
inline int64_t item_cost(int64_t kv_tokens, int64_t tile_rows) {
  return kv_tokens + kTileRowCost * tile_rows;
}

// Plans `batch` into `plan` (never reallocating). Error on bad input (lengths, ordering of
// qo_indptr, query_len > kv_len, query_len > 1 for the CUDA-core decode kernel, window values)
// and on exceeding any capacity; on Error the previous plan is left as it was.
void plan_batch(const PlanBatch& batch, PlanBuffers& plan);

}  // namespace attnkit::flashinfer
