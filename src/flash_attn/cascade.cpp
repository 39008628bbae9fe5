#include "flash_attn/cascade.h"

#include <algorithm>

#include "attnkit/error.h"
#include "core/int_math.h"

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn cascade decision";

}  // namespace

int cascade_prefix_len(int common_prefix_len, std::span<const int32_t> query_start_loc,
                       std::span<const int32_t> seq_lens, int block_size) {
  ATTNKIT_REQUIRE(block_size > 0, kWhere, "block_size", block_size, "must be > 0");
  ATTNKIT_REQUIRE(common_prefix_len >= 0, kWhere, "common_prefix_len", common_prefix_len, "must be >= 0");
  ATTNKIT_REQUIRE(query_start_loc.size() == seq_lens.size() + 1, kWhere, "query_start_loc.size()",
                  query_start_loc.size(), "must be num_reqs + 1 = " + std::to_string(seq_lens.size() + 1));
  int prefix = common_prefix_len;
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int q = query_start_loc[r + 1] - query_start_loc[r];
    if (q <= 0) continue;  // an empty (padding) request reads nothing and needs no suffix
    prefix = std::min(prefix, std::max(0, seq_lens[r] - q));  // keeps >= 1 suffix token (q >= 1)
  }
  return prefix / block_size * block_size;
}

CascadeDecision use_cascade_attention(const CascadeInput& in) {
  ATTNKIT_REQUIRE(in.num_kv_heads > 0 && in.num_heads % in.num_kv_heads == 0, kWhere, "num_heads",
                  in.num_heads, "must be a positive multiple of num_kv_heads = " + std::to_string(in.num_kv_heads));
  ATTNKIT_REQUIRE(in.num_sms > 0, kWhere, "num_sms", in.num_sms, "must be > 0");
  ATTNKIT_REQUIRE(in.dcp_world_size >= 1, kWhere, "dcp_world_size", in.dcp_world_size, "must be >= 1");
  CascadeDecision d;
  d.prefix_len = cascade_prefix_len(in.common_prefix_len, in.query_start_loc, in.seq_lens, in.block_size);
  int num_reqs = 0;
  bool all_single_token = true;
  for (size_t r = 0; r < in.seq_lens.size(); ++r) {
    const int q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    if (q <= 0) continue;
    ++num_reqs;
    all_single_token = all_single_token && q == 1;
  }
  auto no = [&](std::string why) {
    d.use = false;
    d.reason = std::move(why);
    return d;
  };
  if (d.prefix_len < kCascadeMinPrefix)
    return no("usable common prefix of " + std::to_string(d.prefix_len) + " tokens is < " +
              std::to_string(kCascadeMinPrefix));
  if (num_reqs < kCascadeMinRequests)
    return no(std::to_string(num_reqs) + " requests share the prefix; cascade needs >= " +
              std::to_string(kCascadeMinRequests));
  if (in.alibi) return no("ALiBi biases depend on each query's position, so the prefix pass cannot be shared");
  if (in.sliding_window) return no("a sliding window does not see the whole shared prefix");
  if (in.dcp_world_size > 1) return no("decode context parallelism already shards the KV");
  const int group = in.num_heads / in.num_kv_heads;
  d.use = true;
  if (group == 1 || !all_single_token) {
    d.reason = "no GQA flash-decoding alternative (" +
               std::string(group == 1 ? "no GQA group" : "the batch has prefills") +
               "): cascade reads the prefix once";
    return d;
  }
  const int64_t prefix_tiles = ceil_div(d.prefix_len, kCascadeTile);
  const int64_t cascade_ctas = in.num_heads * ceil_div(num_reqs, kCascadeTile);
  const int64_t cascade_time = ceil_div(cascade_ctas, in.num_sms) * prefix_tiles;
  const int64_t decode_ctas = int64_t{num_reqs} * in.num_kv_heads * ceil_div(group, kCascadeTile) * prefix_tiles;
  const int64_t decode_time = ceil_div(decode_ctas, in.num_sms);
  d.use = cascade_time < decode_time;
  d.reason = "cost model: cascade " + std::to_string(cascade_time) + " vs split-KV decode " +
             std::to_string(decode_time) + " tile-waves";
  return d;
}

}  // namespace attnkit::flash_attn
