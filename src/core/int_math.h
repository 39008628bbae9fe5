// Integer helpers shared by host and device code (constexpr: callable from kernels with
// --expt-relaxed-constexpr).
#pragma once
#include <cstdint>

namespace attnkit {

// ceil(a / b) for a >= 0, b > 0.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace attnkit
