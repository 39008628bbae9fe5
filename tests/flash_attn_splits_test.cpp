// The split-KV heuristic of the FlashAttention-style varlen kernels (host logic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "flash_attn/varlen_launch.h"

namespace attnkit::flash_attn {
namespace {

TEST(VarlenNumSplits, FillsTheGpuOnlyWhenWorkIsScarce) {
  const int sms = 132;
  for (int reqs : {1, 2, 4, 8, 16, 32, 64, 128, 256})
    for (int kv_heads : {1, 2, 8})
      for (int group : {1, 4, 8})
        for (int q : {1, 4, 64, 2048})
          for (int seq : {100, 1024, 4096, 32768}) {
            SCOPED_TRACE(testing::Message() << reqs << " reqs, " << kv_heads << " kv heads, group " << group
                                            << ", q " << q << ", seq " << seq);
            const int s = varlen_num_splits(reqs, kv_heads, group, q, std::max(seq, q), sms);
            ASSERT_GE(s, 1);
            ASSERT_LE(s, 256);
            if (s > 1) {
              EXPECT_GE(std::max(seq, q) / s, 512) << "each split reads at least 512 keys";
              const int64_t rows = int64_t(q) * group, tile = rows <= 16 ? 16 : 128;
              const int64_t items = int64_t(reqs) * kv_heads * ((rows + tile - 1) / tile);
              EXPECT_LT(items, sms) << "splits only when the work items do not fill the GPU";
            }
          }
  EXPECT_GE(varlen_num_splits(1, 8, 4, 1, 32768, 132), 16);  // batch 1, long context: split
  EXPECT_EQ(varlen_num_splits(16, 8, 4, 1, 4096, 132), 2);
  EXPECT_EQ(varlen_num_splits(64, 8, 4, 1, 8192, 132), 1);   // 512 work items: no split
  EXPECT_EQ(varlen_num_splits(1, 8, 4, 1, 600, 132), 1);     // too few keys to split
  EXPECT_EQ(varlen_num_splits(0, 8, 4, 1, 600, 132), 1);
}

}  // namespace
}  // namespace attnkit::flash_attn
