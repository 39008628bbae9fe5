// Exhaustive tests of the host conversions: every code of e4m3 / e5m2 / e2m1 / f16 / bf16
// against an independent formula, round trips, saturation, round-half-to-even at every
// midpoint, and the NVFP4 block quantizer's error bound.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/dtype.h"
#include "test_util.h"

namespace attnkit {
namespace {

// ---- independent decoders: sign / exponent / mantissa fields, written from the formats' specs
struct Format {
  const char* name;
  int ebits, mbits, bias;
  bool ieee_specials;   // top exponent is inf/NaN (f16, bf16, e5m2)
  bool fn_nan_only;     // e4m3 FN: only S.1111.111 is NaN, no inf
  uint32_t max_finite;  // largest positive finite code
  int total_bits;
};

constexpr Format kE4M3{"e4m3", 4, 3, 7, false, true, 0x7E, 8};
constexpr Format kE5M2{"e5m2", 5, 2, 15, true, false, 0x7B, 8};
constexpr Format kE2M1{"e2m1", 2, 1, 1, false, false, 0x7, 4};
constexpr Format kF16{"f16", 5, 10, 15, true, false, 0x7BFF, 16};
constexpr Format kBF16{"bf16", 8, 7, 127, true, false, 0x7F7F, 16};

double reference_decode(const Format& f, uint32_t code) {
  const uint32_t sign = (code >> (f.total_bits - 1)) & 1;
  const uint32_t e = (code >> f.mbits) & ((1u << f.ebits) - 1);
  const uint32_t m = code & ((1u << f.mbits) - 1);
  const uint32_t emax = (1u << f.ebits) - 1;
  double v;
  if (f.ieee_specials && e == emax) {
    v = m == 0 ? INFINITY : NAN;
  } else if (f.fn_nan_only && e == emax && m == (1u << f.mbits) - 1) {
    v = NAN;
  } else if (e == 0) {
    v = m * std::pow(2.0, 1 - f.bias - f.mbits);  // subnormal
  } else {
    v = (1.0 + m / std::pow(2.0, f.mbits)) * std::pow(2.0, static_cast<int>(e) - f.bias);
  }
  return sign ? -v : v;
}

struct Codec {
  Format fmt;
  std::function<float(uint32_t)> decode;
  std::function<uint32_t(float)> encode;
};

std::vector<Codec> codecs() {
  return {
      {kE4M3, [](uint32_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); },
       [](float x) { return static_cast<uint32_t>(float_to_e4m3(x)); }},
      {kE5M2, [](uint32_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); },
       [](float x) { return static_cast<uint32_t>(float_to_e5m2(x)); }},
      {kE2M1, [](uint32_t c) { return e2m1_to_float(static_cast<uint8_t>(c)); },
       [](float x) { return static_cast<uint32_t>(float_to_e2m1(x)); }},
      {kF16, [](uint32_t c) { return f16_bits_to_float(static_cast<uint16_t>(c)); },
       [](float x) { return static_cast<uint32_t>(float_to_f16_bits(x)); }},
      {kBF16, [](uint32_t c) { return bf16_bits_to_float(static_cast<uint16_t>(c)); },
       [](float x) { return static_cast<uint32_t>(float_to_bf16_bits(x)); }},
  };
}

class CodeTable : public ::testing::TestWithParam<int> {
 protected:
  Codec codec() const { return codecs()[GetParam()]; }
};

std::string hex(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", c);
  return buf;
}

// Decode of every code equals the formula; -0 keeps its sign; NaN codes decode to NaN.
TEST_P(CodeTable, DecodeMatchesFormula) {
  const Codec c = codec();
  const uint32_t n = 1u << c.fmt.total_bits;
  int bad = 0;
  for (uint32_t code = 0; code < n; ++code) {
    const double want = reference_decode(c.fmt, code);
    const float got = c.decode(code);
    const bool ok = std::isnan(want) ? std::isnan(got)
                                     : (static_cast<double>(got) == want &&
                                        std::signbit(got) == std::signbit(want));
    if (!ok && bad++ < 5)
      ADD_FAILURE() << c.fmt.name << " code " << hex(code) << ": decode " << got << ", formula "
                    << want;
  }
  EXPECT_EQ(bad, 0);
}

