#include "flash_attn/launch_plan.h"

#include <algorithm>
#include <iterator>

#include "attnkit/error.h"
#include "core/cuda_archs.h"
#include "core/int_math.h"

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn launch decision";

// Hopper persistence: a request's keys x head dim up to this with two Q buffers, half of it
// with one (DECISIONS.md: Hopper: persistent for short items; Hopper: two Q buffers on
// persistent launches).
constexpr int64_t kPersistentMaxWork = 4096 * 128;
// Causal launches take the 192-row hopper tile from this many keys up, one CTA per item
// (DECISIONS.md: Hopper: three consumer warpgroups at head dim 64).
constexpr int kWideCausalMinKeys = 2048;

int64_t packed_rows(const LaunchFacts& f) { return static_cast<int64_t>(f.max_query_len) * f.group; }
// The rows of one work item: a launch tile's, or a planned item's (at most the plan's tile_q, a
// prefill part's tile: 16 / 64 / 128), which is what the tile must hold.
int64_t item_rows(const LaunchFacts& f) {
  return f.planned_items > 0 && f.plan_tile_q > 0 ? std::min<int64_t>(packed_rows(f), f.plan_tile_q) : packed_rows(f);
}

void validate(const LaunchFacts& f, const LaunchTuning& t) {
  ATTNKIT_REQUIRE(t.transposed_stages == 0 || t.transposed_stages == 2 || t.transposed_stages == 3, kWhere,
                  "tuning.transposed_stages", t.transposed_stages, "must be 0 (the rule's choice), 2 or 3");
  ATTNKIT_REQUIRE(t.max_ctas >= 0, kWhere, "tuning.max_ctas", t.max_ctas, "must be >= 0 (0: the rule's choice)");
  ATTNKIT_REQUIRE(t.q_buffers >= 0 && t.q_buffers <= 2, kWhere, "tuning.q_buffers", t.q_buffers,
                  "must be 0 (the rule's choice), 1 or 2");
  ATTNKIT_REQUIRE(t.consumer_groups == 0 || t.consumer_groups == 2 || t.consumer_groups == 3, kWhere,
                  "tuning.consumer_groups", t.consumer_groups, "must be 0 (the rule's choice), 2 or 3");
  ATTNKIT_REQUIRE(f.head_size == 0 || kernel_head_dim(f.head_size, f.cache, f.planned_items > 0) > 0, kWhere, "head_size", f.head_size,
                  head_size_rule(f.cache, f.planned_items > 0));
  ATTNKIT_REQUIRE(!(f.planned_items > 0 && f.cache == CacheKind::nvfp4 && item_rows(f) > kDecodeTileRows), kWhere,
                  "planned item rows (min(max_query_len * group, plan tile_q))", item_rows(f),
                  "must be <= " + std::to_string(kDecodeTileRows) +
                      " with an nvfp4 cache (read by the decode tile only: plan its prefills with 16-row tiles)");
  ATTNKIT_REQUIRE(f.sm_count > 0, kWhere, "sm_count", f.sm_count, "must be > 0");
  ATTNKIT_REQUIRE(f.group >= 1, kWhere, "group", f.group, "must be >= 1");
  ATTNKIT_REQUIRE(f.num_splits >= 1, kWhere, "num_splits", f.num_splits, "must be >= 1");
}


