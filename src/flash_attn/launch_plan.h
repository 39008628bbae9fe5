// The one launch decision of the FlashAttention-style kernels: host facts about a launch in,
// a LaunchPlan out (generation, tile, fill, stages, PDL, L2 prefetch, persistence, and the reason
// in words). Plain C++, no CUDA: the dispatcher (varlen_dispatch.cu) maps the plan's tile to a
// compiled kernel and launches it, the split rule (split_kv.cpp) counts the plan's tile, the GPU
// tests ask it which variants serve a case, and the host tests table-test it.
// The measured evidence behind each rule is in src/flash_attn/DECISIONS.md.
#pragma once
#include <cstdint>
#include <string>

#include "attnkit/dtype.h"
#include "flash_attn/generation.h"
#include "flash_attn/tile_set.h"

namespace attnkit::flash_attn {

// Switches for tests and the benchmark (A/B rows, forcing the variants a shape does not pick);
// the defaults are the library's choice and an engine never sets them.
struct LaunchTuning {
  bool pdl = true;              // programmatic dependent launch where the rule allows (sm90+)
  bool l2_prefetch = true;      // mma_sync, with PDL: the first wave asks L2 for its first tiles
  bool kv_evict_first = true;   // split TMA launches read K/V with an L2 evict-first policy
  bool cluster_merge = true;    // 2-split decode launches on sm90 merge in a thread-block cluster
  bool cp_async_fill = false;   // decode and hopper tiles fill by cp.async even where TMA serves
  int transposed_stages = 0;    // the transposed fp8 tile's stages: 0 = the rule's, 2 or 3
  int max_ctas = 0;             // hopper: at most this many persistent CTAs (0 = the rule's)
  int q_buffers = 0;            // hopper: Q buffers, 1 or 2 (0 = the rule's)
  int consumer_groups = 0;      // hopper: consumer warpgroups, 2 or 3 (hopper_wide, head dim 64; 0 = the rule's)
  bool thread_output = false;   // hopper: output rows copied by the consumer threads even where TMA stores serve
  uint64_t* cta_trace = nullptr;  // diagnostics: per-CTA timestamps (cuda/cta_trace.h)
};

// What the decision looks at.
struct LaunchFacts {
  int cc_major = 0, sm_count = 0;  // the device
  bool hopper_kernels = false;     // sm_90a code in this build and an sm90 device
  Generation preferred = Generation::hopper;
  int head_size = 0;               // the runtime head size (the plan's head_dim serves it)
  CacheKind cache = CacheKind::b16;
  bool same_kv_strides = true;     // K and V sides of the cache share block / slot strides
  bool tma_geometry = true;        // the cache's sides encode as TMA maps (cuda/tensor_map.h)
  bool alibi_per_request = false;  // ALiBi slopes [num_reqs, num_heads]
  int num_reqs = 0, num_kv_heads = 0, group = 1;
  int max_query_len = 0, max_seq_len = 0;
  int num_splits = 1;
  bool causal = false;  // the causal mask (items of one launch then differ in length)
  // > 0: a planned launch (FlashInfer-style: PlanScheduler, src/flashinfer/plan.h) of this many
  // work items per KV head; its head dims are kPlannedHeadDims, its splits the plan's chunks.
  int64_t planned_items = 0;
  int plan_tile_q = 0;  // planned: the plan's query tile (an item's packed rows at most)
};

struct LaunchPlan {
  TileId tile = TileId::prefill;
  int head_dim = 0;            // the compiled head dim serving head_size (kernel_head_dim)
  TileConfig config;           // tile_config(tile, head_dim, cache)
  Generation generation = Generation::mma_sync;
  int64_t row_tiles = 0;       // grid x: tiles of config.rows packed rows of the longest query
  int64_t grid_ctas = 0;       // one CTA per work item and output slice: row_tiles x kv heads x splits x requests x o_slices
  int64_t ctas = 0;            // CTAs launched (a persistent hopper launch: fewer than grid_ctas)
  // hopper: the CTAs walk the items (at most `ctas` of them; a planned launch's grid is its plan's
  // capacity, which may exceed grid_ctas), else one CTA per item
  bool persistent = false;
  int64_t cta_slots = 0;       // config.ctas_per_sm x SMs
  bool pdl = false;
  bool l2_prefetch = false;    // (CTAs of the first wave only: l2_prefetch_ctas = cta_slots)
  bool kv_evict_first = false;
  bool cluster_merge = false;  // the item's splits run as one cluster and merge in shared memory
  bool tma_output = false;     // hopper: a warp's 16 output rows leave by TMA stores (one per 64 columns)
  std::string reason;          // why this tile and these switches, in words
};

// PDL for an mma_sync grid of `ctas` CTAs on `slots` CTA slots (CTAs per SM x SMs): not for
// more than half and less than 90% of a wave; for the transposed tile not up to a whole wave
// (DECISIONS.md: PDL off for part of a wave).
bool pdl_for_grid(int64_t ctas, int64_t slots, bool transposed = false);

// The cache kind of a cache dtype (16-bit floats, fp8, nvfp4; Error for others).
CacheKind cache_kind_of(DType cache_dtype);
// Every launch choice. Checks the tuning switches (Error naming a bad value).
LaunchPlan choose_launch(const LaunchFacts& facts, const LaunchTuning& tuning = {});

// The tile the split rule counts for a batch (decide_num_splits): the launch's tile before the
// choices that depend on the grid's size (the 2-stage variants, the hopper Q buffers), which
// choose_launch makes once the split count is known. The split count is that of the base tile's
// rows and CTA slots (DECISIONS.md: Split count counts the base tile).
TileId split_rule_tile(const LaunchFacts& facts);

}  // namespace attnkit::flash_attn
