// The split-KV workspace layout (cuda/split_workspace.h) and its size
// (flash_attn::varlen_workspace_bytes): host code, checked without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

#include "cuda/split_workspace.h"
#include "flash_attn/varlen_launch.h"

namespace attnkit::cuda {
namespace {

struct Shape {
  int64_t tokens;
  int heads, head_size, splits;
  std::string str() const {
    return std::to_string(tokens) + " tokens x " + std::to_string(heads) + " heads x " + std::to_string(head_size) +
           ", " + std::to_string(splits) + " splits";
  }
};

SplitWorkspaceLayout layout_of(size_t bytes, const Shape& s) {
  return split_workspace_layout(bytes, s.tokens, s.heads, s.head_size, s.splits);
}

// Every region where it belongs: counters first, then o and lse partials large enough for the
// launch, nothing past the workspace.
::testing::AssertionResult well_formed(const SplitWorkspaceLayout& l, size_t bytes, const Shape& s) {
  const uint64_t split_rows = static_cast<uint64_t>(s.splits) * s.tokens * s.heads;
  if (!l.fits) return ::testing::AssertionFailure() << "does not fit " << bytes << " bytes";
  if (l.counter_bytes % 16 || l.o_offset % 16 || l.lse_offset % 16)
    return ::testing::AssertionFailure() << "unaligned: counters " << l.counter_bytes << ", o " << l.o_offset
                                         << ", lse " << l.lse_offset;
  if (l.num_counters < s.tokens * s.heads || static_cast<uint64_t>(l.num_counters) * 4 > l.counter_bytes)
    return ::testing::AssertionFailure() << l.num_counters << " counters in " << l.counter_bytes
                                         << " bytes for " << s.tokens * s.heads << " rows";
  if (l.o_offset < l.counter_bytes || l.lse_offset - l.o_offset < split_rows * s.head_size * 4 ||
      l.end - l.lse_offset < split_rows * 4 || l.end > bytes)
    return ::testing::AssertionFailure() << "regions overlap or overflow: counters [0, " << l.counter_bytes
                                         << "), o from " << l.o_offset << ", lse from " << l.lse_offset << " to "
                                         << l.end << " of " << bytes;
  return ::testing::AssertionSuccess();
}

class SplitWorkspaceGrid : public ::testing::TestWithParam<std::tuple<int64_t, int, int, int>> {};

TEST_P(SplitWorkspaceGrid, SmallestSizeThatFitsAndEveryLargerOne) {
  const auto [tokens, heads, head_size, splits] = GetParam();
  const Shape s{tokens, heads, head_size, splits};
  SCOPED_TRACE(s.str());
  const size_t w = flash_attn::varlen_workspace_bytes(tokens, heads, head_size, splits);
  EXPECT_EQ(w, split_workspace_bytes(tokens, heads, head_size, splits));
  ASSERT_GT(w, 0u);
  EXPECT_EQ(w % 16, 0u);
  EXPECT_TRUE(well_formed(layout_of(w, s), w, s));
  EXPECT_FALSE(layout_of(w - 16, s).fits) << "a smaller size fits: " << w - 16;
  EXPECT_FALSE(layout_of(w - 1, s).fits) << "a smaller size fits: " << w - 1;
  for (size_t extra : {1, 15, 16, 17, 100, 2096, 5000, 65536}) EXPECT_TRUE(well_formed(layout_of(w + extra, s), w + extra, s));
  EXPECT_TRUE(well_formed(layout_of(3 * w, s), 3 * w, s));
  // At the head sizes the varlen kernels serve (>= 64) the counters cost under 1% (plus
  // rounding) over the partials alone; smaller rows are padded to kWorkspaceBytesPerCounter.
  const uint64_t rows = static_cast<uint64_t>(tokens) * heads, split_rows = rows * splits;
  const uint64_t partials = (split_rows * head_size * 4 + 15) / 16 * 16 + (split_rows * 4 + 15) / 16 * 16;
  if (head_size >= 64)
    EXPECT_LE(w - partials, std::max<uint64_t>(4 * rows + 16, w / 128 + 32));
  else
    EXPECT_LE(w, std::max(partials + w / 128 + 32, rows * kWorkspaceBytesPerCounter + 16));
  // More tokens or more splits never need less.
  EXPECT_GE(flash_attn::varlen_workspace_bytes(tokens + 1, heads, head_size, splits), w);
  EXPECT_GE(flash_attn::varlen_workspace_bytes(tokens, heads, head_size, splits + 1), w);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SplitWorkspaceGrid,
                         ::testing::Combine(::testing::Values<int64_t>(1, 17, 250, 4096), ::testing::Values(1, 8, 64),
                                            ::testing::Values(4, 64, 96, 256), ::testing::Values(2, 3, 16, 256)));

TEST(SplitWorkspace, NothingSplitNeedsNothing) {
  EXPECT_EQ(flash_attn::varlen_workspace_bytes(4096, 32, 128, 1), 0u);
  EXPECT_EQ(flash_attn::varlen_workspace_bytes(4096, 32, 128, 0), 0u);
  EXPECT_EQ(flash_attn::varlen_workspace_bytes(0, 32, 128, 8), 0u);
  EXPECT_EQ(split_counter_region_bytes(0), 0u);
  EXPECT_EQ(split_counter_region_bytes(15), 0u);
  EXPECT_FALSE(split_workspace_layout(0, 1, 1, 64, 2).fits);
  EXPECT_FALSE(split_workspace_layout(1 << 20, 1, 1, 64, 0).fits);
}

// The counter region depends on the buffer size only, and grows with it.
TEST(SplitWorkspace, CounterRegionFollowsTheBufferSizeAlone) {
  size_t prev_bytes = 0;
  for (size_t bytes = 0; bytes < 200000; bytes += 7) {
    const size_t c = split_counter_region_bytes(bytes);
    ASSERT_GE(c, prev_bytes) << bytes;
    ASSERT_EQ(c % 16, 0u) << bytes;
    ASSERT_LE(c, bytes / kWorkspaceBytesPerCounter * 4 + 16) << bytes;
    prev_bytes = c;
    for (const Shape s : {Shape{1, 8, 128, 2}, Shape{300, 32, 64, 16}, Shape{7, 1, 256, 256}})
      ASSERT_EQ(layout_of(bytes, s).counter_bytes, c) << bytes << ", " << s.str();
  }
}

// One buffer sized for the largest launch (an engine's max_workspace_bytes) serves every
// smaller one, and no launch's partials reach the counters any other launch uses.
TEST(SplitWorkspace, OneBufferServesEverySmallerLaunch) {
  for (int head_size : {64, 128, 256})
    for (int heads : {8, 32}) {
      const int64_t max_tokens = 512;
      const int max_splits = 32;
      const size_t w = flash_attn::varlen_workspace_bytes(max_tokens, heads, head_size, max_splits);
      const size_t counters = split_counter_region_bytes(w);
      for (int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{37}, int64_t{511}, max_tokens})
        for (int splits : {2, 3, 7, 16, max_splits}) {
          const Shape s{tokens, heads, head_size, splits};
          SCOPED_TRACE(s.str() + " in a buffer for " + std::to_string(max_tokens) + " tokens, " +
                       std::to_string(max_splits) + " splits");
          ASSERT_LE(flash_attn::varlen_workspace_bytes(tokens, heads, head_size, splits), w);
          const SplitWorkspaceLayout l = layout_of(w, s);
          EXPECT_TRUE(well_formed(l, w, s));
          EXPECT_EQ(l.counter_bytes, counters);
          EXPECT_GE(l.o_offset, counters);
        }
    }
}

}  // namespace
}  // namespace attnkit::cuda
