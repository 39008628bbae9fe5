// Shared by the FlashInfer-style backend's host tests (flashinfer_backend_test.cpp,
// flashinfer_engine_test.cpp): a GPU configuration and random valid batches.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/metadata.h"
#include "test_util.h"

namespace attnkit::flashinfer {

inline AttentionConfig config(int heads, int kv_heads, int block, DeviceSpec dev = DeviceSpec::Cuda(9, 0)) {
  return test::model_config(heads, kv_heads, block, dev);
}

// A valid batch: distinct random block ids, slots of the new tokens from the block table.
inline CommonAttentionMetadata make_batch(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv,
                                   int block, std::mt19937_64& rng, bool causal = true) {
  CommonAttentionMetadata md;
  md.causal = causal;
  md.query_start_loc = {0};
  for (int32_t q : qo) md.query_start_loc.push_back(md.query_start_loc.back() + q);
  md.seq_lens = kv;
  int max_blocks = 1;
  for (int32_t s : kv) max_blocks = std::max(max_blocks, (s + block - 1) / block);
  md.max_blocks_per_req = max_blocks + static_cast<int>(rng() % 3);  // rows wider than needed
  std::vector<int32_t> ids(static_cast<size_t>(kv.size()) * md.max_blocks_per_req);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  md.block_table = ids;
  for (size_t r = 0; r < kv.size(); ++r)
    for (int32_t i = 0; i < qo[r]; ++i) {
      const int64_t pos = kv[r] - qo[r] + i;
      md.slot_mapping.push_back(int64_t{md.block_table[r * md.max_blocks_per_req + pos / block]} * block + pos % block);
    }
  md.finalize();
  return md;
}

}  // namespace attnkit::flashinfer