// The tile family of the launch, before the grid-size refinements; `why` gets the reason.
TileId base_tile(const LaunchFacts& f, const LaunchTuning& t, std::string& why) {
  const int64_t rows = item_rows(f);
  const int hd = kernel_head_dim(f.head_size, f.cache, f.planned_items > 0);  // (the mma_sync tiles')
  const int hopper_hd = tile_head_dim(TileId::hopper, f.head_size, f.cache, f.planned_items > 0);
  if (rows <= kDecodeTileRows && tile_instantiated(TileId::decode, hd, f.cache)) {
    // Decode-shaped (one token x its GQA group, or a few speculative tokens): 16-row tiles with
    // the warps along the keys. On sm90 their stages fill by TMA wherever the cache's rows and
    // strides allow it (DECISIONS.md: TMA fills for every sm90 decode tile); a box copies whole
    // rows, so a head size padded up to its kernel's takes the cp.async fills.
    const bool tma = !t.cp_async_fill && f.cc_major >= 9 && f.tma_geometry && hd == f.head_size &&
                     tma_rows(hd, f.cache);
    why = "at most " + std::to_string(kDecodeTileRows) + " packed rows (" + std::to_string(rows) + "): decode tile";
    // (the transposed tile holds a request's whole group: every request, not just every item)
    if (tma && packed_rows(f) <= kTransposedMaxRows && tile_instantiated(TileId::decode_transposed, hd, f.cache)) {
      why += ", fp8 with <= " + std::to_string(kTransposedMaxRows) +
             " packed rows: transposed (keys on the MMA's M; DECISIONS.md: Transposed fp8 decode tile)";
      return TileId::decode_transposed;
    }
    if (tma) {
      why += ", TMA stage fills";
      return TileId::decode_tma;
    }
    why += t.cp_async_fill      ? ", cp.async fills (tuning)"
           : hd != f.head_size ? ", cp.async fills (head size padded to its kernel's " + std::to_string(hd) + ")"
                               : ", cp.async fills (TMA needs sm90 and rows of whole 128-byte segments <= 512 bytes)";
    return TileId::decode;
  }
  why = std::to_string(rows) + " packed rows: prefill tile";
  if (rows <= kDecodeTileRows) why += " (no decode tile above head dim " + std::to_string(kMaxDecodeTileDim) + ")";
  const bool hopper_serves = f.preferred == Generation::hopper && f.hopper_kernels &&
                             tile_instantiated(TileId::hopper, hopper_hd, f.cache) && f.same_kv_strides &&
                             !f.alibi_per_request;
  if (f.planned_items > 0) {
    // A planned prefill part: the hopper kernel walking the plan's items (PlanWalk) where it
    // serves the launch and the plan's tile is the hopper tile's rows; else the mma_sync prefill
    // tile. Either epilogue writes the plan's partial rows for the items of split tiles.
    const int hopper_rows = tile_config(TileId::hopper, hopper_hd, f.cache).rows;
    if (hopper_serves && f.plan_tile_q == hopper_rows) {
      why += " of the hopper generation over the plan's items (tile_q " + std::to_string(hopper_rows) + ")";
      return TileId::hopper;
    }
    why += " of the mma_sync generation (planned prefill: ";
    why += !hopper_serves ? "the hopper kernel does not serve it)"
                          : "the plan's tile_q " + std::to_string(f.plan_tile_q) + " is not the hopper tile's " +
                                std::to_string(hopper_rows) + ")";
    return TileId::prefill;
  }
  if (hopper_serves) {
    why += " of the hopper generation (wgmma, warp-specialised)";
    return TileId::hopper;
  }
  // Why not hopper, when it was asked for.
  if (f.preferred == Generation::hopper) {
    if (!f.hopper_kernels) why += " (mma_sync: no sm_90a kernels for this device)";
    else if (!tile_instantiated(TileId::hopper, hopper_hd, f.cache))
      why += " (mma_sync: the hopper kernel serves 16-bit and fp8 caches at head dims 64 / 128 / 192 / 256, 16-bit ones "
             "at 96 too, head sizes up to 256; head size " + std::to_string(f.head_size) + " runs on dim " + std::to_string(hd) + ")";
    else if (f.alibi_per_request) why += " (mma_sync: the hopper kernel reads per-head ALiBi slopes only)";
    else why += " (mma_sync: the hopper producer needs equal K and V strides)";
  }
  return TileId::prefill;
}

}  // namespace

CacheKind cache_kind_of(DType t) {
  if (is_fp8(t)) return CacheKind::fp8;
  if (t == DType::nvfp4) return CacheKind::nvfp4;
  ATTNKIT_REQUIRE(t == DType::bf16 || t == DType::f16, kWhere, "cache dtype", dtype_name(t),
                  "must be bf16, f16, fp8_e4m3, fp8_e5m2 or nvfp4 for the CUDA kernels");
  return CacheKind::b16;
}