// encode(decode(code)) == code for every non-NaN code.
TEST_P(CodeTable, RoundTripsEveryCode) {
  const Codec c = codec();
  const uint32_t n = 1u << c.fmt.total_bits;
  int bad = 0, nan_codes = 0;
  for (uint32_t code = 0; code < n; ++code) {
    const float v = c.decode(code);
    if (std::isnan(v)) {
      ++nan_codes;
      EXPECT_TRUE(std::isnan(c.decode(c.encode(v)))) << c.fmt.name << " NaN code " << hex(code);
      continue;
    }
    const uint32_t back = c.encode(v);
    if (back != code && bad++ < 5)
      ADD_FAILURE() << c.fmt.name << " code " << hex(code) << " (" << v << ") re-encodes to "
                    << hex(back);
  }
  EXPECT_EQ(bad, 0);
  // e4m3 FN has exactly two NaN codes; e2m1 none; IEEE-like formats 2 * (2^mbits - 1).
  const int want_nans = c.fmt.fn_nan_only    ? 2
                        : c.fmt.ieee_specials ? 2 * ((1 << c.fmt.mbits) - 1)
                                              : 0;
  EXPECT_EQ(nan_codes, want_nans) << c.fmt.name;
}

// The exact midpoint between consecutive codes rounds to the even code; one float ulp either
// side of it rounds to the nearer code. Both signs.
TEST_P(CodeTable, MidpointsRoundToEven) {
  const Codec c = codec();
  const uint32_t sign_bit = 1u << (c.fmt.total_bits - 1);
  int bad = 0;
  for (uint32_t lo = 0; lo < c.fmt.max_finite; ++lo) {
    const uint32_t hi = lo + 1;
    const double vlo = reference_decode(c.fmt, lo), vhi = reference_decode(c.fmt, hi);
    ASSERT_LT(vlo, vhi) << c.fmt.name << " codes are not ordered at " << hex(lo);
    const double mid = (vlo + vhi) / 2;
    const float fmid = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(fmid), mid) << "midpoint not representable in float";
    const uint32_t even = (lo & 1) ? hi : lo;
    for (int s = 0; s < 2; ++s) {
      const float sg = s ? -1.f : 1.f;
      const uint32_t sb = s ? sign_bit : 0;
      const struct {
        float x;
        uint32_t want;
      } cases[] = {{sg * fmid, sb | even},
                   {sg * std::nextafter(fmid, INFINITY), sb | hi},
                   {sg * std::nextafter(fmid, 0.f), sb | lo}};
      for (const auto& k : cases) {
        const uint32_t got = c.encode(k.x);
        if (got != k.want && bad++ < 5)
          ADD_FAILURE() << c.fmt.name << ": encode(" << k.x << ") = " << hex(got) << ", want "
                        << hex(k.want) << " (between " << vlo << " and " << vhi << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CodeTable, ::testing::Range(0, 5),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(codecs()[i.param].fmt.name);
                         });

// ---- saturation and specials ---------------------------------------------------------------
TEST(Saturation, E4M3SaturatesTo448IncludingInf) {
  for (float x : {448.f, 449.f, 464.f, 480.f, 1e6f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xFE) << -x;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.f);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(Saturation, E5M2FiniteOverflowTo57344InfStaysInf) {
  for (float x : {57344.f, 61439.f, 61440.f, 65536.f, 1e10f, FLT_MAX}) {
    EXPECT_EQ(float_to_e5m2(x), 0x7B) << x;
    EXPECT_EQ(float_to_e5m2(-x), 0xFB) << -x;
  }
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.f);
  EXPECT_EQ(float_to_e5m2(INFINITY), 0x7C);
  EXPECT_EQ(float_to_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_float(0xFC), -INFINITY);
  EXPECT_TRUE(std::isnan(e5m2_to_float(float_to_e5m2(NAN))));
}

TEST(Saturation, E2M1SaturatesTo6) {
  for (float x : {6.f, 6.5f, 7.f, 100.f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(float_to_e2m1(x), 0x7) << x;
    EXPECT_EQ(float_to_e2m1(-x), 0xF) << -x;
  }
  EXPECT_EQ(e2m1_to_float(0x7), 6.f);
  EXPECT_EQ(e2m1_to_float(0xF), -6.f);
  EXPECT_EQ(float_to_e2m1(NAN), 0x7);  // no NaN in e2m1: +6
}

TEST(Saturation, F16OverflowAndUnderflow) {
  EXPECT_EQ(float_to_f16_bits(65504.f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(65520.f, 0.f)), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65520.f), 0x7C00);  // the midpoint to 2^16 rounds to even = inf
  EXPECT_EQ(float_to_f16_bits(-65520.f), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.f, -25)), 0x0000);  // tie with 0 -> 0
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(-1e-10f), 0x8000);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(NAN))));
}

