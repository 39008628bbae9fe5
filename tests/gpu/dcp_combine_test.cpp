// The DCP combine's local steps (src/cuda/dcp_combine.h) on one GPU, N ranks simulated in one
// process: each rank's partial (random, some rows empty on some ranks: LSE -inf, +inf or NaN
// with NaN values), the collectives done by copies (all-gather, reduce-scatter's sum,
// all-to-all), both paths against dcp_combine_reference over N = 1..8, tokens, head sizes,
// partial and output dtypes, with and without sinks (the argument checks: tests/dcp_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "attnkit/dcp.h"
#include "attnkit/dtype.h"
#include "attnkit/reference.h"
#include "cuda/cuda_check.h"
#include "cuda/dcp_combine.h"
#include "cuda/device_buffer.h"
#include "infra_test_util.h"

namespace attnkit::test {
namespace {

// Host values of `dtype` (f32 / f16 / bf16) as bytes (round to nearest even).
std::vector<uint8_t> encode(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(out.data(), dtype, static_cast<int64_t>(i), v[i]);
  return out;
}

struct CombineCase {
  int world, tokens, heads, head_size;
  DType part_dtype, out_dtype;
  bool sinks;
  uint64_t seed;
};

void check_combine(const CombineCase& c) {
  SCOPED_TRACE("N " + std::to_string(c.world) + ", T " + std::to_string(c.tokens) + ", H " + std::to_string(c.heads) +
               ", D " + std::to_string(c.head_size) + ", partials " + std::string(dtype_name(c.part_dtype)) + ", out " +
               std::string(dtype_name(c.out_dtype)) + (c.sinks ? ", sinks" : ""));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> val(-1.f, 1.f), lse_d(-3.f, 6.f);
  const int N = c.world, T = c.tokens, H = c.heads, D = c.head_size, Hs = H / N;
  const int64_t rows = int64_t{T} * H * D;
  // The ranks' partials (values rounded to the partial dtype, as the device holds them).
  std::vector<std::vector<float>> po(N, std::vector<float>(rows)), pl(N, std::vector<float>(int64_t{T} * H));
  for (int r = 0; r < N; ++r) {
    for (auto& x : po[r]) x = val(rng);
    std::vector<uint8_t> bytes = encode(po[r], c.part_dtype);
    for (int64_t i = 0; i < rows; ++i) po[r][i] = load_as_float(bytes.data(), c.part_dtype, i);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const uint64_t k = rng() % 12;  // some rows empty on this rank
        float l = lse_d(rng);
        if (k == 0) l = -INFINITY;
        if (k == 1) l = INFINITY;
        if (k == 2) l = NAN;
        if (k <= 2)
          for (int d = 0; d < D; ++d) po[r][(int64_t{t} * H + h) * D + d] = NAN;
        pl[r][int64_t{h} * T + t] = l;
      }
  }
  std::vector<float> sinks(H);
  for (auto& s : sinks) s = rng() % 4 == 0 ? -INFINITY : lse_d(rng);

  // The reference on the host.
  std::vector<float> ref_out(rows), ref_lse(int64_t{T} * H);
  std::vector<TensorView> outs, lses;
  for (int r = 0; r < N; ++r) {
    outs.push_back(TensorView(po[r].data(), DType::f32, {T, H, D}));
    lses.push_back(TensorView(pl[r].data(), DType::f32, {H, T}));
  }
  dcp_combine_reference(outs, lses, c.sinks ? TensorView(sinks.data(), DType::f32, {H}) : TensorView(),
                        TensorView(ref_out.data(), DType::f32, {T, H, D}), TensorView(ref_lse.data(), DType::f32, {H, T}));

  // Device copies.
  std::vector<cuda::DeviceBuffer> d_po, d_pl;
  for (int r = 0; r < N; ++r) {
    d_po.push_back(to_device(encode(po[r], c.part_dtype)));
    d_pl.push_back(to_device(pl[r]));
  }
  const cuda::DeviceBuffer d_sinks = to_device(sinks);
  const float* sinks_dev = c.sinks ? d_sinks.as<float>() : nullptr;
  auto partial_view = [&](int r) {
    return TensorView(d_po[r].get(), c.part_dtype, {T, H, D}, Device::CUDA);
  };
  const int64_t slice = int64_t{T} * Hs * D;
  // The rank's output against the reference's heads [r * Hs, (r + 1) * Hs).
  auto check_rank = [&](int r, const cuda::DeviceBuffer& out, const cuda::DeviceBuffer& out_lse, const char* path) {
    SCOPED_TRACE(std::string(path) + ", rank " + std::to_string(r));
    const std::vector<float> got = download_as_float(out.get(), c.out_dtype, slice);
    const std::vector<float> got_lse = download_as_float(out_lse.get(), DType::f32, int64_t{Hs} * T);
    std::vector<float> exp(slice), exp_lse(int64_t{Hs} * T);
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < Hs; ++hh) {
        for (int d = 0; d < D; ++d)
          exp[(int64_t{t} * Hs + hh) * D + d] = ref_out[(int64_t{t} * H + r * Hs + hh) * D + d];
        exp_lse[int64_t{hh} * T + t] = ref_lse[int64_t{r * Hs + hh} * T + t];
      }
    EXPECT_TRUE(outputs_match(c.out_dtype == DType::f32 ? DType::f16 : c.out_dtype, got, exp, {T, Hs, D}));
    EXPECT_TRUE(lse_match(got_lse, exp_lse, {Hs, T}));
  };
  cudaStream_t stream = nullptr;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t out_bytes = static_cast<size_t>(slice) * dtype_size(c.out_dtype);

