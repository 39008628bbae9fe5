// merge_states throughput: two partial results of 16k tokens x 32 heads x 128 (as split-KV or
// cascade would produce them) merged into one, for f32 partials -> bf16 output and bf16 -> bf16.
// Bytes counted: both partials and both LSEs read, the output and its LSE written.
#include <cuda_runtime.h>

#include <string>

#include "attnkit/ops.h"
#include "bench_util.h"
#include "cuda/device_buffer.h"

namespace attnkit::bench {

void run_merge(Recorder& rec, cudaStream_t stream) {
  const int64_t T = 16384, H = 32, D = 128;
  for (DType in : {DType::f32, DType::bf16}) {
    const std::string key = "merge_states " + std::string(dtype_name(in)) + "->bf16 16k x 32 x 128";
    try {
      const int64_t es = static_cast<int64_t>(dtype_size(in));
      cuda::DeviceBuffer a(T * H * D * es), b(T * H * D * es), out(T * H * D * 2), la(T * H * 4), lb(T * H * 4),
          lo(T * H * 4);
      fill_random(a.get(), T * H * D, in, 51, stream);
      fill_random(b.get(), T * H * D, in, 52, stream);
      fill_random(la.get(), T * H, DType::f32, 53, stream);
      fill_random(lb.get(), T * H, DType::f32, 54, stream);
      const TensorView va(a.get(), in, {T, H, D}, Device::CUDA), vb(b.get(), in, {T, H, D}, Device::CUDA);
      const TensorView vo(out.get(), DType::bf16, {T, H, D}, Device::CUDA);
      const TensorView vla(la.get(), DType::f32, {H, T}, Device::CUDA), vlb(lb.get(), DType::f32, {H, T}, Device::CUDA),
          vlo(lo.get(), DType::f32, {H, T}, Device::CUDA);
      const double ms = time_ms([&] { merge_states(va, vla, vb, vlb, vo, vlo, stream); }, stream, 3, 15);
      const double bytes = 2.0 * T * H * D * es + T * H * D * 2 + 3.0 * T * H * 4;
      rec.add({"merge", key, "attnkit", "GB/s", bytes / ms / 1e6, ms, "two partials -> one, with LSE"});
    } catch (const std::exception& e) {
      rec.fail("merge", key, e.what());
    }
  }
}

}  // namespace attnkit::bench
