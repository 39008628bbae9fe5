// The device conversions of src/cuda/convert.cuh against the host ones of src/core/dtype.cpp,
// bit for bit, over every 16-bit pattern, every rounding tie of every format (and the floats
// on either side of it), the saturation boundaries, specials and random bit patterns; and the
// MMA paths' fp8 pair conversions (src/cuda/fp8_dequant.h) over every two-code word.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/dtype.h"
#include "cuda/convert.cuh"
#include "cuda/fp8_dequant.h"
#include "infra_test_util.h"

namespace attnkit::test {
namespace {

enum Target : int { kF16 = 0, kBf16, kE4m3, kE5m2, kE2m1, kNumTargets };
const char* const kTargetNames[] = {"f16", "bf16", "e4m3", "e5m2", "e2m1"};

__global__ void encode_kernel(const float* x, int64_t n, uint32_t* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[0 * n + i] = cuda::f32_to_f16_bits(x[i]);
    out[1 * n + i] = cuda::f32_to_bf16_bits(x[i]);
    out[2 * n + i] = cuda::f32_to_e4m3(x[i]);
    out[3 * n + i] = cuda::f32_to_e5m2(x[i]);
    out[4 * n + i] = cuda::f32_to_e2m1(x[i]);
  }
}

uint32_t host_encode(Target t, float x) {
  switch (t) {
    case kF16: return float_to_f16_bits(x);
    case kBf16: return float_to_bf16_bits(x);
    case kE4m3: return float_to_e4m3(x);
    case kE5m2: return float_to_e5m2(x);
    default: return float_to_e2m1(x);
  }
}

void add_with_neighbours(std::vector<float>& v, float x) {
  for (float s : {x, -x}) {
    v.push_back(s);
    v.push_back(std::nextafterf(s, 0.f));
    v.push_back(std::nextafterf(s, s > 0 ? INFINITY : -INFINITY));
  }
}

// Every tie between consecutive codes of a small format, the codes themselves and the floats
// next to each; `decode` maps a non-negative code to its value.
template <class Decode>
void add_ties(std::vector<float>& v, uint32_t max_code, Decode decode) {
  for (uint32_t c = 0; c < max_code; ++c) {
    const double a = decode(c), b = decode(c + 1);
    add_with_neighbours(v, static_cast<float>(a));
    add_with_neighbours(v, static_cast<float>((a + b) / 2));  // exact in float for these formats
  }
  add_with_neighbours(v, static_cast<float>(decode(max_code)));
}

std::vector<float> conversion_inputs() {
  std::vector<float> v;
  // Every bf16 value, and every tie between bf16 neighbours and the floats around it.
  for (uint32_t c = 0; c < 0x10000; ++c) {
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0x0001u, 0xFFFFu})
      v.push_back(std::bit_cast<float>((c << 16) | low));
  }
  add_ties(v, 0x7BFF, [](uint32_t c) { return f16_bits_to_float(static_cast<uint16_t>(c)); });
  add_with_neighbours(v, 65520.f);  // the f16 tie that rounds to inf
  add_ties(v, 0x7E, [](uint32_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); });
  add_with_neighbours(v, 464.f);  // between 448 and the (NaN) code above it
  add_with_neighbours(v, 480.f);
  add_ties(v, 0x7B, [](uint32_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); });
  add_with_neighbours(v, 61440.f);
  add_with_neighbours(v, 65536.f);
  add_ties(v, 0x7, [](uint32_t c) { return e2m1_to_float(static_cast<uint8_t>(c)); });
  add_with_neighbours(v, 7.f);
  for (float x : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                  1e-30f, 1e30f})
    add_with_neighbours(v, x);
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u, 0x7FFFFFFFu})
    v.push_back(std::bit_cast<float>(nan));
  std::mt19937 rng(1234);
  for (int i = 0; i < (1 << 20); ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return v;
}

// Runs `inputs` through encode_kernel and compares every target with the host encoder.
void expect_encodings_match(const std::vector<float>& inputs) {
  const int64_t n = static_cast<int64_t>(inputs.size());
  auto d_in = to_device(inputs);
  cuda::DeviceBuffer d_out(n * kNumTargets * sizeof(uint32_t));
  encode_kernel<<<1024, 256>>>(d_in.as<float>(), n, d_out.as<uint32_t>());
  ATTNKIT_CUDA_CHECK_LAUNCH();
  const auto got = to_host<uint32_t>(d_out, n * kNumTargets);
  for (int t = 0; t < kNumTargets; ++t) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (got[t * n + i] != host_encode(static_cast<Target>(t), inputs[i])) {
        if (bad++ == 0) first = i;
      }
    }
    if (bad) {
      const float x = inputs[first];
      ADD_FAILURE() << kTargetNames[t] << ": " << bad << " of " << n << " inputs differ; first: x = "
                    << x << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x) << ") device 0x"
                    << got[t * n + first] << " host 0x" << host_encode(static_cast<Target>(t), x)
                    << std::dec;
    }
  }
}

