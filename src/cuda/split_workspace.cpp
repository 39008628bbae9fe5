#include "cuda/split_workspace.h"

#include <algorithm>

namespace attnkit::cuda {

namespace {

constexpr size_t align_up16(size_t n) { return (n + 15) / 16 * 16; }
constexpr size_t align_down16(size_t n) { return n / 16 * 16; }

// Counters come in groups of 4 (16 bytes) per 4 * kWorkspaceBytesPerCounter workspace bytes,
// counted over the 16-byte aligned part: then both the counter count and the bytes left for
// partials grow monotonically with the workspace size (a larger workspace always fits).
constexpr size_t kBytesPerCounterGroup = 4 * kWorkspaceBytesPerCounter;

size_t partial_bytes(int64_t rows, int head_size, int num_splits) {
  const size_t split_rows = static_cast<size_t>(num_splits) * static_cast<size_t>(rows);
  return align_up16(split_rows * static_cast<size_t>(head_size) * 4) + align_up16(split_rows * 4);
}

}  // namespace

size_t split_counter_region_bytes(size_t workspace_bytes) {
  const size_t aligned = align_down16(workspace_bytes);
  return 16 * ((aligned + kBytesPerCounterGroup - 1) / kBytesPerCounterGroup);
}

SplitWorkspaceLayout split_workspace_layout(size_t workspace_bytes, int64_t num_tokens, int num_heads,
                                            int head_size, int num_splits) {
  SplitWorkspaceLayout l;
  l.counter_bytes = split_counter_region_bytes(workspace_bytes);
  l.num_counters = static_cast<int64_t>(l.counter_bytes / 4);
  if (num_tokens < 0 || num_heads < 0 || head_size < 0 || num_splits < 1) return l;  // fits = false
  const int64_t rows = num_tokens * num_heads;
  const size_t split_rows = static_cast<size_t>(num_splits) * static_cast<size_t>(rows);
  l.o_offset = l.counter_bytes;
  l.lse_offset = l.o_offset + align_up16(split_rows * static_cast<size_t>(head_size) * 4);
  l.end = l.lse_offset + align_up16(split_rows * 4);
  l.fits = l.end <= align_down16(workspace_bytes) && l.num_counters >= rows;
  return l;
}

size_t split_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits) {
  if (num_splits <= 1 || num_tokens <= 0 || num_heads <= 0 || head_size <= 0) return 0;
  const int64_t rows = num_tokens * num_heads;
  const size_t partials = partial_bytes(rows, head_size, num_splits);
  // Start below the answer: the partials plus one counter per row, and no less than the
  // smallest size whose counter region holds `rows` counters. Then w -> partials + counter
  // region(w) climbs monotonically to the smallest fixed point, which is the answer (a few
  // steps: the counter region grows by 1/524 of w).
  const size_t groups = (static_cast<size_t>(rows) + 3) / 4;
  size_t w = std::max(align_up16(partials + 4 * static_cast<size_t>(rows)), (groups - 1) * kBytesPerCounterGroup + 16);
  while (!split_workspace_layout(w, num_tokens, num_heads, head_size, num_splits).fits)
    w = std::max(w + 16, partials + split_counter_region_bytes(w));
  return w;
}

}  // namespace attnkit::cuda
