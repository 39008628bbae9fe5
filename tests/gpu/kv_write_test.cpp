// write_kv on CUDA against the CPU write_kv, byte for byte over the whole cache (so rows that
// must not be written are checked too): layouts NHD / HND / strided views / unaligned views,
// f32/f16/bf16 inputs (contiguous and as slices of a fused QKV tensor), every cache dtype,
// per-tensor and per-head scales, padding slots, block and head sizes; plus the out-of-range
// slot policy (dropped and counted, never written) and CUDA-graph capture.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/kv_cache.h"
#include "cuda/kv_write.h"
#include "infra_test_util.h"

namespace attnkit::test {
namespace {

enum class CacheView { NHD, HND, Strided, Unaligned };
const char* view_name(CacheView v) {
  switch (v) {
    case CacheView::NHD: return "NHD";
    case CacheView::HND: return "HND";
    case CacheView::Strided: return "Strided";
    default: return "Unaligned";
  }
}

enum class ScaleMode { None, PerTensor, PerHead };
const char* scale_name(ScaleMode s) {
  return s == ScaleMode::None ? "NoScale" : s == ScaleMode::PerTensor ? "PerTensor" : "PerHead";
}

// Geometry of one cache and the bytes that hold it, plus how to view them on either device.
struct CacheLayout {
  CacheView view;
  KVCacheSpec spec;
  int64_t bytes = 0;
  // Strided / unaligned views: element strides of [block, slot, head] and V's element offset.
  int64_t s_block = 0, s_slot = 0, s_head = 0, v_offset = 0;

  PagedKV make(void* base, Device dev) const {
    if (view == CacheView::NHD || view == CacheView::HND)
      return spec.view(TensorView(base, spec.storage_dtype(), {bytes / int64_t(dtype_size(spec.storage_dtype()))}, dev));
    const DType t = spec.cache_dtype;
    const int64_t es = static_cast<int64_t>(dtype_size(t));
    auto side = [&](int64_t off) {
      return TensorView(static_cast<uint8_t*>(base) + off * es, t,
                        {spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size},
                        {s_block, s_slot, s_head, 1}, dev);
    };
    return paged_kv_from_views(side(0), side(v_offset));
  }
};

CacheLayout make_layout(CacheView view, DType cache_dtype, int64_t num_blocks, int block_size,
                        int heads, int head_size) {
  CacheLayout l;
  l.view = view;
  l.spec.num_blocks = num_blocks;
  l.spec.block_size = block_size;
  l.spec.num_kv_heads = heads;
  l.spec.head_size = head_size;
  l.spec.cache_dtype = cache_dtype;
  l.spec.layout = view == CacheView::HND ? KVLayout::HND : KVLayout::NHD;
  if (view == CacheView::NHD || view == CacheView::HND) {
    l.bytes = l.spec.total_bytes();
    return l;
  }
  // Padded rows: aligned pads keep 16-byte vectors possible, odd pads force the scalar path.
  const bool aligned = view == CacheView::Strided;
  l.s_head = head_size + (aligned ? 16 : 3);
  l.s_slot = heads * l.s_head + (aligned ? 32 : 1);
  l.s_block = block_size * l.s_slot + (aligned ? 64 : 5);
  l.v_offset = num_blocks * l.s_block + (aligned ? 128 : 7);
  l.bytes = (l.v_offset + num_blocks * l.s_block) * static_cast<int64_t>(dtype_size(cache_dtype));
  return l;
}

// K/V inputs: either two contiguous [T, H, D] tensors or slices of one fused [T, Hq+2H, D]
// tensor (row stride (Hq + 2H) * D; with `odd`, shifted by one element to break alignment).
struct Inputs {
  DType dtype;
  int64_t tokens;
  int heads, head_size;
  bool fused, odd;
  std::vector<uint8_t> bytes;
  int64_t k_off = 0, v_off = 0, row_stride = 0;

