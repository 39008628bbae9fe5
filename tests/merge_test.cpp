// merge_states on the CPU: partial softmax states over disjoint key sets merge to the full
// state; associativity and commutativity; the -inf / +inf / NaN LSE rules and the
// weight-0-ignores-NaN rule; mixed dtypes, strided views and aliasing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attnkit/ops.h"
#include "test_util.h"

namespace attnkit {
namespace {

// A partial attention state in f32: out [T, H, D], lse [H, T].
struct State {
  int64_t T = 0, H = 0, D = 0;
  std::vector<float> out, lse;
  State(int64_t t, int64_t h, int64_t d) : T(t), H(h), D(d), out(t * h * d), lse(h * t) {}
  TensorView out_view() { return TensorView(out.data(), DType::f32, {T, H, D}); }
  TensorView lse_view() { return TensorView(lse.data(), DType::f32, {H, T}); }
  std::vector<int64_t> out_shape() const { return {T, H, D}; }
};

State merged(State a, State b) {
  State o(a.T, a.H, a.D);
  merge_states(a.out_view(), a.lse_view(), b.out_view(), b.lse_view(), o.out_view(), o.lse_view());
  return o;
}

// Random scores and values for N keys per (token, head); the keys are dealt to `parts`
// partial states by `owner`. Returns the partial states (computed in double, stored in f32)
// and the full state. An empty part has lse = -inf and output NaN (never to be read).
struct Problem {
  std::vector<State> parts;
  State full;
};

Problem make_problem(int64_t T, int64_t H, int64_t D, int parts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> score(-6, 6), val(-1, 1);
  std::uniform_int_distribution<int> nkeys(0, 12), who(0, parts - 1);
  Problem p{std::vector<State>(parts, State(T, H, D)), State(T, H, D)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int n = nkeys(rng) + 1;
      std::vector<double> s(n);
      std::vector<int> owner(n);
      std::vector<std::vector<double>> v(n, std::vector<double>(D));
      for (int j = 0; j < n; ++j) {
        s[j] = score(rng);
        owner[j] = who(rng);
        for (auto& x : v[j]) x = val(rng);
      }
      auto fill = [&](State& st, int part) {
        double m = -INFINITY;
        for (int j = 0; j < n; ++j)
          if (part < 0 || owner[j] == part) m = std::max(m, s[j]);
        float* o = &st.out[(t * H + h) * D];
        if (m == -INFINITY) {
          st.lse[h * T + t] = -INFINITY;
          for (int64_t d = 0; d < D; ++d) o[d] = NAN;
          return;
        }
        double sum = 0;
        std::vector<double> acc(D, 0.0);
        for (int j = 0; j < n; ++j) {
          if (part >= 0 && owner[j] != part) continue;
          const double e = std::exp(s[j] - m);
          sum += e;
          for (int64_t d = 0; d < D; ++d) acc[d] += e * v[j][d];
        }
        st.lse[h * T + t] = static_cast<float>(m + std::log(sum));
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
      };
      for (int k = 0; k < parts; ++k) fill(p.parts[k], k);
      fill(p.full, -1);
    }
  return p;
}

struct Shape {
  int64_t T, H, D;
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "T" << s.T << " H" << s.H << " D" << s.D;
}
class MergeRandom : public ::testing::TestWithParam<Shape> {};

TEST_P(MergeRandom, PartialsMergeToTheFullState) {
  const Shape sh = GetParam();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const Problem p = make_problem(sh.T, sh.H, sh.D, 3, 100 + seed);
    const State m = merged(merged(p.parts[0], p.parts[1]), p.parts[2]);
    EXPECT_TRUE(test::all_close(m.out, p.full.out, p.full.out_shape(), 1e-5, 1e-6));
    EXPECT_TRUE(test::all_close(m.lse, p.full.lse, {sh.H, sh.T}, 1e-6, 1e-5));
  }
}

TEST_P(MergeRandom, AssociativeWithinRoundingAndExactlyCommutative) {
  const Shape sh = GetParam();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const Problem p = make_problem(sh.T, sh.H, sh.D, 3, 200 + seed);
    const State& a = p.parts[0];
    const State& b = p.parts[1];
    const State& c = p.parts[2];
    const State left = merged(merged(a, b), c), right = merged(a, merged(b, c));
    EXPECT_TRUE(test::all_close(left.out, right.out, a.out_shape(), 1e-5, 1e-6));
    EXPECT_TRUE(test::all_close(left.lse, right.lse, {sh.H, sh.T}, 1e-6, 1e-5));
    const State ab = merged(a, b), ba = merged(b, a);
    EXPECT_TRUE(test::all_close(ab.out, ba.out, a.out_shape(), 0, 0, true));
    EXPECT_TRUE(test::all_close(ab.lse, ba.lse, {sh.H, sh.T}, 0, 0));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MergeRandom,
                         ::testing::Values(Shape{1, 1, 8}, Shape{7, 4, 64}, Shape{33, 8, 128},
                                           Shape{5, 3, 40}));

// Each row is one (token, head) pair of a single call.
struct RuleCase {
  float lse_a, lse_b, a, b;
  float want_out, want_lse;
  const char* what;
};

TEST(MergeRules, EmptySidesAndZeroWeights) {
  const float inf = INFINITY, nan = NAN;
  const std::vector<RuleCase> cases = {
      {-inf, 2.f, nan, 0.5f, 0.5f, 2.f, "a = -inf: b passes through, NaN in a ignored"},
      {2.f, -inf, 0.25f, nan, 0.25f, 2.f, "b = -inf"},
      {inf, 1.5f, 123.f, -0.75f, -0.75f, 1.5f, "+inf counts as empty"},
      {1.5f, inf, 3.f, 9.f, 3.f, 1.5f, "+inf on b"},
      {nan, -3.f, 7.f, 0.125f, 0.125f, -3.f, "NaN lse counts as empty"},
      {-inf, -inf, nan, inf, 0.f, -inf, "both empty: 0 and -inf"},
      {inf, nan, 1.f, 2.f, 0.f, -inf, "+inf and NaN: both empty"},
      {-200.f, 0.f, nan, 0.5f, 0.5f, 0.f, "weight underflows to 0: NaN ignored"},
      {0.f, -200.f, -0.5f, inf, -0.5f, 0.f, "weight 0 ignores inf too"},
      {1.f, 1.f, 0.25f, 0.75f, 0.5f, 1.f + std::log(2.f), "equal weights"},
  };
  const int64_t T = static_cast<int64_t>(cases.size()), H = 1, D = 4;
  State a(T, H, D), b(T, H, D);
  for (int64_t t = 0; t < T; ++t) {
    a.lse[t] = cases[t].lse_a;
    b.lse[t] = cases[t].lse_b;
    for (int64_t d = 0; d < D; ++d) {
      a.out[t * D + d] = cases[t].a;
      b.out[t * D + d] = cases[t].b;
    }
  }
  const State m = merged(a, b);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < D; ++d)
      EXPECT_FLOAT_EQ(m.out[t * D + d], cases[t].want_out) << cases[t].what;
    if (std::isinf(cases[t].want_lse)) {
      EXPECT_EQ(m.lse[t], cases[t].want_lse) << cases[t].what;
    } else {
      EXPECT_FLOAT_EQ(m.lse[t], cases[t].want_lse) << cases[t].what;
    }
  }
  // A side that is empty passes the other through bit for bit.
  EXPECT_EQ(m.out[0], 0.5f);
  EXPECT_EQ(m.lse[0], 2.f);
}

