// merge_states on CUDA against the CPU merge_states: dtype combinations, head sizes on the
// vector and scalar paths, strided operands, in-place merges (out aliasing out_a, lse_out
// aliasing lse_a), and the edge rules (-inf / +inf / NaN LSE, NaN outputs with weight 0).
// Results agree to rounding (the weights use expf/logf, whose device and host versions may
// differ by an ulp); every special case must match exactly; merge(a, b) == merge(b, a) exactly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/ops.h"
#include "infra_test_util.h"
#include "test_util.h"

namespace attnkit::test {
namespace {

// A [T, H, D] operand in a buffer whose rows may be padded (row stride >= H * D).
struct Operand {
  DType dtype;
  int64_t T, H, D, pad;
  std::vector<uint8_t> bytes;

  int64_t head_stride() const { return D + pad; }
  int64_t token_stride() const { return H * head_stride(); }
  int64_t elems() const { return T * token_stride(); }
  TensorView view(void* base, Device dev) const {
    return TensorView(base, dtype, {T, H, D}, {token_stride(), head_stride(), 1}, dev);
  }
  float at(int64_t t, int64_t h, int64_t d) const {
    return load_as_float(bytes.data(), dtype, t * token_stride() + h * head_stride() + d);
  }
};

Operand make_operand(DType dtype, int64_t T, int64_t H, int64_t D, int64_t pad, std::mt19937& rng,
                     float nan_rate = 0.f) {
  Operand o{dtype, T, H, D, pad, {}};
  o.bytes.resize(o.elems() * dtype_size(dtype));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t i = 0; i < o.elems(); ++i) {
    const float x = u(rng) < nan_rate ? NAN : normal(rng);
    store_from_float(o.bytes.data(), dtype, i, x);
  }
  return o;
}

// LSE [H, T]: finite values with a spread that makes either side dominate, and with
// `special_rate` -inf / +inf / NaN on one or both sides.
std::vector<float> make_lse(int64_t H, int64_t T, std::mt19937& rng, float special_rate) {
  std::vector<float> l(H * T);
  std::uniform_real_distribution<float> u(0.f, 1.f), v(-30.f, 30.f);
  for (auto& x : l) {
    const float r = u(rng);
    if (r < special_rate / 3) x = -INFINITY;
    else if (r < 2 * special_rate / 3) x = INFINITY;
    else if (r < special_rate) x = NAN;
    else x = v(rng);
  }
  return l;
}

std::vector<float> read_all(const Operand& o) {
  std::vector<float> out;
  out.reserve(o.T * o.H * o.D);
  for (int64_t t = 0; t < o.T; ++t)
    for (int64_t h = 0; h < o.H; ++h)
      for (int64_t d = 0; d < o.D; ++d) out.push_back(o.at(t, h, d));
  return out;
}

double rtol_for(DType t) { return t == DType::f32 ? 2e-6 : t == DType::bf16 ? 8e-3 : 1e-3; }

struct MergeCase {
  DType a, b, out;
  int64_t head_size;
};

std::string merge_name(const ::testing::TestParamInfo<MergeCase>& info) {
  const MergeCase& c = info.param;
  return std::string(dtype_name(c.a)) + "_" + std::string(dtype_name(c.b)) + "_to_" +
         std::string(dtype_name(c.out)) + "_d" + std::to_string(c.head_size);
}

std::vector<MergeCase> merge_cases() {
  std::vector<MergeCase> cases;
  const DType f[] = {DType::f32, DType::f16, DType::bf16};
  for (DType a : f)
    for (DType out : f)
      for (int64_t d : {64, 128, 36}) {
        const DType b = a == DType::f32 ? DType::bf16 : a;  // mixed inputs for f32 a
        cases.push_back({a, b, out, d});
      }
  return cases;
}

struct Result {
  std::vector<float> out, lse;
};

// Runs the merge on the GPU (and, for reference, on the CPU) on copies of the same operands.
// alias: 0 = separate out, 1 = out is out_a and lse_out is lse_a (both in place).
Result run_gpu(const Operand& a, const Operand& b, const std::vector<float>& la,
               const std::vector<float>& lb, Operand out, bool with_lse, int alias, void* stream) {
  auto da = to_device(a.bytes), db = to_device(b.bytes), dout = to_device(out.bytes);
  auto dla = to_device(la), dlb = to_device(lb);
  std::vector<float> lse_poison(la.size(), 12345.f);
  auto dlo = to_device(lse_poison);
  const int64_t T = a.T, H = a.H;
  const TensorView va = a.view(da.get(), Device::CUDA);
  const TensorView vla(dla.get(), DType::f32, {H, T}, Device::CUDA);
  const TensorView vo = alias ? va : out.view(dout.get(), Device::CUDA);
  const TensorView vlo = !with_lse ? TensorView() : alias ? vla : TensorView(dlo.get(), DType::f32, {H, T}, Device::CUDA);
  merge_states(va, vla, b.view(db.get(), Device::CUDA), TensorView(dlb.get(), DType::f32, {H, T}, Device::CUDA), vo,
               vlo, stream);
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  Operand result = alias ? a : out;
  result.bytes = to_host<uint8_t>(alias ? da : dout, result.bytes.size());
  Result r{read_all(result), {}};
  if (with_lse) r.lse = to_host<float>(alias ? dla : dlo, la.size());
  return r;
}

Result run_cpu(const Operand& a, const Operand& b, std::vector<float> la, std::vector<float> lb,
               Operand out) {
  Operand ca = a, cb = b;
  std::vector<float> lo(la.size());
  const int64_t T = a.T, H = a.H;
  merge_states(ca.view(ca.bytes.data(), Device::CPU), TensorView(la.data(), DType::f32, {H, T}),
               cb.view(cb.bytes.data(), Device::CPU), TensorView(lb.data(), DType::f32, {H, T}),
               out.view(out.bytes.data(), Device::CPU), TensorView(lo.data(), DType::f32, {H, T}));
  return Result{read_all(out), lo};
}

class MergeStatesGrid : public GpuParamTest<MergeCase> {};

TEST_P(MergeStatesGrid, GpuMatchesCpu) {
  const MergeCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.head_size * 131 + int(c.a) * 7 + int(c.out)));
  for (int64_t T : {1, 7, 64})
    for (int64_t H : {1, 8})
      for (int64_t pad : {0, 8, 3}) {
        for (float special : {0.f, 0.3f}) {
          SCOPED_TRACE(::testing::Message() << "T " << T << ", H " << H << ", pad " << pad
                                            << ", special LSE rate " << special);
          const Operand a = make_operand(c.a, T, H, c.head_size, pad, rng, special > 0 ? 0.05f : 0.f);
          const Operand b = make_operand(c.b, T, H, c.head_size, 0, rng, special > 0 ? 0.05f : 0.f);
          Operand out = make_operand(c.out, T, H, c.head_size, pad == 3 ? 0 : pad, rng);
          const auto la = make_lse(H, T, rng, special), lb = make_lse(H, T, rng, special);
          const Result cpu = run_cpu(a, b, la, lb, out);
          const Result gpu = run_gpu(a, b, la, lb, out, true, 0, stream());
          const std::vector<int64_t> shape = {T, H, c.head_size};
          // NaN survives only where the CPU has it (a NaN output with non-zero weight).
          EXPECT_TRUE(all_close(gpu.out, cpu.out, shape, rtol_for(c.out), 1e-6, /*nan_ok=*/true));
          EXPECT_TRUE(all_close(gpu.lse, cpu.lse, {H, T}, 1e-6, 1e-6));
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MergeStatesGrid, ::testing::ValuesIn(merge_cases()), merge_name);

class MergeStatesRules : public GpuTest {};

// The edge rules, one (token, head) per combination, in f32 so results are checked exactly
// where the rule fixes them: an empty side contributes nothing (its NaN output too); both
// empty gives 0 and -inf.
TEST_F(MergeStatesRules, EmptySidesAndNaNFollowTheRule) {
  const float specials[] = {-INFINITY, INFINITY, NAN, 0.f, 5.f, -5.f};
  const int64_t D = 8, n = 6;
  const int64_t T = n * n;  // every (lse_a, lse_b) pair
  std::mt19937 rng(5);
  Operand a = make_operand(DType::f32, T, 1, D, 0, rng), b = make_operand(DType::f32, T, 1, D, 0, rng);
  std::vector<float> la(T), lb(T);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      la[i * n + j] = specials[i];
      lb[i * n + j] = specials[j];
      // Outputs of sides that must not count hold NaN.
      if (!std::isfinite(specials[i])) store_from_float(a.bytes.data(), DType::f32, (i * n + j) * D + 1, NAN);
      if (!std::isfinite(specials[j])) store_from_float(b.bytes.data(), DType::f32, (i * n + j) * D + 2, NAN);
    }
  Operand out = make_operand(DType::f32, T, 1, D, 0, rng);
  const Result gpu = run_gpu(a, b, la, lb, out, true, 0, stream());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = i * n + j;
      SCOPED_TRACE(::testing::Message() << "lse_a " << specials[i] << ", lse_b " << specials[j]);
      const bool ea = !std::isfinite(specials[i]), eb = !std::isfinite(specials[j]);
      if (ea && eb) {
        EXPECT_EQ(gpu.lse[t], -INFINITY);
        for (int64_t d = 0; d < D; ++d) EXPECT_EQ(std::bit_cast<uint32_t>(gpu.out[t * D + d]), 0u) << "d " << d;
      } else if (ea || eb) {
        const Operand& keep = ea ? b : a;
        EXPECT_EQ(gpu.lse[t], ea ? specials[j] : specials[i]);
        for (int64_t d = 0; d < D; ++d) EXPECT_EQ(gpu.out[t * D + d], keep.at(t, 0, d)) << "d " << d;
      } else {
        const double m = std::max(specials[i], specials[j]);
        const double want = m + std::log(std::exp(specials[i] - m) + std::exp(specials[j] - m));
        EXPECT_NEAR(gpu.lse[t], want, 1e-5);
        for (int64_t d = 0; d < D; ++d) EXPECT_FALSE(std::isnan(gpu.out[t * D + d])) << "d " << d;
      }
    }
}