  TensorView key(void* base, Device dev) const { return view(base, k_off, dev); }
  TensorView value(void* base, Device dev) const { return view(base, v_off, dev); }
  TensorView view(void* base, int64_t off, Device dev) const {
    const int64_t es = static_cast<int64_t>(dtype_size(dtype));
    return TensorView(static_cast<uint8_t*>(base) + off * es, dtype, {tokens, heads, head_size},
                      {row_stride, head_size, 1}, dev);
  }
};

// Values: normal * a per-row magnitude that reaches far past the fp8 and nvfp4 ranges, with
// specials (NaN, +-inf, -0, tiny) sprinkled in.
float sample(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  const uint32_t r = rng() % 1000;
  if (r == 0) return NAN;
  if (r == 1) return INFINITY;
  if (r == 2) return -INFINITY;
  if (r == 3) return -0.f;
  if (r == 4) return std::ldexp(normal(rng), -30);
  const int e = static_cast<int>(rng() % 24) - 8;
  return normal(rng) * std::ldexp(1.f, e);
}

Inputs make_inputs(DType dtype, int64_t tokens, int heads, int head_size, bool fused, bool odd,
                   uint64_t seed) {
  Inputs in{dtype, tokens, heads, head_size, fused, odd, {}};
  const int q_heads = 2 * heads;
  if (fused) {
    in.row_stride = static_cast<int64_t>(q_heads + 2 * heads) * head_size + (odd ? 1 : 0);
    in.k_off = static_cast<int64_t>(q_heads) * head_size + (odd ? 1 : 0);
    in.v_off = in.k_off + static_cast<int64_t>(heads) * head_size;
  } else {
    in.row_stride = static_cast<int64_t>(heads) * head_size;
    in.k_off = 0;
    in.v_off = tokens * in.row_stride;
  }
  const int64_t elems = fused ? tokens * in.row_stride + 1 : 2 * tokens * in.row_stride;
  const size_t es = dtype_size(dtype);
  in.bytes.resize(elems * es);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i < elems; ++i) {
    const float x = sample(rng);
    if (dtype == DType::f32) {
      std::memcpy(&in.bytes[i * 4], &x, 4);
    } else {
      const uint16_t h = dtype == DType::f16 ? float_to_f16_bits(x) : float_to_bf16_bits(x);
      std::memcpy(&in.bytes[i * 2], &h, 2);
    }
  }
  return in;
}

// Unique random slots in [0, num_slots), about a fifth of them padding (negative).
std::vector<int64_t> make_slots(int64_t tokens, int64_t num_slots, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = (rng() % 5 == 0) ? -1 - int64_t(rng() % 3) : all[t];
  return slots;
}

std::vector<float> make_scales(ScaleMode mode, int heads, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(0.05f, 4.f);
  if (mode == ScaleMode::None) return {};
  std::vector<float> s(mode == ScaleMode::PerTensor ? 1 : heads);
  for (auto& x : s) x = u(rng);
  return s;
}

// Compares whole caches (memcmp first: they are up to 84 MB); reports how many bytes differ and
// the first one.
::testing::AssertionResult same_bytes(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  if (gpu.empty() || std::memcmp(gpu.data(), cpu.data(), gpu.size()) == 0) return ::testing::AssertionSuccess();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (gpu[i] != cpu[i] && bad++ == 0) first = static_cast<int64_t>(i);
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << gpu.size()
                                       << " cache bytes differ; first at byte " << first
                                       << ": gpu 0x" << std::hex << int(gpu[first]) << " cpu 0x"
                                       << int(cpu[first]) << std::dec;
}

struct KvWriteCase {
  CacheView view;
  DType cache_dtype, in_dtype;
  bool fused;
};

std::string case_name(const ::testing::TestParamInfo<KvWriteCase>& info) {
  const KvWriteCase& c = info.param;
  return std::string(view_name(c.view)) + "_" + std::string(dtype_name(c.cache_dtype)) + "_from_" +
         std::string(dtype_name(c.in_dtype)) + (c.fused ? "_fused" : "");
}

std::vector<KvWriteCase> all_cases() {
  std::vector<KvWriteCase> cases;
  for (CacheView v : {CacheView::NHD, CacheView::HND, CacheView::Strided, CacheView::Unaligned})
    for (DType c : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4})
      for (DType in : {DType::f32, DType::f16, DType::bf16})
        for (bool fused : {false, true}) {
          if (c == DType::nvfp4 && (v == CacheView::Strided || v == CacheView::Unaligned)) continue;
          // Fused inputs once per cache dtype and view suffice (with bf16, the common input).
          if (fused && in != DType::bf16) continue;
          cases.push_back({v, c, in, fused});
        }
  return cases;
}

// One write on both devices from identical starting bytes; returns both caches.
struct Outcome {
  std::vector<uint8_t> gpu, cpu;
};