const char* cache_kind_name(CacheKind c) {
  return c == CacheKind::b16 ? "16-bit" : c == CacheKind::fp8 ? "fp8" : "nvfp4";
}

std::string tile_smem_refusal(int head_dim, CacheKind cache, int cc) {
  const int have = smem_per_block_optin(cc);
  for (TileId id : {TileId::prefill, TileId::decode}) {
    if (!tile_instantiated(id, head_dim, cache)) continue;
    const TileConfig t = tile_config(id, head_dim, cache);
    const int need = tile_smem_bytes(t, head_dim, cache);
    if (need > have)
      return "its " + std::string(t.name) + " tile at head dim " + std::to_string(head_dim) + " (" +
             cache_kind_name(cache) + " cache) needs " + std::to_string(need) + " bytes of shared memory per block; sm" +
             std::to_string(cc) + " gives " + std::to_string(have) + " (tiles with fewer stages for such GPUs are not built)";
  }
  return {};
}

std::string head_size_rule(CacheKind cache, bool planned) {
  if (cache == CacheKind::nvfp4 && !planned)
    return "is not served: an nvfp4 cache is read by the FlashInfer-style planned decode only";
  const int max = planned ? kPlannedHeadDims[std::size(kPlannedHeadDims) - 1] : kMaxHeadSize;
  const int mult = head_size_multiple(cache);
  return "must be a multiple of " + std::to_string(mult) +
         (cache == CacheKind::b16 ? std::string() : std::string(" (") + cache_kind_name(cache) + " cache)") + " in [" +
         std::to_string(mult) + ", " + std::to_string(max) + "]";
}

bool pdl_for_grid(int64_t ctas, int64_t slots, bool transposed) {
  if (transposed) return !(2 * ctas > slots && ctas <= slots);
  return !(2 * ctas > slots && 10 * ctas < 9 * slots);
}

TileId split_rule_tile(const LaunchFacts& facts) {
  validate(facts, {});
  std::string why;
  return base_tile(facts, {}, why);
}

