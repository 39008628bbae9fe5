// The hopper generation's wgmma building blocks (src/cuda/wgmma_sm90.h, Swizzle128Tile of
// paged_kv_tile.h) on one warpgroup: D (64 x N) = A (64 x K, registers) * B (K x N) with B in
// 128-byte-swizzled shared memory, K-major (the K operand of S = Q K^T) and MN-major (the V
// operand of O = P V), N = 64 / 128, K = 16 .. 128 (several swizzle regions); and the fp8 form
// (WgmmaSSFp8: A e4m3, B e4m3 or e5m2, both K-major in 64-byte-swizzled tiles, Swizzle64Tile of
// tile_copy_layout.h, as S = Q K^T of the hopper kernel on fp8 caches). Inputs are small
// integers, so every product and sum is exact in fp32: the result must match exactly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/tile_copy_layout.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/varlen_launch.h"
#include "test_util.h"

namespace attnkit::test {
namespace {

using cuda::FragA;
using cuda::FragC;

// The warpgroup's m64 x kN accumulator -> d [64][kN] (each warp's 16 rows: mma.sync C fragments).
template <int kN>
__device__ void store_acc(const FragC (&acc)[kN / 8], float* d) {
  const int lane = threadIdx.x & 31, g = (threadIdx.x >> 5) * 16 + lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    d[g * kN + 8 * i + 2 * t] = acc[i].c[0];
    d[g * kN + 8 * i + 2 * t + 1] = acc[i].c[1];
    d[(g + 8) * kN + 8 * i + 2 * t] = acc[i].c[2];
    d[(g + 8) * kN + 8 * i + 2 * t + 1] = acc[i].c[3];
  }
}

// a: [64][kK] row-major; b: kMnMajor ? [kK][kN] : [kN][kK]; d: [64][kN].
template <int kN, int kK, bool kMnMajor>
__global__ void wgmma_gemm_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
#if ATTNKIT_HAS_WGMMA
  using namespace attnkit::cuda;
  constexpr int kRows = kMnMajor ? kK : kN;      // 128-byte lines run along the contiguous dim
  constexpr int kRowElems = kMnMajor ? kN : kK;  // elements per tile row
  // Whole 128-byte lines even when the contiguous dim is shorter than 64 elements.
  constexpr int kRegions = (kRowElems + 63) / 64;
  __shared__ __align__(1024) unsigned char tile[kRegions * kRows * 128];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t base = smem_addr(tile);
  // NaN poison: bytes a GEMM must not read (a line's upper half at N = 32) stay NaN.
  for (int i = tid; i < kRegions * kRows * 8; i += 128) reinterpret_cast<uint4*>(tile)[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
  __syncthreads();
  for (int i = tid; i < kRows * kRowElems / 8; i += 128) {
    const int row = i / (kRowElems / 8), chunk = i % (kRowElems / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(b + row * kRowElems + chunk * 8);
    *reinterpret_cast<uint4*>(tile + Swizzle128Tile<kRows>::offset(row, chunk)) = v;
  }
  fence_proxy_async_smem();
  __syncthreads();

  const int g = warp * 16 + lane / 4, t = lane % 4;
  auto pair = [&](int row, int col) {
    return pack2<__nv_bfloat16>(__bfloat162float(a[row * kK + col]), __bfloat162float(a[row * kK + col + 1]));
  };
  FragC acc[kN / 8];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    FragA fa;
    fa.r[0] = pair(g, 16 * ks + 2 * t);
    fa.r[1] = pair(g + 8, 16 * ks + 2 * t);
    fa.r[2] = pair(g, 16 * ks + 8 + 2 * t);
    fa.r[3] = pair(g + 8, 16 * ks + 8 + 2 * t);
    uint64_t desc;
    if constexpr (kMnMajor)
      desc = smem_desc_sw128(base + ks * 16 * 128, kRows * 128, 1024);
    else
      desc = smem_desc_sw128(base + (ks / 4) * (kRows * 128) + (ks % 4) * 32, 16, 1024);
    WgmmaRS<__nv_bfloat16, kN>::template run<kMnMajor ? 1 : 0>(acc, fa, desc, ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(acc);
  store_acc<kN>(acc, d);
#endif
}

template <int kN, int kK, bool kMnMajor>
void check_gemm(uint64_t seed) {
  SCOPED_TRACE(std::string("N ") + std::to_string(kN) + ", K " + std::to_string(kK) +
               (kMnMajor ? ", B MN-major" : ", B K-major"));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<__nv_bfloat16> a(64 * kK), b(kN * kK);
  std::vector<float> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = __float2bfloat16(af[i] = static_cast<float>(small(rng)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = __float2bfloat16(bf[i] = static_cast<float>(small(rng)));
  std::vector<float> want(64 * kN, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < kN; ++n) {
      float s = 0.f;
      for (int k = 0; k < kK; ++k) s += af[m * kK + k] * (kMnMajor ? bf[k * kN + n] : bf[n * kK + k]);
      want[m * kN + n] = s;
    }
  cuda::DeviceBuffer da(a.size() * 2), db(b.size() * 2), dd(want.size() * 4);
  ATTNKIT_CUDA_CHECK(cudaMemcpy(da.get(), a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(db.get(), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemset(dd.get(), 0xff, want.size() * 4));  // NaN poison
  wgmma_gemm_kernel<kN, kK, kMnMajor><<<1, 128>>>(da.as<__nv_bfloat16>(), db.as<__nv_bfloat16>(), dd.as<float>());
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
  ATTNKIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(want.size());
  ATTNKIT_CUDA_CHECK(cudaMemcpy(got.data(), dd.get(), got.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(all_close(got, want, {64, kN}, 0.0, 0.0));
}

// a: [64][kK] e4m3 codes; b: [kN][kK] codes (e5m2 where kE5m2); d: [64][kN]. Both tiles
// Swizzle64Tile (regions of 64 columns), k32 steps of 32 bytes inside a region's lines.
template <int kN, int kK, bool kE5m2>
__global__ void wgmma_fp8_kernel(const uint8_t* a, const uint8_t* b, float* d) {
  static_assert(kK % 64 == 0, "whole 64-byte lines (Swizzle64Tile)");
#if ATTNKIT_HAS_WGMMA
  using namespace attnkit::cuda;
  __shared__ __align__(1024) unsigned char ta[64 * kK];
  __shared__ __align__(1024) unsigned char tb[kN * kK];
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * kK / 16; i += 128) {
    const int row = i / (kK / 16), chunk = i % (kK / 16);
    *reinterpret_cast<uint4*>(ta + Swizzle64Tile<64>::offset(row, chunk)) = *reinterpret_cast<const uint4*>(a + i * 16);
  }
  for (int i = tid; i < kN * kK / 16; i += 128) {
    const int row = i / (kK / 16), chunk = i % (kK / 16);
    *reinterpret_cast<uint4*>(tb + Swizzle64Tile<kN>::offset(row, chunk)) = *reinterpret_cast<const uint4*>(b + i * 16);
  }
  fence_proxy_async_smem();
  __syncthreads();
  FragC acc[kN / 8];
  wgmma_fence();
  const uint64_t da = smem_desc_sw64(smem_addr(ta), 512), db = smem_desc_sw64(smem_addr(tb), 512);
#pragma unroll
  for (int ks = 0; ks < kK / 32; ++ks)
    WgmmaSSFp8<kE5m2, kN>::run(acc, smem_desc_advance(da, (ks / 2) * (64 * 64) + (ks % 2) * 32),
                               smem_desc_advance(db, (ks / 2) * (kN * 64) + (ks % 2) * 32), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(acc);
  store_acc<kN>(acc, d);
#endif
}

// The fp8 code of a small integer in [-3, 3].
uint8_t small_fp8(int v, bool e5m2) {
  static constexpr uint8_t kE4m3[4] = {0x00, 0x38, 0x40, 0x44}, kE5m2[4] = {0x00, 0x3C, 0x40, 0x42};
  const uint8_t code = (e5m2 ? kE5m2 : kE4m3)[v < 0 ? -v : v];
  return static_cast<uint8_t>(v < 0 ? code | 0x80 : code);
}

template <int kN, int kK, bool kE5m2>
void check_fp8_gemm(uint64_t seed) {
  SCOPED_TRACE(std::string("fp8 N ") + std::to_string(kN) + ", K " + std::to_string(kK) + (kE5m2 ? ", B e5m2" : ", B e4m3"));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<uint8_t> a(64 * kK), b(kN * kK);
  std::vector<float> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const int v = small(rng);
    af[i] = static_cast<float>(v);
    a[i] = small_fp8(v, false);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    const int v = small(rng);
    bf[i] = static_cast<float>(v);
    b[i] = small_fp8(v, kE5m2);
  }
  std::vector<float> want(64 * kN, 0.f);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < kN; ++n) {
      float s = 0.f;
      for (int k = 0; k < kK; ++k) s += af[m * kK + k] * bf[n * kK + k];
      want[m * kN + n] = s;
    }
  cuda::DeviceBuffer da(a.size()), db(b.size()), dd(want.size() * 4);
  ATTNKIT_CUDA_CHECK(cudaMemcpy(da.get(), a.data(), a.size(), cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(db.get(), b.data(), b.size(), cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemset(dd.get(), 0xff, want.size() * 4));  // NaN poison
  wgmma_fp8_kernel<kN, kK, kE5m2><<<1, 128>>>(da.as<uint8_t>(), db.as<uint8_t>(), dd.as<float>());
  ATTNKIT_CUDA_CHECK(cudaGetLastError());
  ATTNKIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(want.size());
  ATTNKIT_CUDA_CHECK(cudaMemcpy(got.data(), dd.get(), got.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(all_close(got, want, {64, kN}, 0.0, 0.0));
}

class WgmmaSm90 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!flash_attn::hopper_kernels_available()) GTEST_SKIP() << "needs sm90 and a build with sm_90a code";
  }
};

TEST_F(WgmmaSm90, KMajorB) {
  check_gemm<64, 16, false>(1);
  check_gemm<64, 96, false>(18);   // head dim 96: a region and a half (S = Q K^T at 96)
  check_gemm<128, 96, false>(19);
  check_gemm<64, 64, false>(2);
  check_gemm<128, 64, false>(3);
  check_gemm<128, 128, false>(4);
  check_gemm<64, 128, false>(5);
}

TEST_F(WgmmaSm90, MnMajorB) {
  check_gemm<64, 16, true>(6);
  check_gemm<64, 64, true>(7);
  check_gemm<128, 16, true>(8);
  check_gemm<128, 64, true>(9);
  check_gemm<128, 128, true>(10);
}

// N = 32: the lower half of each 128-byte line of a swizzled region (O += P V on head dim 96's
// columns 64-95); the upper half holds NaN and must not reach the result.
TEST_F(WgmmaSm90, MnMajorBHalfLine) {
  check_gemm<32, 16, true>(20);
  check_gemm<32, 64, true>(21);
  check_gemm<32, 128, true>(22);
}

// The head dims of the hopper tiles (K = 64 .. 256: one to four regions of whole 64-byte lines),
// N = 64 / 128 keys.
TEST_F(WgmmaSm90, Fp8KMajor) {
  check_fp8_gemm<64, 64, false>(11);
  check_fp8_gemm<128, 64, false>(12);
  check_fp8_gemm<128, 128, false>(13);
  check_fp8_gemm<64, 192, false>(14);
  check_fp8_gemm<64, 256, false>(15);
  check_fp8_gemm<128, 128, true>(16);
  check_fp8_gemm<64, 256, true>(17);
}

}  // namespace
}  // namespace attnkit::test
