// The split-KV workspace layout (host side, plain C++: sized and tested without CUDA).
//
//   [ counters | o partials | lse partials | unused ]
//   counters: uint32, one per kWorkspaceBytesPerCounter bytes of the workspace; the split CTAs
//             of a work item count their arrivals there (the last one merges the partials)
//   o:        fp32 [num_splits, num_tokens, num_heads, head_size]
//   lse:      fp32 [num_splits, num_heads, num_tokens]
//
// The counter region depends on the workspace size alone, never on the launch's shape: launches
// of different shapes sharing one buffer (same pointer, same size) never write partials over
// each other's counters, so zeroing the counters once keeps them valid for the buffer's life.
#pragma once
#include <cstddef>
#include <cstdint>

namespace attnkit::cuda {

// A split launch row (token, head) takes at least 2 splits x (64 fp32 values + 1 LSE) bytes of
// partials plus its counter at the smallest head size the varlen kernels serve: 524 bytes. With
// one counter per 524 bytes, any launch whose partials fit a workspace finds a counter per row
// (smaller head sizes get the extra bytes from split_workspace_bytes).
inline constexpr size_t kWorkspaceBytesPerCounter = 2 * (64 + 1) * 4 + 4;

struct SplitWorkspaceLayout {
  size_t counter_bytes = 0;  // the counter region [0, counter_bytes): zero between launches
  int64_t num_counters = 0;
  size_t o_offset = 0, lse_offset = 0, end = 0;  // partials [o_offset, end), 16-byte aligned
  bool fits = false;  // partials within the workspace and one counter per (token, head) row
};

// Bytes of the counter region of a workspace of `workspace_bytes` bytes (a multiple of 16).
size_t split_counter_region_bytes(size_t workspace_bytes);

// The layout of a launch with these sizes in a workspace of `workspace_bytes` bytes.
SplitWorkspaceLayout split_workspace_layout(size_t workspace_bytes, int64_t num_tokens, int num_heads,
                                            int head_size, int num_splits);

// The smallest workspace (a multiple of 16 bytes) that fits a launch with these sizes; 0 when
// nothing is split (num_splits <= 1) or there are no rows. Every larger size fits too.
size_t split_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits);

}  // namespace attnkit::cuda