// Mixed output dtypes: each side is read as its dtype, the result rounded to out's dtype.
TEST(MergeDTypes, MixedInputAndOutputTypes) {
  const int64_t T = 9, H = 3, D = 32;
  const Problem p = make_problem(T, H, D, 2, 7);
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  for (DType ta : types)
    for (DType tb : types)
      for (DType to : types) {
        auto to_buf = [&](const std::vector<float>& x, DType t) {
          std::vector<uint32_t> buf(x.size());
          for (size_t i = 0; i < x.size(); ++i) store_from_float(buf.data(), t, i, x[i]);
          return buf;
        };
        const auto ba = to_buf(p.parts[0].out, ta), bb = to_buf(p.parts[1].out, tb);
        std::vector<uint32_t> bo(T * H * D);
        State ref_a = p.parts[0], ref_b = p.parts[1];
        for (size_t i = 0; i < ba.size(); ++i) {
          ref_a.out[i] = load_as_float(ba.data(), ta, i);
          ref_b.out[i] = load_as_float(bb.data(), tb, i);
        }
        State lse_a = p.parts[0], lse_b = p.parts[1], lse_o(T, H, D);
        merge_states(TensorView(const_cast<uint32_t*>(ba.data()), ta, {T, H, D}),
                     lse_a.lse_view(), TensorView(const_cast<uint32_t*>(bb.data()), tb, {T, H, D}),
                     lse_b.lse_view(), TensorView(bo.data(), to, {T, H, D}), lse_o.lse_view());
        const State want = merged(ref_a, ref_b);
        std::vector<float> got(bo.size());
        for (size_t i = 0; i < got.size(); ++i) got[i] = load_as_float(bo.data(), to, i);
        const double rtol = to == DType::f32 ? 1e-6 : to == DType::f16 ? 0x1p-11 : 0x1p-8;
        EXPECT_TRUE(test::all_close(got, want.out, {T, H, D}, rtol, 1e-7, true))
            << dtype_name(ta) << " + " << dtype_name(tb) << " -> " << dtype_name(to);
        EXPECT_TRUE(test::all_close(lse_o.lse, want.lse, {H, T}, 0, 0));
      }
}

