// write_kv on CUDA: one thread per (token, KV head, chunk of a row) for each side (K, V);
// chunks are 8 values (16-byte loads of 16-bit inputs) or one NVFP4 block of 16 values when
// the layout is aligned, else single values. Conversions are those of convert.cuh, so the
// cache bytes equal the CPU write_kv's bit for bit. Slot policy: see kv_write.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "core/cuda_dispatch.h"
#include "cuda/convert.cuh"
#include "cuda/cuda_check.h"
#include "cuda/device_errors.h"
#include "cuda/device_guard.h"
#include "cuda/device_props.h"
#include "cuda/kv_write.h"
#include "cuda/vec_io.cuh"

namespace attnkit::cuda {

namespace {

__device__ unsigned long long g_write_kv_dropped_tokens = 0;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // values per chunk on the vectorized path of plain / fp8 caches

// One side's source rows and destination.
struct SideArgs {
  const void* src = nullptr;
  int64_t src_stride_token = 0, src_stride_head = 0;  // elements of the input dtype
  PagedKVSide dst;
  const float* scale = nullptr;  // nullptr -> 1.0
  int64_t scale_stride = 0;      // 0 for a per-tensor scale
};

struct Args {
  SideArgs side[2];  // K, V
  DType in_dtype = DType::bf16;
  const int64_t* slots = nullptr;
  int64_t slot_stride = 1;
  int64_t num_slots = 0;
  int block_size = 0, num_kv_heads = 0, head_size = 0;
  uint32_t chunks_per_row = 0;  // head_size / values per chunk
  uint32_t items = 0;           // num_tokens * num_kv_heads * chunks_per_row
};

constexpr bool fp8_cache(DType c) { return c == DType::fp8_e4m3 || c == DType::fp8_e5m2; }

// Stores N converted values into a row of a plain or fp8 cache.
template <DType C, int N>
__device__ __forceinline__ void store_values(void* base, int64_t elem, bool vec, const float (&x)[N],
                                             float scale) {
  if constexpr (fp8_cache(C)) {
    const Divider div(scale);
    uint8_t q[N];
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = fp8_quantize<C>(x[i], div);
    store_bytes<N>(static_cast<uint8_t*>(base) + elem, vec, q);
  } else {
    store_floats<N>(base, elem, C, vec, x);
  }
}

// Device twins of row_offset / scale_offset in kv_cache.h (those are host-only inlines).
// slot >= 0. 32-bit division whenever the slot fits (64-bit division is a long sequence).
__device__ __forceinline__ void split_slot(int64_t slot, int block_size, int64_t& b, int64_t& o) {
  if (slot <= 0x7FFFFFFF) {
    const uint32_t bb = static_cast<uint32_t>(slot) / static_cast<uint32_t>(block_size);
    b = bb;
    o = static_cast<uint32_t>(slot) - bb * static_cast<uint32_t>(block_size);
  } else {
    b = slot / block_size;
    o = slot - b * block_size;
  }
}
__device__ __forceinline__ int64_t row_start(const PagedKVSide& s, int block_size, int64_t slot,
                                             uint32_t head) {
  int64_t b, o;
  split_slot(slot, block_size, b, o);
  return b * s.stride_block + o * s.stride_slot + static_cast<int64_t>(head) * s.stride_head;
}
__device__ __forceinline__ int64_t scale_start(const PagedKVSide& s, int block_size, int64_t slot,
                                               uint32_t head) {
  int64_t b, o;
  split_slot(slot, block_size, b, o);
  return b * s.scale_stride_block + o * s.scale_stride_slot +
         static_cast<int64_t>(head) * s.scale_stride_head;
}

// Decodes item -> (token, head, chunk); returns the slot to write or -1 to skip. Counts a
// slot >= num_slots once per token (chunk 0 of head 0 of the K side).
struct Item {
  uint32_t token, head, chunk;
  int64_t slot;
};

__device__ __forceinline__ Item decode_item(const Args& a, uint32_t item, int side) {
  Item it;
  const uint32_t row = item / a.chunks_per_row;
  it.chunk = item - row * a.chunks_per_row;
  it.token = row / a.num_kv_heads;
  it.head = row - it.token * a.num_kv_heads;
  const int64_t slot = a.slots[static_cast<int64_t>(it.token) * a.slot_stride];
  if (slot >= a.num_slots) {
    if (side == 0 && it.head == 0 && it.chunk == 0) atomicAdd(&g_write_kv_dropped_tokens, 1ull);
    it.slot = -1;
  } else {
    it.slot = slot;  // negative = padding
  }
  return it;
}

__device__ __forceinline__ float side_scale(const SideArgs& s, uint32_t head) {
  return s.scale ? s.scale[static_cast<int64_t>(head) * s.scale_stride] : 1.f;
}

// Plain (f32/f16/bf16) and fp8 caches. N = values per chunk: kVec when aligned, else 1.
template <DType C, int N>
__global__ void __launch_bounds__(kThreads) write_kv_kernel(const Args a) {
  const int side = blockIdx.y;
  const SideArgs s = side == 0 ? a.side[0] : a.side[1];
  for (uint32_t item = blockIdx.x * kThreads + threadIdx.x; item < a.items;
       item += gridDim.x * kThreads) {
    const Item it = decode_item(a, item, side);
    if (it.slot < 0) continue;
    float x[N];
    const int64_t src = it.token * s.src_stride_token + it.head * s.src_stride_head + it.chunk * N;
    load_floats<N>(s.src, src, a.in_dtype, N > 1, x);
    const int64_t dst = row_start(s.dst, a.block_size, it.slot, it.head) + it.chunk * N;
    const float scale = fp8_cache(C) ? side_scale(s, it.head) : 1.f;
    store_values<C, N>(s.dst.base, dst, N > 1, x, scale);
  }
}

// NVFP4 caches: one thread per block of 16 values (packed bytes + one e4m3 scale byte).
template <bool Vec>
__global__ void __launch_bounds__(kThreads) write_kv_nvfp4_kernel(const Args a) {
  const int side = blockIdx.y;
  const SideArgs s = side == 0 ? a.side[0] : a.side[1];
  for (uint32_t item = blockIdx.x * kThreads + threadIdx.x; item < a.items;
       item += gridDim.x * kThreads) {
    const Item it = decode_item(a, item, side);
    if (it.slot < 0) continue;
    float x[kNvfp4BlockValues];
    const int64_t src = it.token * s.src_stride_token + it.head * s.src_stride_head +
                        it.chunk * kNvfp4BlockValues;
    load_floats<kNvfp4BlockValues>(s.src, src, a.in_dtype, Vec, x);
    uint8_t packed[kNvfp4BlockValues / 2], scale_byte;
    nvfp4_quantize_block(x, side_scale(s, it.head), packed, scale_byte);
    uint8_t* dst = static_cast<uint8_t*>(s.dst.base) +
                   row_start(s.dst, a.block_size, it.slot, it.head) +
                   it.chunk * (kNvfp4BlockValues / 2);
    store_bytes<kNvfp4BlockValues / 2>(dst, Vec, packed);
    static_cast<uint8_t*>(s.dst.scale_base)[scale_start(s.dst, a.block_size, it.slot, it.head) +
                                            it.chunk] = scale_byte;
  }
}

// ---- host side ------------------------------------------------------------------------------
constexpr std::string_view kWhere = "write_kv (cuda)";

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}
bool all_multiple(std::initializer_list<int64_t> strides_bytes, int64_t bytes) {
  for (int64_t s : strides_bytes)
    if (s % bytes != 0) return false;
  return true;
}

// Can `values` consecutive values of every input row be loaded as 16-byte vectors?
bool input_vectorizable(const TensorView& t, int values) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  if ((values * es) % 16 != 0) return false;
  return aligned(t.data, 16) && all_multiple({t.strides[0] * es, t.strides[1] * es}, 16);
}