// out = out_a and lse_out = lse_a (in place), and lse_out left undefined.
TEST_F(MergeStatesRules, InPlaceAndWithoutLseOut) {
  std::mt19937 rng(9);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t T = 33, H = 4, D = 128;
    const Operand a = make_operand(dt, T, H, D, 0, rng), b = make_operand(dt, T, H, D, 0, rng);
    Operand out = make_operand(dt, T, H, D, 0, rng);
    const auto la = make_lse(H, T, rng, 0.1f), lb = make_lse(H, T, rng, 0.1f);
    const Result cpu = run_cpu(a, b, la, lb, out);
    const Result in_place = run_gpu(a, b, la, lb, out, true, 1, stream());
    EXPECT_TRUE(all_close(in_place.out, cpu.out, {T, H, D}, rtol_for(dt), 1e-6));
    EXPECT_TRUE(all_close(in_place.lse, cpu.lse, {H, T}, 1e-6, 1e-6));
    const Result no_lse = run_gpu(a, b, la, lb, out, false, 0, stream());
    EXPECT_TRUE(all_close(no_lse.out, cpu.out, {T, H, D}, rtol_for(dt), 1e-6));
  }
}

// The rule is symmetric, so swapping the sides gives the same bits.
TEST_F(MergeStatesRules, SwappingSidesGivesIdenticalBits) {
  std::mt19937 rng(13);
  const int64_t T = 20, H = 8, D = 64;
  const Operand a = make_operand(DType::f32, T, H, D, 0, rng), b = make_operand(DType::f32, T, H, D, 0, rng);
  const Operand out = make_operand(DType::f32, T, H, D, 0, rng);
  const auto la = make_lse(H, T, rng, 0.2f), lb = make_lse(H, T, rng, 0.2f);
  const Result ab = run_gpu(a, b, la, lb, out, true, 0, stream());
  const Result ba = run_gpu(b, a, lb, la, out, true, 0, stream());
  for (size_t i = 0; i < ab.out.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(ab.out[i]), std::bit_cast<uint32_t>(ba.out[i])) << "element " << i;
  for (size_t i = 0; i < ab.lse.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(ab.lse[i]), std::bit_cast<uint32_t>(ba.lse[i])) << "lse " << i;
}

// A reduced grid for compute-sanitizer: scalar and vector paths, aliasing, odd sizes.
TEST_F(MergeStatesRules, SanitizerSmallGrid) {
  std::mt19937 rng(17);
  for (int64_t D : {36, 64})
    for (int alias : {0, 1}) {
      const int64_t T = 5, H = 3;
      const Operand a = make_operand(DType::bf16, T, H, D, 0, rng), b = make_operand(DType::f16, T, H, D, 0, rng);
      Operand out = make_operand(DType::bf16, T, H, D, 0, rng);
      const auto la = make_lse(H, T, rng, 0.2f), lb = make_lse(H, T, rng, 0.2f);
      const Result cpu = run_cpu(a, b, la, lb, out);
      const Result gpu = run_gpu(a, b, la, lb, out, true, alias, stream());
      EXPECT_TRUE(all_close(gpu.out, cpu.out, {T, H, D}, rtol_for(DType::bf16), 1e-6));
    }
}

}  // namespace
}  // namespace attnkit::test