// Strided operands, out aliasing out_a, lse_out aliasing lse_a, and lse_out undefined give
// the same numbers as the plain call.
TEST(MergeViews, StridedAliasedAndWithoutLse) {
  const int64_t T = 6, H = 4, D = 16;
  const Problem p = make_problem(T, H, D, 2, 9);
  const State want = merged(p.parts[0], p.parts[1]);

  // out_b inside a wider row (token stride 3*H*D); lse_b stored token-major (strides 1, H).
  std::vector<float> wide(T * 3 * H * D, NAN);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(&wide[t * 3 * H * D + H * D], &p.parts[1].out[t * H * D], H * D * sizeof(float));
  std::vector<float> lse_tm(T * H);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t) lse_tm[t * H + h] = p.parts[1].lse[h * T + t];
  const TensorView out_b(wide.data() + H * D, DType::f32, {T, H, D}, {3 * H * D, D, 1});
  const TensorView lse_b(lse_tm.data(), DType::f32, {H, T}, {1, H});

  State a = p.parts[0];
  merge_states(a.out_view(), a.lse_view(), out_b, lse_b, a.out_view(), a.lse_view());
  EXPECT_TRUE(test::all_close(a.out, want.out, want.out_shape(), 0, 0));
  EXPECT_TRUE(test::all_close(a.lse, want.lse, {H, T}, 0, 0));

  State c = p.parts[0], b = p.parts[1];
  State o(T, H, D);
  merge_states(c.out_view(), c.lse_view(), b.out_view(), b.lse_view(), o.out_view(), TensorView());
  EXPECT_TRUE(test::all_close(o.out, want.out, want.out_shape(), 0, 0));
}

TEST(MergeViews, ZeroTokensIsANoOp) {
  std::vector<float> dummy(1);
  const TensorView out(dummy.data(), DType::f32, {0, 2, 8});
  const TensorView lse(dummy.data(), DType::f32, {2, 0});
  EXPECT_NO_THROW(merge_states(out, lse, out, lse, out, lse));
}

}  // namespace
}  // namespace attnkit
