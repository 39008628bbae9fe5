#include <gtest/gtest.h>

#include <cmath>

#include "attnkit/dtype.h"

TEST(DTypeSmoke, BasicRoundTrip) {
  EXPECT_EQ(attnkit::e4m3_to_float(attnkit::float_to_e4m3(1.0f)), 1.0f);
}