TEST(DeviceConvert, EncodersMatchHostOnTiesBoundariesSpecialsAndRandomBits) {
  const auto inputs = conversion_inputs();
  ASSERT_GT(inputs.size(), 500000u);
  expect_encodings_match(inputs);
}

__global__ void decode_kernel(float* f16, float* e4m3, float* e5m2, float* e2m1) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 0x10000) f16[i] = cuda::f16_bits_to_f32(static_cast<uint16_t>(i));
  if (i < 0x100) {
    e4m3[i] = cuda::e4m3_to_f32(static_cast<uint8_t>(i));
    e5m2[i] = cuda::e5m2_to_f32(static_cast<uint8_t>(i));
  }
  if (i < 0x10) e2m1[i] = cuda::e2m1_to_f32(static_cast<uint8_t>(i));
}

// Same bits, or both NaN (the host decoders return a canonical NaN).
bool same_value(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(DeviceConvert, DecodersMatchHostOnEveryCode) {
  cuda::DeviceBuffer f16(0x10000 * 4), e4(0x100 * 4), e5(0x100 * 4), e2(0x10 * 4);
  decode_kernel<<<0x10000 / 256, 256>>>(f16.as<float>(), e4.as<float>(), e5.as<float>(), e2.as<float>());
  ATTNKIT_CUDA_CHECK_LAUNCH();
  struct Case {
    const char* name;
    const cuda::DeviceBuffer* buf;
    uint32_t codes;
    float (*host)(uint32_t);
  };
  const Case cases[] = {
      {"f16", &f16, 0x10000, [](uint32_t c) { return f16_bits_to_float(static_cast<uint16_t>(c)); }},
      {"e4m3", &e4, 0x100, [](uint32_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); }},
      {"e5m2", &e5, 0x100, [](uint32_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); }},
      {"e2m1", &e2, 0x10, [](uint32_t c) { return e2m1_to_float(static_cast<uint8_t>(c)); }},
  };
  for (const Case& c : cases) {
    const auto got = to_host<float>(*c.buf, c.codes);
    for (uint32_t code = 0; code < c.codes; ++code)
      ASSERT_TRUE(same_value(got[code], c.host(code)))
          << c.name << " code 0x" << std::hex << code << std::dec << ": device " << got[code]
          << " host " << c.host(code);
  }
}

// The MMA paths' pair conversions (cuda/fp8_dequant.h) on every two-code word: e4m3 by the
// build's conversion (the instruction on sm_89+), by the bit-level one every arch can run, and
// e5m2 by its byte move; each half against the host decoder.
__global__ void fp8_pairs_kernel(uint32_t* e4, uint32_t* e4_bits, uint32_t* e5) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 0x10000) return;
  e4[i] = cuda::fp8x2_to_f16x2<cuda::Fp8Format::e4m3>(i);
  e4_bits[i] = cuda::e4m3x2_to_f16x2_bits(i);
  e5[i] = cuda::fp8x2_to_f16x2<cuda::Fp8Format::e5m2>(i);
}

TEST(DeviceConvert, Fp8PairsToF16MatchHostOnEveryPair) {
  cuda::DeviceBuffer e4(0x10000 * 4), e4_bits(0x10000 * 4), e5(0x10000 * 4);
  fp8_pairs_kernel<<<0x10000 / 256, 256>>>(e4.as<uint32_t>(), e4_bits.as<uint32_t>(), e5.as<uint32_t>());
  ATTNKIT_CUDA_CHECK_LAUNCH();
  struct Case {
    const char* name;
    const cuda::DeviceBuffer* buf;
    float (*host)(uint8_t);
  };
  const Case cases[] = {{"e4m3 (build's)", &e4, e4m3_to_float},
                        {"e4m3 (bit-level)", &e4_bits, e4m3_to_float},
                        {"e5m2", &e5, e5m2_to_float}};
  for (const Case& c : cases) {
    const auto got = to_host<uint32_t>(*c.buf, 0x10000);
    for (uint32_t word = 0; word < 0x10000; ++word)
      for (int half = 0; half < 2; ++half) {
        const float device = f16_bits_to_float(static_cast<uint16_t>(got[word] >> (16 * half)));
        const float host = c.host(static_cast<uint8_t>(word >> (8 * half)));
        ASSERT_TRUE(same_value(device, host)) << c.name << " word 0x" << std::hex << word << std::dec << " half "
                                              << half << ": device " << device << " host " << host;
      }
  }
}

__global__ void fp8_quantize_kernel(const float* x, const float* scale, int64_t n, uint8_t* e4,
                                    uint8_t* e5) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    e4[i] = cuda::fp8_quantize<DType::fp8_e4m3>(x[i], scale[i]);
    e5[i] = cuda::fp8_quantize<DType::fp8_e5m2>(x[i], scale[i]);
  }
}

