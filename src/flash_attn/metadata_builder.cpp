#include "flash_attn/metadata_builder.h"

#include <algorithm>

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {

namespace {

constexpr std::string_view kWhere = "flash_attn build";

// A device copy must exist, be int32 on CUDA, contiguous, and match its host array's length.
void require_device_copy(const TensorView& dev, std::string_view name, int64_t len) {
  ATTNKIT_REQUIRE(dev.defined(), kWhere, name, "undefined",
                  "the FlashAttention kernels read the device copies of the batch arrays");
  dev.require_device(kWhere, name, Device::CUDA);
  dev.require_dtype(kWhere, name, DType::i32);
  dev.require_contiguous(kWhere, name);
  ATTNKIT_REQUIRE(dev.numel() == len, kWhere, std::string(name) + ".numel()", dev.numel(),
                  "must equal the host array's length " + std::to_string(len));
}

}  // namespace

FlashAttnMetadataBuilder::FlashAttnMetadataBuilder(const AttentionConfig& cfg, FlashAttnBuilderOptions opts)
    : cfg_(cfg), opts_(opts) {
  ATTNKIT_REQUIRE(opts.decode_threshold >= 1, kWhere, "decode_threshold", opts.decode_threshold, "must be >= 1");
  ATTNKIT_REQUIRE(opts.max_splits >= 1 && opts.max_splits <= kMaxSplits, kWhere, "max_splits",
                  opts.max_splits, "must be in [1, " + std::to_string(kMaxSplits) + "]");
}

FlashAttnMetadata FlashAttnMetadataBuilder::build_flash(const CommonAttentionMetadata& c) const {
  validate_for_builder(c, cfg_.block_size, kWhere);
  const bool dcp = c.dcp_world_size > 1;
  if (dcp) {
    // A rank's shard runs the plain kernel over its keys when every query sees all of them:
    // causal decodes (the query is the last position) or no causal mask. A longer causal query
    // sees a prefix of the global positions, which is no prefix of a rank's keys with the
    // kernels' masks (they would need the global positions: not built).
    for (int r = 0; r < c.num_reqs; ++r)
      ATTNKIT_REQUIRE(!c.causal || c.query_len(r) <= 1, kWhere, "query_len of request " + std::to_string(r),
                      c.query_len(r),
                      "must be <= 1 in a causal DCP shard (dcp_world_size " + std::to_string(c.dcp_world_size) +
                          "): longer causal queries need masks of global positions over a rank's keys, which the "
                          "GPU kernels do not have (the reference backend runs them)");
    require_device_copy(c.dcp_local_seq_lens_dev, "dcp_local_seq_lens_dev", c.num_reqs);
  }
  require_device_copy(c.query_start_loc_dev, "query_start_loc_dev", c.num_reqs + 1);
  require_device_copy(c.seq_lens_dev, "seq_lens_dev", c.num_reqs);
  require_device_copy(c.block_table_dev, "block_table_dev",
                      static_cast<int64_t>(c.num_reqs) * c.max_blocks_per_req);
  const std::vector<int32_t> keys = c.key_seq_lens();  // (the rank's, with DCP)

  FlashAttnMetadata m;
  m.num_reqs = c.num_reqs;
  m.num_actual_tokens = c.num_actual_tokens;
  m.max_query_len = c.max_query_len;
  m.max_seq_len = dcp ? (keys.empty() ? 0 : *std::max_element(keys.begin(), keys.end())) : c.max_seq_len;
  m.causal = c.causal;
  m.dcp_world_size = c.dcp_world_size;
  m.query_start_loc = c.query_start_loc_dev;
  m.seq_lens = dcp ? c.dcp_local_seq_lens_dev : c.seq_lens_dev;
  m.block_table = c.block_table_dev;
  m.max_blocks_per_req = c.max_blocks_per_req;
  m.max_block_id = max_block_id_read(c, cfg_.block_size);

  m.decode_threshold = opts_.decode_threshold;
  bool seen_prefill = false;
  bool all_single = true;
  for (int r = 0; r < c.num_reqs; ++r) {
    const int q = c.query_len(r), s = keys[r];
    if (q == 0) continue;
    all_single = all_single && q == 1;
    if (q <= m.decode_threshold) {
      ++m.num_decodes;
      m.num_decode_tokens += q;
      m.max_decode_seq_len = std::max(m.max_decode_seq_len, s);
      if (seen_prefill) m.decodes_first = false;
    } else {
      seen_prefill = true;
      ++m.num_prefills;
      m.num_prefill_tokens += q;
      m.max_prefill_query_len = std::max(m.max_prefill_query_len, q);
      m.max_prefill_seq_len = std::max(m.max_prefill_seq_len, s);
    }
  }
  m.uniform_single_token_decode = all_single && m.num_decodes > 0;

  SplitKVInput in;
  in.query_start_loc = c.query_start_loc;
  in.seq_lens = keys;
  in.num_heads = cfg_.num_heads;
  in.num_kv_heads = cfg_.num_kv_heads;
  in.num_sms = cfg_.device.sms_or_default();
  in.max_splits = opts_.max_splits;
  in.cache_dtype = cfg_.cache_dtype;
  in.head_size = cfg_.head_size;
  in.cc_major = cfg_.device.cpu ? 0 : cfg_.device.cc_major;
  // (the impl runs the generation choose_generation picks: the split rule counts its tile)
  in.hopper_kernels = choose_generation(cfg_).chosen == Generation::hopper;
  m.split = decide_num_splits(in);
  m.workspace_bytes = m.split.num_splits > 1
                          ? varlen_workspace_bytes(c.num_actual_tokens, cfg_.num_heads,
                                                   cfg_.head_size, m.split.num_splits)
                          : 0;
  return m;
}

CascadeDecision FlashAttnMetadataBuilder::cascade_decision(const CommonAttentionMetadata& c,
                                                          int common_prefix_len, int dcp_world_size) const {
  validate_for_builder(c, cfg_.block_size, "flash_attn cascade decision");
  CascadeInput in;
  in.common_prefix_len = common_prefix_len;
  in.query_start_loc = c.query_start_loc;
  in.seq_lens = c.seq_lens;
  in.num_heads = cfg_.num_heads;
  in.num_kv_heads = cfg_.num_kv_heads;
  in.block_size = cfg_.block_size;
  in.alibi = cfg_.features.alibi;
  in.sliding_window = cfg_.features.sliding_window;
  in.dcp_world_size = dcp_world_size;
  in.num_sms = cfg_.device.sms_or_default();
  return use_cascade_attention(in);
}

std::unique_ptr<BackendMetadata> FlashAttnMetadataBuilder::build(const CommonAttentionMetadata& common) {
  return std::make_unique<FlashAttnMetadata>(build_flash(common));
}

}  // namespace attnkit::flash_attn
