// The split-KV heuristic of the varlen kernel family (host only, also in builds without CUDA).
#include <algorithm>
#include <cstdint>

#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {

namespace {
constexpr int kMinKeysPerSplit = 512;
constexpr int kMaxSplits = 256;
// Rows of the kernel's work-item tiles: 16 for decode-shaped batches, 128 otherwise
// (varlen_traits.h).
int rows_per_tile(int64_t packed_rows) { return packed_rows <= 16 ? 16 : 128; }
}  // namespace

int varlen_num_splits(int num_reqs, int num_kv_heads, int group, int max_query_len, int max_seq_len,
                      int num_sms) {
  if (num_reqs <= 0 || num_kv_heads <= 0 || group <= 0 || max_query_len <= 0 || num_sms <= 0) return 1;
  const int64_t packed_rows = static_cast<int64_t>(max_query_len) * group;
  const int64_t tiles = (packed_rows + rows_per_tile(packed_rows) - 1) / rows_per_tile(packed_rows);
  const int64_t items = static_cast<int64_t>(num_reqs) * num_kv_heads * tiles;
  // Measured on an H200 (decode, 32/8 heads, head size 128): one work item per SM balances
  // the memory parallelism against each split's fixed cost (prologue, partials, combine):
  // batch 1 x 32k keys is fastest at 16 splits, batch 16 x 4k at 2.
  const int64_t slots = num_sms;
  const int64_t by_length = max_seq_len / kMinKeysPerSplit;
  if (items >= slots || by_length < 2) return 1;
  const int64_t splits = (slots + items - 1) / items;
  return static_cast<int>(std::clamp<int64_t>(std::min(splits, by_length), 1, kMaxSplits));
}

}  // namespace attnkit::flash_attn
