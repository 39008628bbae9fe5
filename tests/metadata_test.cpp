// Batch metadata over random batches: validation of well-formed batches, finalize, the
// decode/prefill split, the decode-first order and permute_requests (with token_perm).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "test_util.h"

namespace attnkit {
namespace {

constexpr int64_t kNumBlocks = 512;
constexpr int kBlockSize = 16;

// A random well-formed batch: empty requests, decodes (1..threshold new tokens) and prefills
// with random cached context; distinct block ids; unused block-table entries hold garbage
// (validation must only look at the blocks a request reads); some padded slots.
CommonAttentionMetadata random_batch(std::mt19937_64& rng, int decode_threshold,
                                     int block_size = kBlockSize) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  CommonAttentionMetadata md;
  const int n = uni(0, 12);
  std::vector<int> qlens(n), seqs(n);
  for (int r = 0; r < n; ++r) {
    const int kind = uni(0, 5);
    qlens[r] = kind == 0 ? 0 : kind <= 2 ? uni(1, decode_threshold) : uni(decode_threshold + 1, 40);
    seqs[r] = qlens[r] + uni(0, 70);
  }
  int max_blocks = 0;
  for (int s : seqs) max_blocks = std::max(max_blocks, (s + block_size - 1) / block_size);
  md.max_blocks_per_req = max_blocks + uni(0, 2);
  std::vector<int32_t> ids(kNumBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next_id = 0;
  md.query_start_loc.push_back(0);
  for (int r = 0; r < n; ++r) {
    md.query_start_loc.push_back(md.query_start_loc.back() + qlens[r]);
    md.seq_lens.push_back(seqs[r]);
    const int need = (seqs[r] + block_size - 1) / block_size;
    for (int b = 0; b < md.max_blocks_per_req; ++b)
      md.block_table.push_back(b < need ? ids[next_id++] : (uni(0, 1) ? -1 : 100000));
    const int32_t* row = md.block_table.data() + static_cast<size_t>(r) * md.max_blocks_per_req;
    for (int i = 0; i < qlens[r]; ++i) {
      const int64_t pos = seqs[r] - qlens[r] + i;
      md.slot_mapping.push_back(uni(0, 9) == 0 ? -1 : slot_of(row, block_size, pos));
    }
  }
  md.finalize();
  return md;
}

bool is_decode_first(const CommonAttentionMetadata& md, int thr) {
  bool seen_prefill = false;
  for (int r = 0; r < md.num_reqs; ++r) {
    const bool decode = md.query_len(r) <= thr;
    if (decode && seen_prefill) return false;
    seen_prefill |= !decode;
  }
  return true;
}

TEST(Metadata, RandomBatchesValidateAndFinalizeComputesMaxima) {
  std::mt19937_64 rng(1);
  for (int it = 0; it < 300; ++it) {
    const int thr = 1 + it % 3;
    const auto md = random_batch(rng, thr);
    ASSERT_NO_THROW(md.validate(kNumBlocks, kBlockSize)) << "batch " << it;
    int mq = 0, ms = 0;
    for (int r = 0; r < md.num_reqs; ++r) {
      mq = std::max(mq, md.query_start_loc[r + 1] - md.query_start_loc[r]);
      ms = std::max(ms, md.seq_lens[r]);
    }
    EXPECT_EQ(md.max_query_len, mq);
    EXPECT_EQ(md.max_seq_len, ms);
    EXPECT_EQ(md.num_reqs, static_cast<int>(md.seq_lens.size()));
    EXPECT_EQ(md.num_actual_tokens, md.query_start_loc.back());
    const BatchView b = md.batch();
    EXPECT_EQ(b.num_reqs(), md.num_reqs);
    EXPECT_EQ(b.max_blocks_per_req, md.max_blocks_per_req);
    for (int r = 0; r < md.num_reqs; ++r) {
      EXPECT_EQ(b.query_len(r), md.query_len(r));
      EXPECT_EQ(b.block_row(r), md.block_table.data() + r * md.max_blocks_per_req);
    }
  }
}

TEST(Metadata, EmptyBatch) {
  CommonAttentionMetadata md;
  md.query_start_loc = {0};
  md.finalize();
  EXPECT_NO_THROW(md.validate(kNumBlocks, kBlockSize));
  const auto s = split_decodes_and_prefills(md);
  EXPECT_EQ(s.num_decodes + s.num_prefills + s.num_decode_tokens + s.num_prefill_tokens, 0);
  EXPECT_TRUE(decode_first_order(md).empty());
  EXPECT_EQ(permute_requests(md, {}).query_start_loc, std::vector<int32_t>{0});
}

// The varlen-kernel contract admits query_len > seq_len only when asked.
TEST(Metadata, BatchViewQueryLongerThanKeys) {
  const std::vector<int32_t> qsl = {0, 5, 6}, seqs = {3, 0}, table = {7, 0};
  BatchView b{qsl, seqs, table, 1};
  EXPECT_NO_THROW(b.validate("t", kNumBlocks, kBlockSize, true));
  EXPECT_TRUE(test::throws_error_with([&] { b.validate("t", kNumBlocks, kBlockSize, false); },
                                      {"seq_lens[0] = 3", "query_len (5) <= seq_len"}));
}

TEST(Metadata, SplitCountsAndOrderingRule) {
  std::mt19937_64 rng(2);
  for (int it = 0; it < 300; ++it) {
    const int thr = 1 + it % 4;
    const auto md = random_batch(rng, std::max(1, thr - it % 2));  // sometimes mismatched
    if (!is_decode_first(md, thr)) {
      EXPECT_TRUE(test::throws_error_with([&] { split_decodes_and_prefills(md, thr); },
                                          {"query_len[", "after prefill request"}));
      continue;
    }
    const auto s = split_decodes_and_prefills(md, thr);
    int nd = 0, np = 0, td = 0, tp = 0;
    for (int r = 0; r < md.num_reqs; ++r) {
      const int q = md.query_len(r);
      if (q <= thr) ++nd, td += q;
      else ++np, tp += q;
    }
    EXPECT_EQ(s.num_decodes, nd);
    EXPECT_EQ(s.num_prefills, np);
    EXPECT_EQ(s.num_decode_tokens, td);
    EXPECT_EQ(s.num_prefill_tokens, tp);
  }
}

// decode_first_order is a stable decodes-first permutation; permute_requests applies it
// consistently to every array and to token_perm; the result splits cleanly.
TEST(Metadata, ReorderPropertiesOverRandomBatches) {
  std::mt19937_64 rng(3);
  int reordered = 0;
  for (int it = 0; it < 300; ++it) {
    const int thr = 1 + it % 3;
    const auto md = random_batch(rng, thr);
    const auto perm = decode_first_order(md, thr);
    ASSERT_EQ(static_cast<int>(perm.size()), md.num_reqs);
    std::vector<int> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> iota(md.num_reqs);
    std::iota(iota.begin(), iota.end(), 0);
    ASSERT_EQ(sorted, iota) << "not a permutation";
    int k = 0;
    while (k < md.num_reqs && md.query_len(perm[k]) <= thr) ++k;
    for (int i = k; i < md.num_reqs; ++i) ASSERT_GT(md.query_len(perm[i]), thr) << "decodes first";
    for (int i = 1; i < md.num_reqs; ++i)
      if (i != k) ASSERT_LT(perm[i - 1], perm[i]) << "stable within each group";
    reordered += perm != iota;

    std::vector<int> token_perm;
    const auto out = permute_requests(md, perm, &token_perm);
    ASSERT_NO_THROW(out.validate(kNumBlocks, kBlockSize));
    EXPECT_TRUE(is_decode_first(out, thr));
    EXPECT_NO_THROW(split_decodes_and_prefills(out, thr));
    ASSERT_EQ(static_cast<int>(token_perm.size()), md.num_actual_tokens);
    for (int i = 0; i < md.num_reqs; ++i) {
      const int r = perm[i];
      EXPECT_EQ(out.seq_lens[i], md.seq_lens[r]);
      ASSERT_EQ(out.query_len(i), md.query_len(r));
      for (int b = 0; b < md.max_blocks_per_req; ++b)
        EXPECT_EQ(out.block_table[i * md.max_blocks_per_req + b],
                  md.block_table[r * md.max_blocks_per_req + b]);
      for (int j = 0; j < out.query_len(i); ++j) {
        const int nt = out.query_start_loc[i] + j;
        EXPECT_EQ(token_perm[nt], md.query_start_loc[r] + j);
        EXPECT_EQ(out.slot_mapping[nt], md.slot_mapping[token_perm[nt]]);
      }
    }
  }
  EXPECT_GT(reordered, 100) << "the random batches rarely needed reordering";
}

// Any permutation followed by its inverse restores the batch exactly.
TEST(Metadata, RandomPermutationAndInverseRoundTrip) {
  std::mt19937_64 rng(4);
  for (int it = 0; it < 200; ++it) {
    const auto md = random_batch(rng, 2);
    std::vector<int> perm(md.num_reqs);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> inv(md.num_reqs);
    for (int i = 0; i < md.num_reqs; ++i) inv[perm[i]] = i;
    std::vector<int> tp1, tp2;
    const auto a = permute_requests(md, perm, &tp1);
    const auto b = permute_requests(a, inv, &tp2);
    EXPECT_EQ(b.query_start_loc, md.query_start_loc);
    EXPECT_EQ(b.seq_lens, md.seq_lens);
    EXPECT_EQ(b.block_table, md.block_table);
    EXPECT_EQ(b.slot_mapping, md.slot_mapping);
    EXPECT_EQ(b.max_query_len, md.max_query_len);
    EXPECT_EQ(b.max_seq_len, md.max_seq_len);
    for (size_t t = 0; t < tp2.size(); ++t) EXPECT_EQ(tp1[tp2[t]], static_cast<int>(t));
  }
}

}  // namespace
}  // namespace attnkit