LaunchPlan choose_launch(const LaunchFacts& f, const LaunchTuning& t) {
  validate(f, t);
  LaunchPlan plan;
  plan.tile = base_tile(f, t, plan.reason);
  plan.head_dim = tile_head_dim(plan.tile, f.head_size, f.cache, f.planned_items > 0);
  if (plan.head_dim != f.head_size)
    plan.reason += "; head size " + std::to_string(f.head_size) + " padded to " + std::to_string(plan.head_dim);
  auto grid_of = [&](TileId id) {
    plan.config = tile_config(id, plan.head_dim, f.cache);
    plan.row_tiles = ceil_div(packed_rows(f), plan.config.rows);
    plan.grid_ctas = f.planned_items > 0 ? f.planned_items * f.num_kv_heads
                                         : plan.row_tiles * f.num_kv_heads * f.num_splits * f.num_reqs * plan.config.o_slices;
    plan.cta_slots = static_cast<int64_t>(plan.config.ctas_per_sm) * f.sm_count;
  };
  grid_of(plan.tile);
  const int64_t sms = f.sm_count;

  // Refinements by the grid's size.
  if (plan.tile == TileId::decode_tma && tile_instantiated(TileId::decode_two_stage, plan.head_dim, f.cache) &&
      plan.grid_ctas > sms && plan.grid_ctas <= 2 * sms) {
    plan.tile = TileId::decode_two_stage;
    plan.reason += "; a grid of 1-2 CTAs per SM: 2 stages, 3 CTAs per SM (DECISIONS.md: 2-stage 16-bit decode tile)";
  } else if (plan.tile == TileId::decode_transposed) {
    const bool two = t.transposed_stages == 2 || (t.transposed_stages == 0 && plan.grid_ctas > 3 * sms);
    if (two) plan.tile = TileId::decode_transposed_two_stage;
    plan.reason += t.transposed_stages != 0 ? "; " + std::to_string(t.transposed_stages) + " stages (tuning)"
                   : two ? "; a grid of more than 3 CTAs per SM: 2 stages (DECISIONS.md: Transposed tile: 2 stages above 3 CTAs per SM)"
                         : "; a grid of at most 3 CTAs per SM: 3 stages";
  }
  grid_of(plan.tile);
  plan.generation = plan.config.generation;
  // Output slices each merge their own columns; the split merge's counters are per work item.
  ATTNKIT_REQUIRE(f.num_splits == 1 || plan.config.o_slices == 1, kWhere, "num_splits", f.num_splits,
                  "must be 1 at head dim " + std::to_string(plan.head_dim) +
                      " (its work items run as output-column slices, which do not split)");
  if (plan.config.o_slices > 1)
    plan.reason += "; " + std::to_string(plan.config.o_slices) + " CTAs per work item, one per slice of output columns";
  plan.ctas = plan.grid_ctas;

  if (plan.generation == Generation::hopper) {
    // The tile first, from the 128-row grid; then the CTA count of its own grid.
    // Three consumer warpgroups (hopper_wide, 192 rows) at head dim 64, where one warpgroup's
    // softmax of a 128-key tile outlasts the other's GEMMs (two leave the tensor cores idle), on
    // grids of more than 1.25 waves of 128-row items: a 192-row item runs ~1.2x the TFLOP/s, so
    // it takes 1.5 / 1.2 = 1.25x as long as a 128-row one, and with the makespan max(work per
    // SM, longest item) that wins from 1.25 waves up and loses below. Causal launches take it
    // above 2k keys only, and one CTA per item: their items differ in length, and the hardware's
    // CTA launch balanced 192-row ones better than the persistent walk (4k x 4: +11%); at <= 2k
    // keys it measured 3-13% slower, or equal (DECISIONS.md: Hopper: three consumer warpgroups at
    // head dim 64). The grid: requests x the longest query's items (the host knows no other
    // lengths). The split rule counts the 128-row items, so a split launch keeps them (its
    // splits fill at most one wave of them: the grid's excess is empty items). A planned launch
    // (the plan's items, PlanWalk) keeps its plan's 128-row tiles too.
    const bool wide_tile = tile_instantiated(TileId::hopper_wide, plan.head_dim, f.cache) && f.planned_items == 0;
    const bool wide = wide_tile && t.q_buffers != 2 && (f.num_splits == 1 || t.consumer_groups == 3) &&
                      (t.consumer_groups > 0 ? t.consumer_groups == 3
                                             : (!f.causal || f.max_seq_len > kWideCausalMinKeys) &&
                                                   4 * plan.grid_ctas > 5 * sms);
    // Short items: one CTA per SM walks them (persistent); long ones, and causal ones on the
    // 192-row tile, one CTA per item, which the hardware hands to SMs as they free up (the
    // walk's static shares of unequal items leave its slowest CTA behind). An item's work is its
    // keys (a split's share of them) x head dim; the walk wins up to 4096 x 128 where the tile has a second Q buffer (the
    // next item's Q loads while the current one finishes), up to half that with one (head dim
    // 256, the 192-row tile).
    // (a second Q buffer exists where a K/V ring of two stages still fits next to it: tile_set.h)
    const bool short_tile = tile_instantiated(TileId::hopper_short, plan.head_dim, f.cache);
    const int64_t max_work = !wide && short_tile ? kPersistentMaxWork : kPersistentMaxWork / 2;
    const bool short_keys = ceil_div(int64_t{f.max_seq_len}, int64_t{f.num_splits}) * plan.head_dim <= max_work;
    const bool persistent = t.max_ctas > 0 || (short_keys && !(wide && f.causal));
    const int64_t max_ctas = t.max_ctas > 0 ? t.max_ctas : sms;
    const bool two_q = !wide && short_tile && (t.q_buffers > 0 ? t.q_buffers == 2 : persistent && plan.grid_ctas > max_ctas);
    if (wide || two_q) {
      plan.tile = wide ? TileId::hopper_wide : TileId::hopper_short;
      grid_of(plan.tile);
    }
    plan.persistent = persistent;
    // (a persistent planned launch: max_ctas, which its launcher caps at the plan's capacity x
    // KV heads; the grid may replay with more items than planned_items now: CUDA graphs)
    plan.ctas = !persistent ? plan.grid_ctas : f.planned_items > 0 ? max_ctas : std::min<int64_t>(plan.grid_ctas, max_ctas);
    if (t.max_ctas > 0) {
      plan.reason += "; " + std::to_string(plan.ctas) + " persistent CTAs (tuning)";
    } else if (persistent) {
      plan.reason += "; keys x head dim <= " + std::to_string(max_work) + ": persistent, one CTA per SM";
    } else {
      plan.reason += short_keys ? "; causal on the 192-row tile: one CTA per work item (items of unequal length)"
                                : "; keys x head dim > " + std::to_string(max_work) + ": one CTA per work item";
    }
    if (two_q) {
      plan.reason += t.q_buffers > 0 ? ", two Q buffers (tuning)" : ", more items than CTAs: two Q buffers";
    } else if (t.q_buffers == 2) {
      plan.reason += ", one Q buffer (no second one at head dim " + std::to_string(plan.head_dim) + ")";
    }
    if (wide) {
      plan.reason += t.consumer_groups > 0 ? ", three consumer warpgroups of 64 rows (tuning)"
                                           : ", more than 1.25 waves: three consumer warpgroups of 64 rows";
    } else if (t.consumer_groups == 3) {
      plan.reason += wide_tile ? ", two consumer warpgroups (the 192-row tile has one Q buffer)"
                               : ", two consumer warpgroups (no 192-row tile at head dim " + std::to_string(plan.head_dim) + ")";
    }
    plan.pdl = t.pdl;
    // The output: each warp's 16 rows, staged in the item's Q buffer, leave by one TMA store per
    // 64 columns where those rows are whole tokens' GQA groups (the box: the group's heads x
    // 16 / group tokens), so the consumers issue a store instead of copying rows out; else
    // (and a warp's rows past the request's end) the threads copy them.
    plan.tma_output = !t.thread_output && 16 % f.group == 0;
    plan.reason += plan.tma_output ? "; output rows by TMA stores"
                   : t.thread_output ? "; output rows copied by the threads (tuning)"
                                     : "; output rows copied by the threads (the GQA group " + std::to_string(f.group) +
                                           " does not divide a warp's 16 rows)";
    // K/V by cp.async, each producer thread one page's column of 16-byte chunks (16-bit caches),
    // or fp8 codes copied into their stages, V's transposed there (the tile's fill, tile_set.h);
    // no TMA fill (DECISIONS.md: Hopper K/V by TMA at 128-byte rows, what it measured and costs).
    plan.reason += plan.config.fill == KvFill::convert
                       ? "; fp8 K/V codes copied into their stages by cp.async, V's transposed there"
                       : "; K/V by cp.async";
  } else {
    plan.pdl = t.pdl && f.cc_major >= 9 && pdl_for_grid(plan.grid_ctas, plan.cta_slots, plan.config.transposed);
    plan.l2_prefetch = plan.pdl && t.l2_prefetch && f.planned_items == 0;  // (a planned item is read from the plan)
    plan.kv_evict_first = t.kv_evict_first && f.num_splits > 1 && plan.config.fill == KvFill::tma;
    if (t.pdl && f.cc_major >= 9 && !plan.pdl) plan.reason += "; no PDL for this part of a wave";
    if (plan.kv_evict_first) plan.reason += "; split launch: K/V read evict-first";
    // Clusters of 2 splits merge in shared memory (DECISIONS.md: Cluster merge: 2 splits only).
    plan.cluster_merge = t.cluster_merge && f.cc_major >= 9 && f.num_splits == 2 && plan.config.rows == kDecodeTileRows &&
                         f.planned_items == 0;
    if (plan.cluster_merge) plan.reason += "; 2 splits: merged in a cluster";
  }
  return plan;
}

}  // namespace attnkit::flash_attn
