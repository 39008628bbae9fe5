// first_outside (src/core/id_scan.h), the block-id checks' scan: the first id outside [lo, hi)
// at every position of rows of every length around a vector's width, and at int32's extremes.
#include "core/id_scan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace attnkit {
namespace {

TEST(IdScan, FirstOutsideAtEveryPosition) {
  for (int n : {0, 1, 2, 7, 8, 9, 31, 33, 100}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[i] = (i * 37) % 50;  // in [0, 50)
    EXPECT_EQ(first_outside(ids.data(), n, 0, 50), n) << "n " << n;
    for (int bad = 0; bad < n; ++bad) {
      for (int32_t value : {-1, 50, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
        std::vector<int32_t> row = ids;
        row[bad] = value;
        if (bad + 1 < n) row[n - 1] = -7;  // a later offender must not be the one named
        EXPECT_EQ(first_outside(row.data(), n, 0, 50), bad) << "n " << n << ", value " << value;
      }
    }
  }
}

TEST(IdScan, BoundsAtInt32Extremes) {
  const int32_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> ids = {0, lo, hi, 5};
  EXPECT_EQ(first_outside(ids.data(), 4, lo, int64_t{hi} + 1), 4);  // every int32
  EXPECT_EQ(first_outside(ids.data(), 4, 0, int64_t{1} << 31), 1);  // ids >= 0
  EXPECT_EQ(first_outside(ids.data(), 4, lo, hi), 2);               // below 2^31 - 1
  const IdRange r = id_range(ids.data(), 4);
  EXPECT_EQ(r.min, lo);
  EXPECT_EQ(r.max, hi);
}

}  // namespace
}  // namespace attnkit
