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
  // Measured on an H200: about 1.5 resident work items per SM balance latency and the
  // per-split fixed cost (prologue, partial write, combine).
  const int64_t slots = (3 * static_cast<int64_t>(num_sms) + 1) / 2;
  const int64_t by_length = max_seq_len / kMinKeysPerSplit;
  if (items * 5 >= slots * 4 || by_length < 2) return 1;
  const int64_t splits = (slots + items - 1) / items;
  return static_cast<int>(std::clamp<int64_t>(std::min(splits, by_length), 1, kMaxSplits));
}

}  // namespace attnkit::flash_attn