// Can a chunk of `bytes` bytes of every cache row (at chunk-multiple offsets) be stored whole?
bool cache_vectorizable(const PagedKVSide& s, int64_t elem_bytes, int64_t bytes) {
  return aligned(s.base, bytes) &&
         all_multiple({s.stride_block * elem_bytes, s.stride_slot * elem_bytes,
                       s.stride_head * elem_bytes},
                      bytes);
}

SideArgs side_args(const TensorView& src, const PagedKVSide& dst, const TensorView& scale,
                   int num_kv_heads) {
  SideArgs s;
  s.src = src.data;
  s.src_stride_token = src.strides[0];
  s.src_stride_head = src.strides[1];
  s.dst = dst;
  if (scale.defined()) {
    s.scale = scale.ptr<const float>();
    s.scale_stride = (scale.shape[0] == 1 || num_kv_heads == 1) ? 0 : scale.strides[0];
  }
  return s;
}

template <class Kernel>
void launch(Kernel kernel, const Args& a, cudaStream_t stream) {
  const int sms = current_device_props().sm_count;
  const uint32_t blocks_needed = (a.items + kThreads - 1) / kThreads;
  const uint32_t blocks = std::min<uint32_t>(blocks_needed, static_cast<uint32_t>(sms) * 16u);
  kernel<<<dim3(blocks, 2), kThreads, 0, stream>>>(a);
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

template <DType C>
void launch_plain(const Args& a, bool vec, cudaStream_t stream) {
  if (vec) {
    launch(write_kv_kernel<C, kVec>, a, stream);
  } else {
    launch(write_kv_kernel<C, 1>, a, stream);
  }
}

void require_cuda(const TensorView& t, std::string_view name) {
  if (!t.defined()) return;
  t.require_device(kWhere, name, Device::CUDA);
}

}  // namespace

