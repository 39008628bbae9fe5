// Seeded random fills of device buffers (a counter-based hash, so large caches need no host
// round trip), for the GPU tests.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"

namespace attnkit::test {

// n elements of `dtype` at dst: bf16 / f16 / f32 values uniform in [-amp, amp); fp8 codes of
// uniform values in [-amp, amp) (saturating, never NaN). e4m3_grid: each value rounded to the
// nearest e4m3 value first (exact in every 16-bit type).
void fill_random_device(void* dst, DType dtype, int64_t n, uint64_t seed, float amp, bool e4m3_grid = false);

// n bytes of `byte` (e.g. 0xff: NaN in bf16, f16 and f32), ordered on `stream`: a kernel on a
// non-blocking stream is not ordered after work on the legacy default stream.
void poison_device(void* dst, int64_t bytes, cudaStream_t stream, uint8_t byte = 0xff);

}  // namespace attnkit::test