Outcome run_both(const CacheLayout& layout, const Inputs& in, const std::vector<int64_t>& slots_gpu,
                 const std::vector<int64_t>& slots_cpu, int slot_stride, const std::vector<float>& ks,
                 const std::vector<float>& vs, void* stream) {
  Outcome o;
  o.cpu.resize(layout.bytes);
  poison(o.cpu, 7);
  auto d_cache = to_device(o.cpu);
  auto d_in = to_device(in.bytes);
  // Slots stored with a stride: element t lives at t * slot_stride.
  std::vector<int64_t> spread_gpu(slots_gpu.size() * slot_stride, 12345), spread_cpu = spread_gpu;
  for (size_t t = 0; t < slots_gpu.size(); ++t) {
    spread_gpu[t * slot_stride] = slots_gpu[t];
    spread_cpu[t * slot_stride] = slots_cpu[t];
  }
  auto d_slots = to_device(spread_gpu);
  auto d_ks = to_device(ks), d_vs = to_device(vs);
  const int64_t T = static_cast<int64_t>(slots_gpu.size());
  auto slot_view = [&](void* p, Device dev) { return TensorView(p, DType::i64, {T}, {slot_stride}, dev); };
  auto scale_view = [](const std::vector<float>& s, void* p, Device dev) {
    return s.empty() ? TensorView() : TensorView(p, DType::f32, {int64_t(s.size())}, dev);
  };

  std::vector<uint8_t> in_bytes = in.bytes;
  std::vector<float> ks_h = ks, vs_h = vs;
  write_kv(in.key(in_bytes.data(), Device::CPU), in.value(in_bytes.data(), Device::CPU),
           layout.make(o.cpu.data(), Device::CPU), slot_view(spread_cpu.data(), Device::CPU),
           KVScales{scale_view(ks_h, ks_h.data(), Device::CPU), scale_view(vs_h, vs_h.data(), Device::CPU)});
  write_kv(in.key(d_in.get(), Device::CUDA), in.value(d_in.get(), Device::CUDA),
           layout.make(d_cache.get(), Device::CUDA), slot_view(d_slots.get(), Device::CUDA),
           KVScales{scale_view(ks, d_ks.get(), Device::CUDA), scale_view(vs, d_vs.get(), Device::CUDA)},
           stream);
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  o.gpu = to_host<uint8_t>(d_cache, layout.bytes);
  return o;
}

class KvWriteGrid : public GpuParamTest<KvWriteCase> {};

TEST_P(KvWriteGrid, GpuEqualsCpuByteForByte) {
  const KvWriteCase c = GetParam();
  const bool quantized = is_fp8(c.cache_dtype) || c.cache_dtype == DType::nvfp4;
  uint64_t seed = 1;
  for (int block_size : {16, 32, 1024})  // (1024: the FlashInfer-style backend's largest page)
    for (int head_size : {40, 64, 80, 128, 512})  // (the attention kernels' sizes, padded ones too)
      for (int heads : {1, 4})
        for (ScaleMode sm : {ScaleMode::None, ScaleMode::PerTensor, ScaleMode::PerHead}) {
          if (c.cache_dtype == DType::nvfp4 && head_size % 16 != 0) continue;  // (16-value blocks)
          if (!quantized && sm == ScaleMode::PerHead) continue;
          if (c.cache_dtype == DType::nvfp4 && sm == ScaleMode::PerHead) continue;
          ++seed;
          SCOPED_TRACE(::testing::Message() << "block_size " << block_size << ", head_size "
                                            << head_size << ", kv heads " << heads << ", "
                                            << scale_name(sm) << ", seed " << seed);
          const int64_t num_blocks = 5, tokens = 37 + (seed % 5);
          const CacheLayout layout = make_layout(c.view, c.cache_dtype, num_blocks, block_size, heads, head_size);
          const Inputs in = make_inputs(c.in_dtype, tokens, heads, head_size, c.fused, c.fused && (seed & 1), seed);
          const auto slots = make_slots(tokens, layout.spec.num_blocks * block_size, seed);
          const auto ks = make_scales(sm, heads, seed * 3), vs = make_scales(sm, heads, seed * 5);
          const int slot_stride = (seed % 3 == 0) ? 2 : 1;
          const Outcome o = run_both(layout, in, slots, slots, slot_stride, ks, vs, stream());
          ASSERT_TRUE(same_bytes(o.gpu, o.cpu));
        }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvWriteGrid, ::testing::ValuesIn(all_cases()), case_name);

class KvWritePolicy : public GpuTest {};

// Slots >= num_slots are skipped (the rest of the batch is written as the CPU writes it with
// those tokens as padding) and counted once per token; nothing outside the cache is touched
// (compute-sanitizer runs this test).
TEST_F(KvWritePolicy, OutOfRangeSlotsAreDroppedAndCounted) {
  for (DType cache_dtype : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
    SCOPED_TRACE(dtype_name(cache_dtype));
    const CacheLayout layout = make_layout(CacheView::NHD, cache_dtype, 4, 16, 2, 64);
    const int64_t num_slots = layout.spec.num_blocks * layout.spec.block_size, tokens = 40;
    const Inputs in = make_inputs(DType::bf16, tokens, 2, 64, false, false, 99);
    auto slots = make_slots(tokens, num_slots, 5);
    auto cpu_slots = slots;
    int64_t dropped = 0;
    const int64_t bad_values[] = {num_slots, num_slots + 1, int64_t{1} << 40, INT64_MAX};
    for (int64_t t = 0; t < tokens; t += 6) {
      slots[t] = bad_values[(t / 6) % 4];
      cpu_slots[t] = -1;
      ++dropped;
    }
    cuda::take_write_kv_dropped_tokens(0, stream());
    const Outcome o = run_both(layout, in, slots, cpu_slots, 1, {0.5f}, {2.f}, stream());
    EXPECT_TRUE(same_bytes(o.gpu, o.cpu));
    EXPECT_EQ(cuda::write_kv_dropped_tokens(0, stream()), dropped);
    EXPECT_EQ(cuda::take_write_kv_dropped_tokens(0, stream()), dropped);
    EXPECT_EQ(cuda::write_kv_dropped_tokens(0, stream()), 0);
  }
}