  // All-gather + reduce-scatter.
  {
    cuda::DeviceBuffer lse_all(sizeof(float) * N * H * T + 16);
    for (int r = 0; r < N; ++r)
      ATTNKIT_CUDA_CHECK(cudaMemcpy(lse_all.as<float>() + int64_t{r} * H * T, d_pl[r].get(), sizeof(float) * H * T,
                                    cudaMemcpyDeviceToDevice));
    std::vector<cuda::DeviceBuffer> send;
    for (int r = 0; r < N; ++r) {
      send.emplace_back(sizeof(float) * rows + 16);
      cuda::dcp_weigh_for_reduce_scatter({T, H, D, N, r}, partial_view(r), lse_all.as<float>(), sinks_dev,
                                         send.back().as<float>(), stream);
    }
    ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < N; ++r) {
      std::vector<float> sum(slice, 0.f);
      for (int j = 0; j < N; ++j) {  // (the reduce-scatter: chunk r of every rank's send, summed)
        std::vector<float> chunk(slice);
        ATTNKIT_CUDA_CHECK(cudaMemcpy(chunk.data(), send[j].as<float>() + r * slice, sizeof(float) * slice,
                                      cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < slice; ++i) sum[i] += chunk[i];
      }
      const cuda::DeviceBuffer recv = to_device(sum);
      cuda::DeviceBuffer out(out_bytes + 16), out_lse(sizeof(float) * Hs * T + 16);
      cuda::dcp_finish_reduce_scatter({T, H, D, N, r}, recv.as<float>(), lse_all.as<float>(), sinks_dev,
                                      TensorView(out.get(), c.out_dtype, {T, Hs, D}, Device::CUDA), out_lse.as<float>(),
                                      stream);
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      check_rank(r, out, out_lse, "all-gather + reduce-scatter");
    }
  }
  // All-to-all.
  {
    std::vector<cuda::DeviceBuffer> send_o, send_l;
    for (int r = 0; r < N; ++r) {
      send_o.emplace_back(sizeof(float) * rows + 16);
      send_l.emplace_back(sizeof(float) * H * T + 16);
      cuda::dcp_pack_all_to_all({T, H, D, N, r}, partial_view(r), d_pl[r].as<float>(), send_o.back().as<float>(),
                                send_l.back().as<float>(), stream);
    }
    ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < N; ++r) {
      cuda::DeviceBuffer recv_o(sizeof(float) * rows + 16), recv_l(sizeof(float) * H * T + 16);
      for (int j = 0; j < N; ++j) {  // (rank j's chunk r)
        ATTNKIT_CUDA_CHECK(cudaMemcpy(recv_o.as<float>() + j * slice, send_o[j].as<float>() + r * slice,
                                      sizeof(float) * slice, cudaMemcpyDeviceToDevice));
        ATTNKIT_CUDA_CHECK(cudaMemcpy(recv_l.as<float>() + int64_t{j} * Hs * T, send_l[j].as<float>() + int64_t{r} * Hs * T,
                                      sizeof(float) * Hs * T, cudaMemcpyDeviceToDevice));
      }
      cuda::DeviceBuffer out(out_bytes + 16), out_lse(sizeof(float) * Hs * T + 16);
      cuda::dcp_merge_all_to_all({T, H, D, N, r}, recv_o.as<float>(), recv_l.as<float>(), sinks_dev,
                                 TensorView(out.get(), c.out_dtype, {T, Hs, D}, Device::CUDA), out_lse.as<float>(), stream);
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      check_rank(r, out, out_lse, "all-to-all");
    }
  }
  ATTNKIT_CUDA_CHECK(cudaStreamDestroy(stream));
}

class DcpCombineGrid : public ::testing::TestWithParam<int> {};

TEST_P(DcpCombineGrid, SimulatedRanksMatchTheReference) {
  const int i = GetParam();
  constexpr int kWorlds[] = {1, 2, 3, 4, 8};
  constexpr int kTokens[] = {1, 7, 64};
  constexpr DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
  CombineCase c;
  c.world = kWorlds[i % 5];
  c.tokens = kTokens[(i / 5) % 3];
  c.heads = c.world * (i % 2 ? 4 : 1);
  c.head_size = (i / 15) % 2 ? 128 : 64;
  c.part_dtype = kDtypes[(i / 2) % 3];
  c.out_dtype = kDtypes[(i / 3) % 3];
  c.sinks = i % 4 == 1;
  c.seed = 100 + i;
  check_combine(c);
}
INSTANTIATE_TEST_SUITE_P(Seeds, DcpCombineGrid, ::testing::Range(0, 30));

}  // namespace
}  // namespace attnkit::test
