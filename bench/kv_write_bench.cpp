// write_kv throughput: 64k new tokens (a large prefill chunk) of 8 KV heads x 128 into a paged
// cache with scattered blocks, bf16 input, for each cache dtype. Bytes counted: K/V read,
// slot_mapping read, cache rows (and nvfp4 scales) written.
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"

namespace attnkit::bench {

void run_kv_write(Recorder& rec, cudaStream_t stream) {
  const int64_t tokens = 65536;
  const int heads = 8, hd = 128, bs = 16;
  const int64_t num_blocks = tokens / bs + 64;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = int64_t{perm[t / bs]} * bs + t % bs;
  cuda::DeviceBuffer d_slots(tokens * 8), d_in(2 * tokens * heads * hd * 2), d_scale(4);
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(d_slots.get(), slots.data(), tokens * 8, cudaMemcpyHostToDevice, stream));
  fill_random(d_in.get(), 2 * tokens * heads * hd, DType::bf16, 11, stream);
  const float scale = 1.f / 64;
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(d_scale.get(), &scale, 4, cudaMemcpyHostToDevice, stream));
  const TensorView key(d_in.get(), DType::bf16, {tokens, heads, hd}, Device::CUDA);
  const TensorView value(d_in.as<uint16_t>() + tokens * heads * hd, DType::bf16, {tokens, heads, hd}, Device::CUDA);
  const TensorView slot_view(d_slots.get(), DType::i64, {tokens}, Device::CUDA);
  for (DType cd : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
    const std::string key_name = "write_kv " + std::string(dtype_name(cd)) + " 64k tok h8 d128 NHD";
    try {
      KVCacheSpec spec;
      spec.num_blocks = num_blocks;
      spec.block_size = bs;
      spec.num_kv_heads = heads;
      spec.head_size = hd;
      spec.cache_dtype = cd;
      cuda::DeviceBuffer cache(spec.total_bytes());
      const PagedKV kv = spec.view(TensorView(cache.get(), spec.storage_dtype(),
                                              {spec.total_bytes() / int64_t(dtype_size(spec.storage_dtype()))}, Device::CUDA));
      KVScales scales;
      if (cd != DType::bf16) scales = {TensorView(d_scale.get(), DType::f32, {1}, Device::CUDA), TensorView(d_scale.get(), DType::f32, {1}, Device::CUDA)};
      const double ms = time_ms([&] { write_kv(key, value, kv, slot_view, scales, stream); }, stream, 3, 15);
      const double written = static_cast<double>(tokens) / bs * spec.bytes_per_block();
      const double bytes = 2.0 * tokens * heads * hd * 2 + tokens * 8 + written;
      rec.add({"kv_write", key_name, "attnkit", "GB/s", bytes / ms / 1e6, ms, "bf16 input, scattered blocks"});
    } catch (const std::exception& e) {
      rec.fail("kv_write", key_name, e.what());
    }
  }
}

}  // namespace attnkit::bench