TEST(Saturation, BF16OverflowAndNaN) {
  EXPECT_EQ(float_to_bf16_bits(FLT_MAX), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-FLT_MAX), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7F7F8000u)), 0x7F80);  // tie: odd -> up
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x7F7E8000u)), 0x7F7E);  // tie: even stays
  EXPECT_EQ(float_to_bf16_bits(INFINITY), 0x7F80);
  // A NaN whose payload sits in the low bits must not round into inf.
  for (uint32_t bits : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu}) {
    const float x = std::bit_cast<float>(bits);
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(x)))) << hex(bits);
  }
}

// Random floats: f16/bf16 encode gives a code at least as near as both neighbours of the
// same sign (a brute-force nearest check independent of the rounding code).
TEST(Conversions, HalfAndBF16AreNearestOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-26, 14);  // f16: subnormals up to below 65504
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(mant(rng), ex(rng)) * ((i & 1) ? -1.f : 1.f);
    for (const Codec& c : {codecs()[3], codecs()[4]}) {
      const uint32_t got = c.encode(x), sign = got & 0x8000u, mag = got & 0x7FFFu;
      const double err = std::fabs(static_cast<double>(c.decode(got)) - x);
      if (mag > 0) {
        ASSERT_LE(err, std::fabs(c.decode(sign | (mag - 1)) - static_cast<double>(x)))
            << c.fmt.name << " x = " << x;
      }
      ASSERT_LE(err, std::fabs(c.decode(sign | (mag + 1)) - static_cast<double>(x)))
          << c.fmt.name << " x = " << x;
    }
  }
}

TEST(Conversions, LoadStoreAsFloat) {
  const auto x = test::random_floats(64, 3, -100.f, 100.f);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<uint32_t> buf(64, 0);
    for (int i = 0; i < 64; ++i) store_from_float(buf.data(), t, i, x[i]);
    std::vector<float> back(64), want(64);
    for (int i = 0; i < 64; ++i) {
      back[i] = load_as_float(buf.data(), t, i);
      want[i] = t == DType::f32   ? x[i]
                : t == DType::f16 ? f16_bits_to_float(float_to_f16_bits(x[i]))
                                  : bf16_bits_to_float(float_to_bf16_bits(x[i]));
    }
    EXPECT_TRUE(test::all_close(back, want, {64}, 0, 0)) << dtype_name(t);
  }
  uint8_t codes[2] = {0x38, 0x3C};  // e4m3 1.0, e5m2 1.0
  EXPECT_EQ(load_as_float(codes, DType::fp8_e4m3, 0), 1.f);
  EXPECT_EQ(load_as_float(codes, DType::fp8_e5m2, 1), 1.f);
  EXPECT_TRUE(test::throws_error_with([&] { store_from_float(codes, DType::fp8_e4m3, 0, 1.f); },
                                      {"dtype = fp8_e4m3"}));
  EXPECT_TRUE(test::throws_error_with([&] { load_as_float(codes, DType::nvfp4, 0); },
                                      {"dtype = nvfp4"}));
}

TEST(DTypeNames, RoundTripAndErrors) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2,
                  DType::nvfp4, DType::u8, DType::i32, DType::i64})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("fp8"), DType::fp8_e4m3);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_TRUE(test::throws_error_with([] { parse_dtype("f64"); }, {"name = f64"}));
  EXPECT_TRUE(test::throws_error_with([] { dtype_size(DType::nvfp4); }, {"dtype = nvfp4"}));
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_bits(DType::nvfp4), 4);
}

// ---- fp8 with a scale ----------------------------------------------------------------------
// Dequantized values are within half an ulp of x (relative 2^-(mbits+1)) in the normal range,
// and saturate at max * scale beyond it.
TEST(Fp8Scaled, QuantizeErrorWithinHalfUlp) {
  struct Case {
    DType t;
    int mbits;
    double max, min_normal;
  };
  for (Case c : {Case{DType::fp8_e4m3, 3, 448, std::ldexp(1.0, -6)},
                 Case{DType::fp8_e5m2, 2, 57344, std::ldexp(1.0, -14)}}) {
    for (float scale : {1.f, 0.03125f, 0.37f, 11.f}) {
      const auto x = test::random_floats(2000, 11, -600.f, 600.f);
      std::vector<float> got(x.size()), want(x.size());
      std::vector<double> tol(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        got[i] = dequantize_fp8(c.t, quantize_fp8(c.t, x[i], scale), scale);
        const double y = x[i] / static_cast<double>(scale);
        want[i] = std::fabs(y) >= c.max ? static_cast<float>(std::copysign(c.max, y) * scale)
                                        : x[i];
        const double half_ulp = std::max(std::fabs(y), c.min_normal) * std::ldexp(1.0, -c.mbits - 1);
        tol[i] = std::fabs(y) >= c.max ? 1e-6 * c.max * scale : half_ulp * scale * (1 + 1e-5);
      }
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - want[i]), tol[i])
            << dtype_name(c.t) << " scale " << scale << " x[" << i << "] = " << x[i];
    }
  }
  EXPECT_TRUE(test::throws_error_with([] { quantize_fp8(DType::bf16, 1.f, 1.f); },
                                      {"dtype = bf16", "fp8"}));
}

