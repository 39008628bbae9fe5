#include "flash_attn/split_kv.h"

#include <algorithm>
#include <vector>

#include "attnkit/error.h"
#include "core/int_math.h"

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn split-KV decision";


void validate(const SplitKVInput& in) {
  ATTNKIT_REQUIRE(in.num_kv_heads > 0 && in.num_heads % in.num_kv_heads == 0, kWhere, "num_heads",
                  in.num_heads, "must be a positive multiple of num_kv_heads = " + std::to_string(in.num_kv_heads));
  ATTNKIT_REQUIRE(in.query_start_loc.size() == in.seq_lens.size() + 1, kWhere,
                  "query_start_loc.size()", in.query_start_loc.size(),
                  "must be num_reqs + 1 = " + std::to_string(in.seq_lens.size() + 1));
  ATTNKIT_REQUIRE(in.num_sms > 0, kWhere, "num_sms", in.num_sms, "must be > 0");
  ATTNKIT_REQUIRE(in.max_splits >= 1, kWhere, "max_splits", in.max_splits, "must be >= 1");
}

}  // namespace

LaunchFacts split_kv_facts(const SplitKVInput& in) {
  validate(in);
  LaunchFacts f;
  f.cc_major = in.cc_major;
  f.sm_count = in.num_sms;
  f.hopper_kernels = in.hopper_kernels;
  f.head_size = in.head_size;
  f.cache = is_fp8(in.cache_dtype) ? CacheKind::fp8 : CacheKind::b16;  // (the split rule: FlashAttention-style caches)
  f.num_reqs = static_cast<int>(in.seq_lens.size());
  f.num_kv_heads = in.num_kv_heads;
  f.group = in.num_heads / in.num_kv_heads;
  for (size_t r = 0; r + 1 < in.query_start_loc.size(); ++r) {
    const int32_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    ATTNKIT_REQUIRE(q >= 0, kWhere, "query_len[" + std::to_string(r) + "]", q, "must be >= 0");
    f.max_query_len = std::max(f.max_query_len, q);
    if (q > 0) f.max_seq_len = std::max(f.max_seq_len, in.seq_lens[r]);
  }
  return f;
}

TileConfig split_kv_tile(const SplitKVInput& in) {
  const LaunchFacts f = split_kv_facts(in);
  const TileId tile = split_rule_tile(f);
  return tile_config(tile, tile_head_dim(tile, f.head_size, f.cache), f.cache);
}

int64_t split_kv_work_items(const SplitKVInput& in) {
  const TileConfig tile = split_kv_tile(in);
  const int group = in.num_heads / in.num_kv_heads;
  int64_t items = 0;
  for (size_t r = 0; r + 1 < in.query_start_loc.size(); ++r) {
    const int64_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    items += in.num_kv_heads * ceil_div(q * group, tile.rows);
  }
  return items;
}

SplitKVDecision decide_num_splits(const SplitKVInput& in) {
  SplitKVDecision d;
  const LaunchFacts facts = split_kv_facts(in);
  const TileConfig tile = split_kv_tile(in);  // (a split launch runs the same tile: its KV tiles too)
  d.work_items = split_kv_work_items(in);
  d.cta_slots = static_cast<int64_t>(in.num_sms) * tile.ctas_per_sm;
  if (d.work_items == 0) {
    d.reason = "no query tokens: nothing to split";
    return d;
  }
  if (tile.o_slices > 1) {
    d.reason = "head dim " + std::to_string(kernel_head_dim(facts.head_size, facts.cache)) +
               ": output-column slices, which do not split";
    return d;
  }
  const int32_t max_kv = facts.max_seq_len;  // longest KV among requests that have queries
  if (2 * d.work_items > d.cta_slots) {
    d.reason = std::to_string(d.work_items) + " work items fill more than half of " +
               std::to_string(d.cta_slots) + " CTA slots";
    // Batches of decode tiles, one to two waves: split when the last wave would run mostly empty.
    const bool decode_only = tile.rows == kDecodeTileRows;
    if (decode_only && d.work_items <= 2 * d.cta_slots) {
      auto fill = [&](int64_t s) {  // busy share of the slot-waves W * s CTAs take
        const int64_t ctas = d.work_items * s;
        return static_cast<double>(ctas) / static_cast<double>(ceil_div(ctas, d.cta_slots) * d.cta_slots);
      };
      const int64_t cap = std::min<int64_t>(
          {int64_t{kMaxWaveSplits}, int64_t{in.max_splits}, static_cast<int64_t>(max_kv / kMinKVPerWaveSplit)});
      int64_t best = 1;
      for (int64_t s = 2; s <= cap; ++s)
        if (fill(s) > fill(best) + 1e-9) best = s;
      if (best > 1 && fill(best) >= fill(1) + kMinWaveFillGain) {
        d.num_splits = static_cast<int>(best);
        d.reason += ", but only " + std::to_string(static_cast<int>(100 * fill(1))) + "% of their waves: " +
                    std::to_string(best) + " splits fill " + std::to_string(static_cast<int>(100 * fill(best))) + "%";
      }
    }
    return d;
  }
  // At most one wave of CTAs.
  const int64_t by_fill = d.cta_slots / d.work_items;
  const int64_t by_kv = max_kv / kMinKVPerSplit;
  int64_t s = std::min({by_fill, static_cast<int64_t>(kMaxUsefulSplits), static_cast<int64_t>(in.max_splits), by_kv});
  if (s <= 1) {
    d.reason = in.max_splits == 1 ? "splitting disabled by the caller (max_splits = 1)"
                                  : "KV of " + std::to_string(max_kv) + " tokens is too short to split (each split needs >= " +
                                        std::to_string(kMinKVPerSplit) + ")";
    return d;
  }
  // Drop splits that do not shorten the longest split (in KV tiles).
  const int64_t tiles = ceil_div(max_kv, tile.keys);
  while (s > 1 && ceil_div(tiles, s - 1) == ceil_div(tiles, s)) --s;
  d.num_splits = static_cast<int>(s);
  d.reason = std::to_string(d.work_items) + " work items for " + std::to_string(d.cta_slots) +
             " CTA slots: " + std::to_string(s) + " splits of <= " +
             std::to_string(ceil_div(tiles, s) * tile.keys) + " KV tokens (" + tile.name + " tile)";
  return d;
}

SplitKVDecision decide_num_splits_uniform(int num_reqs, int q_len, int kv_len, SplitKVInput shape) {
  ATTNKIT_REQUIRE(num_reqs >= 0, kWhere, "num_reqs", num_reqs, "must be >= 0");
  ATTNKIT_REQUIRE(q_len >= 0 && kv_len >= 0, kWhere, "q_len / kv_len",
                  std::to_string(q_len) + " / " + std::to_string(kv_len), "must be >= 0");
  std::vector<int32_t> qsl(static_cast<size_t>(num_reqs) + 1), seq(static_cast<size_t>(num_reqs), kv_len);
  for (int i = 0; i <= num_reqs; ++i) qsl[i] = i * q_len;
  shape.query_start_loc = qsl;
  shape.seq_lens = seq;
  return decide_num_splits(shape);
}

}  // namespace attnkit::flash_attn
