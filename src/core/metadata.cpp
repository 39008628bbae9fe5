// Batch metadata: validation, decode/prefill split and decode-first reordering (docs/architecture.md section 3).
#include "attnkit/metadata.h"

#include <algorithm>
#include <string>

#include "attnkit/dcp.h"
#include "attnkit/error.h"
#include "core/id_scan.h"

namespace attnkit {

namespace {

std::string idx(std::string_view name, int64_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

int64_t blocks_needed(int64_t seq_len, int block_size) {
  return (seq_len + block_size - 1) / block_size;
}

// The array lengths permute_requests and split_decodes_and_prefills rely on.
void check_request_arrays(std::string_view where, const CommonAttentionMetadata& md) {
  ATTNKIT_REQUIRE(md.num_reqs >= 0 && static_cast<size_t>(md.num_reqs) == md.seq_lens.size(),
                  where, "num_reqs", md.num_reqs,
                  "must equal seq_lens.size() = " + std::to_string(md.seq_lens.size()) +
                      " (call finalize())");
  ATTNKIT_REQUIRE(md.query_start_loc.size() == md.seq_lens.size() + 1, where,
                  "query_start_loc.size()", md.query_start_loc.size(),
                  "must be num_reqs + 1 = " + std::to_string(md.seq_lens.size() + 1));
  ATTNKIT_REQUIRE(md.query_start_loc[0] == 0, where, "query_start_loc[0]", md.query_start_loc[0],
                  "must be 0");
  for (int r = 0; r < md.num_reqs; ++r) {
    ATTNKIT_REQUIRE(md.query_start_loc[r + 1] >= md.query_start_loc[r], where,
                    idx("query_start_loc", r + 1), md.query_start_loc[r + 1],
                    "must be >= " + idx("query_start_loc", r) + " = " +
                        std::to_string(md.query_start_loc[r]) + " (non-decreasing)");
  }
}

}  // namespace

void BatchView::validate(std::string_view where, int64_t num_blocks, int block_size,
                         bool allow_query_longer_than_keys) const {
  ATTNKIT_REQUIRE(block_size > 0 && block_size % 16 == 0, where, "block_size", block_size,
                  "must be a positive multiple of 16");
  ATTNKIT_REQUIRE(num_blocks > 0, where, "num_blocks", num_blocks, "must be > 0");
  const int n = num_reqs();
  ATTNKIT_REQUIRE(query_start_loc.size() == static_cast<size_t>(n) + 1, where,
                  "query_start_loc.size()", query_start_loc.size(),
                  "must be num_reqs + 1 = " + std::to_string(n + 1) +
                      " (num_reqs = seq_lens.size())");
  ATTNKIT_REQUIRE(query_start_loc[0] == 0, where, "query_start_loc[0]", query_start_loc[0],
                  "must be 0");
  ATTNKIT_REQUIRE(max_blocks_per_req >= 0, where, "max_blocks_per_req", max_blocks_per_req,
                  "must be >= 0");
  const int64_t table_needed = static_cast<int64_t>(n) * max_blocks_per_req;
  ATTNKIT_REQUIRE(static_cast<int64_t>(block_table.size()) >= table_needed, where,
                  "block_table.size()", block_table.size(),
                  "must be >= num_reqs * max_blocks_per_req = " + std::to_string(table_needed));
  for (int r = 0; r < n; ++r) {
    ATTNKIT_REQUIRE(query_start_loc[r + 1] >= query_start_loc[r], where,
                    idx("query_start_loc", r + 1), query_start_loc[r + 1],
                    "must be >= " + idx("query_start_loc", r) + " = " +
                        std::to_string(query_start_loc[r]) + " (non-decreasing)");
    const int32_t seq_len = seq_lens[r];
    ATTNKIT_REQUIRE(seq_len >= 0, where, idx("seq_lens", r), seq_len, "must be >= 0");
    const int ql = query_len(r);
    ATTNKIT_REQUIRE(allow_query_longer_than_keys || ql <= seq_len, where, idx("seq_lens", r),
                    seq_len,
                    "query_len (" + std::to_string(ql) +
                        ") <= seq_len must hold for every request (the new tokens are part of "
                        "the keys)");
    const int64_t need = blocks_needed(seq_len, block_size);
    ATTNKIT_REQUIRE(need <= max_blocks_per_req, where, idx("seq_lens", r), seq_len,
                    "needs ceil(seq_len / block_size = " + std::to_string(block_size) +
                        ") = " + std::to_string(need) + " blocks but max_blocks_per_req = " +
                        std::to_string(max_blocks_per_req));
    const int32_t* row = block_row(r);
    const int64_t b = first_outside(row, need, 0, num_blocks);
    ATTNKIT_REQUIRE(b == need, where, "block_table[" + std::to_string(r) + "][" + std::to_string(b) + "]", row[b],
                    "block id < num_blocks = " + std::to_string(num_blocks) +
                        " (and >= 0) for every block a request reads");
  }
}

BatchView CommonAttentionMetadata::batch() const {
  BatchView b;
  b.query_start_loc = query_start_loc;
  b.seq_lens = seq_lens;
  b.block_table = block_table;
  b.max_blocks_per_req = max_blocks_per_req;
  return b;
}

std::vector<int32_t> CommonAttentionMetadata::key_seq_lens() const {
  if (dcp_world_size == 1) return seq_lens;
  return dcp_local_seq_lens(seq_lens, DcpShard{dcp_world_size, dcp_rank, dcp_interleave});
}

void CommonAttentionMetadata::finalize() {
  num_reqs = static_cast<int>(seq_lens.size());
  num_actual_tokens = query_start_loc.empty() ? 0 : query_start_loc.back();
  max_query_len = 0;
  for (size_t r = 0; r + 1 < query_start_loc.size(); ++r)
    max_query_len = std::max(max_query_len, query_start_loc[r + 1] - query_start_loc[r]);
  max_seq_len = 0;
  for (int32_t s : seq_lens) max_seq_len = std::max(max_seq_len, static_cast<int>(s));
}

static void check_device_copy(const TensorView& t, std::string_view name, DType dtype,
                              int64_t n) {
  if (!t.defined()) return;
  constexpr std::string_view where = "CommonAttentionMetadata";
  t.require_dtype(where, name, dtype);
  t.require_ndim(where, name, 1);
  t.require_shape(where, name, {n});
  t.require_contiguous(where, name);
}

void CommonAttentionMetadata::validate(int64_t num_blocks, int block_size) const {
  constexpr std::string_view where = "CommonAttentionMetadata";
  ATTNKIT_REQUIRE(num_reqs >= 0 && static_cast<size_t>(num_reqs) == seq_lens.size(), where,
                  "num_reqs", num_reqs,
                  "must equal seq_lens.size() = " + std::to_string(seq_lens.size()));
  ATTNKIT_REQUIRE(max_blocks_per_req >= 0, where, "max_blocks_per_req", max_blocks_per_req,
                  "must be >= 0");
  const int64_t table = static_cast<int64_t>(num_reqs) * max_blocks_per_req;
  ATTNKIT_REQUIRE(static_cast<int64_t>(block_table.size()) == table, where, "block_table.size()",
                  block_table.size(),
                  "must be num_reqs * max_blocks_per_req = " + std::to_string(table));
  DcpShard{dcp_world_size, dcp_rank, dcp_interleave}.validate(where);
  if (dcp_world_size == 1) {
    batch().validate(where, num_blocks, block_size, /*allow_query_longer_than_keys=*/false);
  } else {
    // DCP: the rank's keys address its own cache (the blocks they need); the queries sit at the
    // ends of the global lengths, which hold the new tokens.
    for (int r = 0; r < num_reqs; ++r) {
      ATTNKIT_REQUIRE(seq_lens[r] >= 0, where, idx("seq_lens", r), seq_lens[r], "must be >= 0");
      ATTNKIT_REQUIRE(r + 1 >= static_cast<int>(query_start_loc.size()) || query_len(r) <= seq_lens[r], where,
                      idx("seq_lens", r), seq_lens[r],
                      "query_len (" + std::to_string(query_len(r)) +
                          ") <= seq_len must hold for every request (the new tokens are part of the keys)");
    }
    const std::vector<int32_t> keys = key_seq_lens();
    BatchView local = batch();
    local.seq_lens = keys;
    local.validate(where, num_blocks, block_size, /*allow_query_longer_than_keys=*/true);
  }
  ATTNKIT_REQUIRE(num_actual_tokens == query_start_loc.back(), where, "num_actual_tokens",
                  num_actual_tokens,
                  "must equal query_start_loc[num_reqs] = " +
                      std::to_string(query_start_loc.back()));
  ATTNKIT_REQUIRE(slot_mapping.size() == static_cast<size_t>(num_actual_tokens), where,
                  "slot_mapping.size()", slot_mapping.size(),
                  "must equal num_actual_tokens = " + std::to_string(num_actual_tokens));
  int true_max_q = 0, true_max_s = 0;
  for (int r = 0; r < num_reqs; ++r) {
    true_max_q = std::max(true_max_q, query_len(r));
    true_max_s = std::max(true_max_s, static_cast<int>(seq_lens[r]));
  }
  ATTNKIT_REQUIRE(max_query_len == true_max_q, where, "max_query_len", max_query_len,
                  "must be the largest query_len = " + std::to_string(true_max_q));
  ATTNKIT_REQUIRE(max_seq_len == true_max_s, where, "max_seq_len", max_seq_len,
                  "must be the largest seq_len = " + std::to_string(true_max_s));
  const int64_t num_slots = num_blocks * block_size;
  for (size_t t = 0; t < slot_mapping.size(); ++t) {
    ATTNKIT_REQUIRE(slot_mapping[t] < num_slots, where, idx("slot_mapping", t), slot_mapping[t],
                    "a slot must be < num_blocks * block_size = " + std::to_string(num_slots) +
                        " (negative = padding)");
  }
  check_device_copy(query_start_loc_dev, "query_start_loc_dev", DType::i32, num_reqs + 1);
  check_device_copy(seq_lens_dev, "seq_lens_dev", DType::i32, num_reqs);
  check_device_copy(slot_mapping_dev, "slot_mapping_dev", DType::i64, num_actual_tokens);
  if (block_table_dev.defined()) {
    block_table_dev.require_dtype(where, "block_table_dev", DType::i32);
    block_table_dev.require_shape(where, "block_table_dev", {num_reqs, max_blocks_per_req});
    block_table_dev.require_last_dim_contiguous(where, "block_table_dev");
  }
}

DecodePrefillSplit split_decodes_and_prefills(const CommonAttentionMetadata& md,
                                              int decode_threshold) {
  constexpr std::string_view where = "split_decodes_and_prefills";
  ATTNKIT_REQUIRE(decode_threshold >= 1, where, "decode_threshold", decode_threshold,
                  "must be >= 1");
  check_request_arrays(where, md);
  DecodePrefillSplit s;
  int first_prefill = -1;
  for (int r = 0; r < md.num_reqs; ++r) {
    const int ql = md.query_len(r);
    const bool decode = ql <= decode_threshold;
    if (decode && first_prefill >= 0) {
      fail(where, idx("query_len", r), ql,
           "request " + std::to_string(r) + " is a decode (query_len <= decode_threshold = " +
               std::to_string(decode_threshold) + ") after prefill request " +
               std::to_string(first_prefill) + "; order the batch decodes first "
               "(decode_first_order + permute_requests)");
    }
    if (decode) {
      ++s.num_decodes;
      s.num_decode_tokens += ql;
    } else {
      if (first_prefill < 0) first_prefill = r;
      ++s.num_prefills;
      s.num_prefill_tokens += ql;
    }
  }
  return s;
}

std::vector<int> decode_first_order(const CommonAttentionMetadata& md, int decode_threshold) {
  constexpr std::string_view where = "decode_first_order";
  ATTNKIT_REQUIRE(decode_threshold >= 1, where, "decode_threshold", decode_threshold,
                  "must be >= 1");
  check_request_arrays(where, md);
  std::vector<int> perm;
  perm.reserve(md.num_reqs);
  for (int r = 0; r < md.num_reqs; ++r)
    if (md.query_len(r) <= decode_threshold) perm.push_back(r);
  for (int r = 0; r < md.num_reqs; ++r)
    if (md.query_len(r) > decode_threshold) perm.push_back(r);
  return perm;
}

CommonAttentionMetadata permute_requests(const CommonAttentionMetadata& md,
                                         std::span<const int> perm,
                                         std::vector<int>* token_perm) {
  constexpr std::string_view where = "permute_requests";
  check_request_arrays(where, md);
  const int n = md.num_reqs;
  ATTNKIT_REQUIRE(md.max_blocks_per_req >= 0 &&
                      md.block_table.size() == static_cast<size_t>(n) * md.max_blocks_per_req,
                  where, "block_table.size()", md.block_table.size(),
                  "must be num_reqs * max_blocks_per_req = " +
                      std::to_string(static_cast<int64_t>(n) * md.max_blocks_per_req));
  const int32_t num_tokens = md.query_start_loc.back();
  ATTNKIT_REQUIRE(md.slot_mapping.size() == static_cast<size_t>(num_tokens), where,
                  "slot_mapping.size()", md.slot_mapping.size(),
                  "must equal query_start_loc[num_reqs] = " + std::to_string(num_tokens));
  ATTNKIT_REQUIRE(perm.size() == static_cast<size_t>(n), where, "perm.size()", perm.size(),
                  "must equal num_reqs = " + std::to_string(n));
  std::vector<int> seen_at(n, -1);
  for (int i = 0; i < n; ++i) {
    ATTNKIT_REQUIRE(perm[i] >= 0 && perm[i] < n, where, idx("perm", i), perm[i],
                    "must be in [0, num_reqs = " + std::to_string(n) + ")");
    ATTNKIT_REQUIRE(seen_at[perm[i]] < 0, where, idx("perm", i), perm[i],
                    "appears twice (also at " + idx("perm", seen_at[perm[i]]) +
                        "); perm must be a permutation");
    seen_at[perm[i]] = i;
  }

  CommonAttentionMetadata out;
  out.max_blocks_per_req = md.max_blocks_per_req;
  out.num_reqs = n;
  out.num_actual_tokens = md.num_actual_tokens;
  out.max_query_len = md.max_query_len;
  out.max_seq_len = md.max_seq_len;
  out.causal = md.causal;
  out.dcp_world_size = md.dcp_world_size;
  out.dcp_rank = md.dcp_rank;
  out.dcp_interleave = md.dcp_interleave;
  out.query_start_loc.assign(1, 0);
  out.seq_lens.reserve(n);
  out.block_table.reserve(md.block_table.size());
  out.slot_mapping.reserve(md.slot_mapping.size());
  if (token_perm) {
    token_perm->clear();
    token_perm->reserve(num_tokens);
  }
  const auto mb = static_cast<size_t>(md.max_blocks_per_req);
  for (int i = 0; i < n; ++i) {
    const int r = perm[i];
    const int32_t begin = md.query_start_loc[r], end = md.query_start_loc[r + 1];
    out.query_start_loc.push_back(out.query_start_loc.back() + (end - begin));
    out.seq_lens.push_back(md.seq_lens[r]);
    out.block_table.insert(out.block_table.end(), md.block_table.begin() + r * mb,
                           md.block_table.begin() + (r + 1) * mb);
    for (int32_t t = begin; t < end; ++t) {
      out.slot_mapping.push_back(md.slot_mapping[t]);
      if (token_perm) token_perm->push_back(t);
    }
  }
  return out;
}

}  // namespace attnkit