void write_kv(const TensorView& key, const TensorView& value, const PagedKV& cache,
              const TensorView& slot_mapping, const KVScales& scales, void* stream) {
  // The public write_kv validated shapes, dtypes and devices; these checks guard what the
  // kernels rely on, whoever calls them.
  ATTNKIT_REQUIRE(cache.device == Device::CUDA, kWhere, "cache.device", device_name(cache.device),
                  "must be cuda");
  require_cuda(key, "key");
  require_cuda(value, "value");
  require_cuda(slot_mapping, "slot_mapping");
  require_cuda(scales.k_scale, "k_scale");
  require_cuda(scales.v_scale, "v_scale");
  slot_mapping.require_dtype(kWhere, "slot_mapping", DType::i64);
  slot_mapping.require_ndim(kWhere, "slot_mapping", 1);
  const int64_t num_tokens = slot_mapping.shape[0];
  for (const TensorView* t : {&key, &value}) {
    const char* name = t == &key ? "key" : "value";
    t->require_shape(kWhere, name, {num_tokens, cache.num_kv_heads, cache.head_size});
    t->require_last_dim_contiguous(kWhere, name);
    ATTNKIT_REQUIRE(is_float(t->dtype), kWhere, std::string(name) + ".dtype",
                    dtype_name(t->dtype), "must be f32, f16 or bf16");
  }
  ATTNKIT_REQUIRE(value.dtype == key.dtype, kWhere, "value.dtype", dtype_name(value.dtype),
                  "must equal key.dtype = " + std::string(dtype_name(key.dtype)));
  const int chunk_values = cache.dtype == DType::nvfp4 ? kNvfp4BlockValues : kVec;
  ATTNKIT_REQUIRE(cache.head_size > 0 && cache.head_size % chunk_values == 0, kWhere,
                  "head_size", cache.head_size,
                  "must be a positive multiple of " + std::to_string(chunk_values) +
                      " for a " + std::string(dtype_name(cache.dtype)) + " cache");
  if (num_tokens == 0) return;

  Args a;
  a.in_dtype = key.dtype;
  a.slots = slot_mapping.ptr<const int64_t>();
  a.slot_stride = slot_mapping.strides[0];
  a.num_slots = cache.num_slots();
  a.block_size = cache.block_size;
  a.num_kv_heads = cache.num_kv_heads;
  a.head_size = cache.head_size;
  a.side[0] = side_args(key, cache.k, scales.k_scale, cache.num_kv_heads);
  a.side[1] = side_args(value, cache.v, scales.v_scale, cache.num_kv_heads);

  const bool in_vec = input_vectorizable(key, chunk_values) && input_vectorizable(value, chunk_values);
  bool vec;
  if (cache.dtype == DType::nvfp4) {
    // Packed bytes: 8 per block, stored as one 8-byte word when every row start allows it.
    vec = in_vec && cache_vectorizable(cache.k, 1, 8) && cache_vectorizable(cache.v, 1, 8);
    a.chunks_per_row = static_cast<uint32_t>(cache.head_size / kNvfp4BlockValues);
  } else {
    const int64_t es = static_cast<int64_t>(dtype_size(cache.dtype));
    const int64_t chunk_bytes = std::min<int64_t>(16, kVec * es);
    vec = in_vec && cache_vectorizable(cache.k, es, chunk_bytes) &&
          cache_vectorizable(cache.v, es, chunk_bytes);
    a.chunks_per_row = static_cast<uint32_t>(vec ? cache.head_size / kVec : cache.head_size);
  }
  const int64_t items = num_tokens * cache.num_kv_heads * static_cast<int64_t>(a.chunks_per_row);
  ATTNKIT_REQUIRE(items < (int64_t{1} << 31), kWhere, "num_tokens * num_kv_heads * chunks",
                  items, "must be < 2^31 per call (split the batch)");
  a.items = static_cast<uint32_t>(items);

  DeviceGuard guard(cache.device_index);
  const cudaStream_t s = as_stream(stream);
  switch (cache.dtype) {
    case DType::f32: launch_plain<DType::f32>(a, vec, s); break;
    case DType::f16: launch_plain<DType::f16>(a, vec, s); break;
    case DType::bf16: launch_plain<DType::bf16>(a, vec, s); break;
    case DType::fp8_e4m3: launch_plain<DType::fp8_e4m3>(a, vec, s); break;
    case DType::fp8_e5m2: launch_plain<DType::fp8_e5m2>(a, vec, s); break;
    case DType::nvfp4:
      if (vec) {
        launch(write_kv_nvfp4_kernel<true>, a, s);
      } else {
        launch(write_kv_nvfp4_kernel<false>, a, s);
      }
      break;
    default:
      fail(kWhere, "cache.dtype", dtype_name(cache.dtype),
           "must be one of f32, f16, bf16, fp8_e4m3, fp8_e5m2, nvfp4");
  }
  check_device_errors_after("write_kv (cuda)", stream);
}

int64_t write_kv_dropped_tokens(int device, void* stream) {
  DeviceGuard guard(device);
  unsigned long long n = 0;
  ATTNKIT_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&n, g_write_kv_dropped_tokens, sizeof(n), 0,
                                               cudaMemcpyDeviceToHost, as_stream(stream)));
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
  return static_cast<int64_t>(n);
}

int64_t take_write_kv_dropped_tokens(int device, void* stream) {
  const int64_t n = write_kv_dropped_tokens(device, stream);
  DeviceGuard guard(device);
  void* addr = nullptr;
  ATTNKIT_CUDA_CHECK(cudaGetSymbolAddress(&addr, g_write_kv_dropped_tokens));
  ATTNKIT_CUDA_CHECK(cudaMemsetAsync(addr, 0, sizeof(unsigned long long), as_stream(stream)));
  return n;
}

}  // namespace attnkit::cuda