// ---- NVFP4 blocks --------------------------------------------------------------------------
// Half the gap of the e2m1 grid around |q| (in units of the block step).
double e2m1_half_gap(double q) { return q < 2 ? 0.25 : q < 4 ? 0.5 : 1.0; }

TEST(Nvfp4Block, ErrorBoundOverMagnitudesAndGlobalScales) {
  std::mt19937 rng(5);
  int blocks = 0;
  for (float g : {1.f, 0.01f, 1.f / 448.f, 3.5f}) {
    for (float amax_target : {0.05f, 1.f, 17.f, 300.f}) {
      // Keep the block scale amax/(6g) inside e4m3's normal range so the bound below holds.
      const double s_true = amax_target / (6.0 * g);
      if (s_true < std::ldexp(1.0, -6) || s_true > 448) continue;
      for (int rep = 0; rep < 50; ++rep, ++blocks) {
        std::uniform_real_distribution<float> d(-amax_target, amax_target);
        float x[16];
        for (float& v : x) v = d(rng);
        x[rep % 16] = (rep & 1) ? amax_target : -amax_target;  // pin amax
        uint8_t packed[8], sc;
        quantize_nvfp4_block(x, g, packed, &sc);
        float y[16];
        dequantize_nvfp4_block(packed, sc, g, y);
        const double step = static_cast<double>(e4m3_to_float(sc)) * g;
        // The block scale is amax/(6g) rounded to e4m3 (relative error <= 2^-4).
        ASSERT_NEAR(e4m3_to_float(sc), s_true, s_true / 16 * (1 + 1e-6));
        for (int i = 0; i < 16; ++i) {
          const double q = std::fabs(x[i]) / step;
          // Within the grid: half a gap; beyond 6 (scale rounded down): at most 6*step/16.
          const double bound = ((q <= 6 ? e2m1_half_gap(q) : q - 6) + 1e-5) * step;
          ASSERT_LE(std::fabs(y[i] - x[i]), bound)
              << "g " << g << " amax " << amax_target << " x[" << i << "] = " << x[i];
          ASSERT_LE(q - 6, 6.0 / 16 + 1e-6);
          // Dequantized value = e2m1 code * block scale * g (low nibble first).
          const uint8_t nib = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
          ASSERT_EQ(y[i], e2m1_to_float(nib) * (e4m3_to_float(sc) * g));
        }
      }
    }
  }
  EXPECT_GT(blocks, 400);
}

TEST(Nvfp4Block, RepresentableBlockIsExactAndLowNibbleFirst) {
  // Values k * step for the 16 e2m1 codes; amax 6 * step makes the block scale exact.
  const float g = 0.5f, s = 2.f, step = s * g;
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = e2m1_to_float(static_cast<uint8_t>(i)) * step;
  x[0] = 6 * step;  // code 7 at value 0 makes amax = 6 * step
  uint8_t packed[8], sc;
  quantize_nvfp4_block(x, g, packed, &sc);
  EXPECT_EQ(e4m3_to_float(sc), s);
  EXPECT_EQ(packed[0] & 0xF, 0x7);  // value 0 -> low nibble of byte 0
  for (int i = 1; i < 16; ++i) {
    const uint8_t nib = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
    if (i == 8) {
      EXPECT_EQ(nib & 0x7, 0) << "-0 keeps magnitude 0";
    } else {
      EXPECT_EQ(nib, i) << "value " << i;
    }
  }
  float y[16];
  dequantize_nvfp4_block(packed, sc, g, y);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(Nvfp4Block, ZeroBlock) {
  float x[16] = {};
  uint8_t packed[8], sc = 0xAA;
  std::fill(packed, packed + 8, 0xAA);
  quantize_nvfp4_block(x, 1.f, packed, &sc);
  EXPECT_EQ(sc, 0);
  for (uint8_t b : packed) EXPECT_EQ(b, 0);
  float y[16];
  dequantize_nvfp4_block(packed, sc, 1.f, y);
  for (float v : y) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace attnkit
