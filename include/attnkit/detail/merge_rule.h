// The LSE merge rule, written once for host and device (docs/architecture.md section 5).
#pragma once
#include <cmath>

#include "attnkit/detail/host_device.h"

namespace attnkit {

// +inf and NaN count as an empty side, like -inf.
ATTNKIT_HD float sanitize_lse(float lse) {
  return (std::isnan(lse) || std::isinf(lse)) ? -INFINITY : lse;
}

ATTNKIT_HD float merge_weights(float lse_a, float lse_b, float* wa, float* wb) {
  lse_a = sanitize_lse(lse_a);
  lse_b = sanitize_lse(lse_b);
  const float m = fmaxf(lse_a, lse_b);
  if (m == -INFINITY) {
    *wa = 0.f;
    *wb = 0.f;
    return -INFINITY;
  }
  const float ea = expf(lse_a - m), eb = expf(lse_b - m);  // exp(-inf) = 0 exactly
  const float sum = ea + eb;
  *wa = ea / sum;
  *wb = eb / sum;
  return m + logf(sum);
}

// out = wa*a + wb*b, where a side with weight 0 contributes exactly 0 even if it holds NaN.
ATTNKIT_HD float merge_value(float a, float wa, float b, float wb) {
  return (wa != 0.f ? wa * a : 0.f) + (wb != 0.f ? wb * b : 0.f);
}

}  // namespace attnkit
