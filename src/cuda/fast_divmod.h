// Division by a runtime-constant positive divisor with a precomputed multiplier (one mul.hi
// and a shift instead of a ~20-instruction integer division), exact for dividends in [0, 2^31).
// Used where a kernel divides by the block size for every key it loads, and by the GQA group
// for every packed query row it loads, masks or writes. The host computes the same quotients
// (tests/fast_divmod_test.cpp checks them against `/` and `%`).
#pragma once
#include <cstdint>

#include "attnkit/detail/host_device.h"

namespace attnkit::cuda {

struct FastDivmod {
  int divisor = 1;
  uint32_t multiplier = 0;  // 0: divisor is 1
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int d) : divisor(d) {
    if (d <= 1) return;
    uint32_t log2_ceil = 0;
    while ((1u << log2_ceil) < static_cast<uint32_t>(d)) ++log2_ceil;
    const uint32_t p = 31 + log2_ceil;
    multiplier = static_cast<uint32_t>(((uint64_t(1) << p) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    shift = p - 32;
  }

  ATTNKIT_HD int div(int n) const {
    return multiplier == 0 ? n : static_cast<int>(mul_hi(static_cast<uint32_t>(n), multiplier) >> shift);
  }
  // n / divisor, with n % divisor in rem.
  ATTNKIT_HD int divmod(int n, int& rem) const {
    const int q = div(n);
    rem = n - q * divisor;
    return q;
  }

 private:
  ATTNKIT_HD static uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
  }
};

}  // namespace attnkit::cuda
