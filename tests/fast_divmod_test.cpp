// cuda::FastDivmod (src/cuda/fast_divmod.h), the kernels' division by the block size and by the GQA
// group: over a grid of divisors (every one up to 1024, powers of two and their neighbours, large
// ones) and dividends (small, around multiples of the divisor, up to 2^31 - 1), quotient and
// remainder equal `/` and `%`. A failure names the worst (divisor, dividend).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/fast_divmod.h"

namespace {

using attnkit::cuda::FastDivmod;

std::vector<int> divisors() {
  std::vector<int> d;
  for (int i = 1; i <= 1024; ++i) d.push_back(i);
  for (int k = 11; k <= 30; ++k)
    for (int delta : {-1, 0, 1}) d.push_back((1 << k) + delta);
  for (int v : {3 * 1000 * 1000, 123456789, 0x7fffffff}) d.push_back(v);
  return d;
}

std::vector<int> dividends(int d) {
  std::vector<int> n;
  for (int i = 0; i < 300; ++i) n.push_back(i);
  for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}, int64_t{65536}, int64_t{0x7fffffff} / d})
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t v = k * d + delta;
      if (v >= 0 && v <= 0x7fffffff) n.push_back(static_cast<int>(v));
    }
  for (int64_t v = 0x7fffffff; v > 0x7fffffff - 300; --v) n.push_back(static_cast<int>(v));
  for (int64_t v = 1; v < 0x7fffffff; v = v * 3 + 1) n.push_back(static_cast<int>(v));
  return n;
}

TEST(FastDivmod, EqualsIntegerDivisionOverAGrid) {
  int64_t checked = 0, wrong = 0;
  std::string first;
  for (int d : divisors()) {
    const FastDivmod f(d);
    EXPECT_EQ(f.divisor, d);
    for (int n : dividends(d)) {
      int rem = -1;
      const int q = f.divmod(n, rem);
      ++checked;
      if ((q != n / d || rem != n % d || f.div(n) != q) && wrong++ == 0)
        first = "divisor " + std::to_string(d) + ", dividend " + std::to_string(n) + ": " + std::to_string(q) +
                " rem " + std::to_string(rem) + ", expected " + std::to_string(n / d) + " rem " + std::to_string(n % d);
    }
  }
  EXPECT_EQ(wrong, 0) << wrong << " of " << checked << " wrong; first: " << first;
  EXPECT_GT(checked, 400000);
}

}  // namespace