// Large batch (16k tokens, about a fifth of them padding slots): many blocks per launch, the
// grid-stride loop exercised.
TEST_F(KvWritePolicy, LargeBatchMatchesCpu) {
  const int64_t tokens = 16384, num_blocks = 1100;
  const Inputs in = make_inputs(DType::bf16, tokens, 8, 128, false, false, 3);  // (33.5 M values: made once)
  const std::vector<int64_t> slots = make_slots(tokens, num_blocks * 16, 11);
  for (DType cache_dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(dtype_name(cache_dtype));
    const CacheLayout layout = make_layout(CacheView::HND, cache_dtype, num_blocks, 16, 8, 128);
    const Outcome o = run_both(layout, in, slots, slots, 1, {0.25f}, {0.125f}, stream());
    EXPECT_TRUE(same_bytes(o.gpu, o.cpu));
  }
}

// write_kv records into a CUDA graph (its launches take everything from device memory).
TEST_F(KvWritePolicy, CapturesIntoCudaGraph) {
  const CacheLayout layout = make_layout(CacheView::NHD, DType::fp8_e4m3, 6, 16, 4, 128);
  const int64_t tokens = 50;
  const Inputs in = make_inputs(DType::bf16, tokens, 4, 128, false, false, 21);
  const auto slots = make_slots(tokens, layout.spec.num_blocks * 16, 22);
  std::vector<uint8_t> cpu(layout.bytes);
  poison(cpu, 3);
  auto d_cache = to_device(cpu);
  auto d_in = to_device(in.bytes);
  auto d_slots = to_device(slots);
  std::vector<float> ks = {0.5f, 1.f, 2.f, 4.f}, vs = {3.f, 0.25f, 1.5f, 0.75f};
  auto d_ks = to_device(ks), d_vs = to_device(vs);
  const PagedKV dcache = layout.make(d_cache.get(), Device::CUDA);
  const KVScales dscales{TensorView(d_ks.get(), DType::f32, {4}, Device::CUDA),
                         TensorView(d_vs.get(), DType::f32, {4}, Device::CUDA)};
  const TensorView dslots(d_slots.get(), DType::i64, {tokens}, Device::CUDA);
  cudaGraph_t graph;
  ATTNKIT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  write_kv(in.key(d_in.get(), Device::CUDA), in.value(d_in.get(), Device::CUDA), dcache, dslots, dscales, stream());
  ATTNKIT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec;
  ATTNKIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ATTNKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  sync();
  ATTNKIT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNKIT_CUDA_CHECK(cudaGraphDestroy(graph));
  std::vector<uint8_t> in_bytes = in.bytes;
  std::vector<int64_t> slots_h = slots;
  write_kv(in.key(in_bytes.data(), Device::CPU), in.value(in_bytes.data(), Device::CPU),
           layout.make(cpu.data(), Device::CPU), TensorView(slots_h.data(), DType::i64, {tokens}),
           KVScales{TensorView(ks.data(), DType::f32, {4}), TensorView(vs.data(), DType::f32, {4})});
  EXPECT_TRUE(same_bytes(to_host<uint8_t>(d_cache, layout.bytes), cpu));
}

TEST_F(KvWritePolicy, EmptyBatchLaunchesNothingAndSucceeds) {
  const CacheLayout layout = make_layout(CacheView::NHD, DType::bf16, 2, 16, 2, 64);
  std::vector<uint8_t> bytes(layout.bytes);
  poison(bytes, 1);
  auto d_cache = to_device(bytes);
  cuda::DeviceBuffer d_in(64), d_slots(64);
  const TensorView k(d_in.get(), DType::bf16, {0, 2, 64}, Device::CUDA);
  write_kv(k, k, layout.make(d_cache.get(), Device::CUDA), TensorView(d_slots.get(), DType::i64, {0}, Device::CUDA),
           {}, stream());
  sync();
  EXPECT_TRUE(same_bytes(to_host<uint8_t>(d_cache, layout.bytes), bytes));
}

}  // namespace
}  // namespace attnkit::test