TEST(DeviceConvert, Fp8QuantizeWithScalesMatchesHost) {
  const float scales[] = {1.f, 0.5f, 3.7e-3f, 1.f / 448.f, 17.25f, 1e-20f, 1e20f, 0.1f};
  std::vector<float> x, s;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float sc : scales) {
    for (int i = 0; i < 40000; ++i) {
      const float mag = std::ldexp(1.f, static_cast<int>(rng() % 40) - 20);
      x.push_back(normal(rng) * mag);
      s.push_back(sc);
    }
    for (float special : {0.f, -0.f, INFINITY, -INFINITY, NAN, 448.f * sc, 464.f * sc, 57344.f * sc}) {
      x.push_back(special);
      s.push_back(sc);
    }
  }
  const int64_t n = static_cast<int64_t>(x.size());
  auto dx = to_device(x), ds = to_device(s);
  cuda::DeviceBuffer e4(n), e5(n);
  fp8_quantize_kernel<<<512, 256>>>(dx.as<float>(), ds.as<float>(), n, e4.as<uint8_t>(), e5.as<uint8_t>());
  ATTNKIT_CUDA_CHECK_LAUNCH();
  const auto g4 = to_host<uint8_t>(e4, n), g5 = to_host<uint8_t>(e5, n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t h4 = quantize_fp8(DType::fp8_e4m3, x[i], s[i]);
    const uint8_t h5 = quantize_fp8(DType::fp8_e5m2, x[i], s[i]);
    if ((g4[i] != h4 || g5[i] != h5) && bad++ < 5)
      ADD_FAILURE() << "x = " << x[i] << ", scale = " << s[i] << ": e4m3 device " << int(g4[i])
                    << " host " << int(h4) << "; e5m2 device " << int(g5[i]) << " host " << int(h5);
  }
  EXPECT_EQ(bad, 0);
}

__global__ void nvfp4_kernel(const float* x, const float* g, int64_t blocks, uint8_t* packed,
                             uint8_t* scales) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[kNvfp4BlockValues];
    for (int i = 0; i < kNvfp4BlockValues; ++i) v[i] = x[b * kNvfp4BlockValues + i];
    uint8_t p[kNvfp4BlockValues / 2];
    cuda::nvfp4_quantize_block(v, g[b], p, scales[b]);
    for (int i = 0; i < kNvfp4BlockValues / 2; ++i) packed[b * 8 + i] = p[i];
  }
}

TEST(DeviceConvert, Nvfp4BlocksMatchHost) {
  std::mt19937 rng(4242);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float globals[] = {1.f, 1.f / 448.f, 0.0123f, 3.f, 1e-12f};
  std::vector<float> x, g;
  int64_t blocks = 0;
  for (float gs : globals) {
    for (int b = 0; b < 8000; ++b, ++blocks) {
      const float mag = std::ldexp(1.f, static_cast<int>(rng() % 30) - 15);
      const int kind = b % 16;  // a few blocks hold specials
      for (int i = 0; i < kNvfp4BlockValues; ++i) {
        float v = normal(rng) * mag;
        if (kind == 1) v = 0.f;
        if (kind == 2 && i == 3) v = NAN;
        if (kind == 3 && i == 5) v = (b & 32) ? INFINITY : -INFINITY;
        if (kind == 4) v = std::ldexp(normal(rng), -140);  // underflows every scale
        x.push_back(v);
      }
      g.push_back(gs);
    }
  }
  auto dx = to_device(x), dg = to_device(g);
  cuda::DeviceBuffer dp(blocks * 8), dsc(blocks);
  nvfp4_kernel<<<256, 128>>>(dx.as<float>(), dg.as<float>(), blocks, dp.as<uint8_t>(), dsc.as<uint8_t>());
  ATTNKIT_CUDA_CHECK_LAUNCH();
  const auto gp = to_host<uint8_t>(dp, blocks * 8), gsc = to_host<uint8_t>(dsc, blocks);
  int64_t bad = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t hp[8], hs;
    quantize_nvfp4_block(&x[b * kNvfp4BlockValues], g[b], hp, &hs);
    bool same = hs == gsc[b];
    for (int i = 0; i < 8; ++i) same = same && hp[i] == gp[b * 8 + i];
    if (!same && bad++ < 5) {
      std::string dev, host;
      char buf[8];
      for (int i = 0; i < 8; ++i) {
        std::snprintf(buf, sizeof buf, "%02x", gp[b * 8 + i]);
        dev += buf;
        std::snprintf(buf, sizeof buf, "%02x", hp[i]);
        host += buf;
      }
      ADD_FAILURE() << "block " << b << " (global scale " << g[b] << "): device scale "
                    << int(gsc[b]) << " packed " << dev << "; host scale " << int(hs) << " packed "
                    << host;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << blocks << " blocks";
}

}  // namespace
}  // namespace attnkit::test
