// Division by a runtime-constant positive divisor with a precomputed multiplier (one mul.hi
// and a shift instead of a ~20-instruction integer division), exact for dividends in [0, 2^31).
// Used where a kernel divides by the block size for every key it loads, and by the GQA group
// for every packed query row it loads, masks or writes.
#pragma once
#include <cstdint>

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

#if defined(__CUDACC__)
  __device__ __forceinline__ int div(int n) const {
    return multiplier == 0 ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), multiplier) >> shift);
  }
  // n / divisor, with n % divisor in rem.
  __device__ __forceinline__ int divmod(int n, int& rem) const {
    const int q = div(n);
    rem = n - q * divisor;
    return q;
  }
#endif
};

}  // namespace attnkit::cuda
