// Exact host conversions between float and the storage formats (RNE everywhere).
#include "attnkit/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "attnkit/error.h"

namespace attnkit {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::nvfp4: return "nvfp4";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::f32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::f16;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "fp8" || n == "fp8_e4m3" || n == "e4m3" || n == "float8_e4m3fn") return DType::fp8_e4m3;
  if (n == "fp8_e5m2" || n == "e5m2" || n == "float8_e5m2") return DType::fp8_e5m2;
  if (n == "nvfp4" || n == "fp4_e2m1") return DType::nvfp4;
  if (n == "u8" || n == "uint8") return DType::u8;
  if (n == "i32" || n == "int32") return DType::i32;
  if (n == "i64" || n == "int64") return DType::i64;
  fail("parse_dtype", "name", std::string(n),
       "must be one of f32, f16, bf16, fp8, fp8_e4m3, fp8_e5m2, nvfp4, u8, i32, i64");
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 32;
    case DType::f16: case DType::bf16: return 16;
    case DType::fp8_e4m3: case DType::fp8_e5m2: case DType::u8: return 8;
    case DType::nvfp4: return 4;
    case DType::i64: return 64;
  }
  return 0;
}

size_t dtype_size(DType t) {
  ATTNKIT_REQUIRE(t != DType::nvfp4, "dtype_size", "dtype", dtype_name(t),
                  "has no whole-byte element size (packed two per byte)");
  return static_cast<size_t>(dtype_bits(t) / 8);
}

bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }
bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// ---- a generic small-float encoder ------------------------------------------------------
// Encodes |x| (finite, >= 0) into a format with `mbits` mantissa bits and exponent bias `bias`
// (subnormals at exponent field 0), RNE. Returns the unsigned code (exponent|mantissa), which
// may exceed the format's largest finite code: callers saturate.
static uint32_t encode_small(double ax, int mbits, int bias) {
  if (ax == 0.0) return 0;
  int e;
  std::frexp(ax, &e);  // ax = f * 2^e, f in [0.5, 1)
  int exp_field = (e - 1) + bias;  // unbiased exponent of 1.f form is e-1
  const int min_normal_field = 1;
  double quantum;  // value of one mantissa ulp at this binade
  if (exp_field < min_normal_field) {
    exp_field = 0;
    quantum = std::ldexp(1.0, 1 - bias - mbits);
  } else {
    quantum = std::ldexp(1.0, (e - 1) - mbits);
  }
  // RNE on the scaled integer.
  const double q = ax / quantum;
  double r = std::nearbyint(q);  // default rounding mode is round-to-nearest-even
  uint64_t n = static_cast<uint64_t>(r);
  if (exp_field == 0) {
    // subnormal: n is the mantissa; n == 2^mbits rolls into the first normal.
    return static_cast<uint32_t>(n);
  }
  // normal: n in [2^mbits, 2^(mbits+1)]; rounding up to 2^(mbits+1) bumps the exponent.
  if (n == (uint64_t{1} << (mbits + 1))) {
    n >>= 1;
    ++exp_field;
  }
  return (static_cast<uint32_t>(exp_field) << mbits) | static_cast<uint32_t>(n - (uint64_t{1} << mbits));
}

static double decode_small(uint32_t code, int mbits, int bias) {
  const uint32_t exp_field = code >> mbits, man = code & ((1u << mbits) - 1);
  if (exp_field == 0) return std::ldexp(static_cast<double>(man), 1 - bias - mbits);
  return std::ldexp(1.0 + static_cast<double>(man) / (1u << mbits), static_cast<int>(exp_field) - bias);
}

uint16_t float_to_f16_bits(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7E00;
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return sign | 0x7C00;
  uint32_t c = encode_small(ax, 10, 15);
  if (c >= 0x7C00) c = 0x7C00;  // overflow -> inf
  return sign | static_cast<uint16_t>(c);
}

float f16_bits_to_float(uint16_t h) {
  const bool neg = h & 0x8000;
  const uint32_t c = h & 0x7FFF;
  if ((c & 0x7C00) == 0x7C00) {
    if (c & 0x3FF) return std::nanf("");
    return neg ? -INFINITY : INFINITY;
  }
  const float v = static_cast<float>(decode_small(c, 10, 15));
  return neg ? -v : v;
}

uint16_t float_to_bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lsb = (u >> 16) & 1;
  u += 0x7FFF + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || ax >= 448.0) return sign | 0x7E;  // saturate to 448
  uint32_t c = encode_small(ax, 3, 7);
  if (c > 0x7E) c = 0x7E;
  return sign | static_cast<uint8_t>(c);
}

float e4m3_to_float(uint8_t v) {
  const bool neg = v & 0x80;
  const uint32_t c = v & 0x7F;
  if (c == 0x7F) return std::nanf("");
  const float f = static_cast<float>(decode_small(c, 3, 7));
  return neg ? -f : f;
}

uint8_t float_to_e5m2(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isinf(x)) return sign | 0x7C;
  const double ax = std::fabs(static_cast<double>(x));
  uint32_t c = encode_small(ax, 2, 15);
  if (c > 0x7B) c = 0x7B;  // saturate finite values to 57344
  return sign | static_cast<uint8_t>(c);
}

float e5m2_to_float(uint8_t v) {
  const bool neg = v & 0x80;
  const uint32_t c = v & 0x7F;
  if (c >= 0x7C) {
    if (c == 0x7C) return neg ? -INFINITY : INFINITY;
    return std::nanf("");
  }
  const float f = static_cast<float>(decode_small(c, 2, 15));
  return neg ? -f : f;
}

uint8_t float_to_e2m1(float x) {
  if (std::isnan(x)) return 0x7;  // no NaN in e2m1: +6
  const uint8_t sign = std::signbit(x) ? 0x8 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || ax >= 6.0) return sign | 0x7;
  uint32_t c = encode_small(ax, 1, 1);
  if (c > 0x7) c = 0x7;
  return sign | static_cast<uint8_t>(c);
}

float e2m1_to_float(uint8_t nibble) {
  const bool neg = nibble & 0x8;
  const float f = static_cast<float>(decode_small(nibble & 0x7, 1, 1));
  return neg ? -f : f;
}

uint8_t quantize_fp8(DType t, float x, float scale) {
  const float y = x / scale;
  if (t == DType::fp8_e4m3) return float_to_e4m3(y);
  ATTNKIT_REQUIRE(t == DType::fp8_e5m2, "quantize_fp8", "dtype", dtype_name(t), "must be an fp8 type");
  return float_to_e5m2(y);
}

float dequantize_fp8(DType t, uint8_t v, float scale) {
  return (t == DType::fp8_e4m3 ? e4m3_to_float(v) : e5m2_to_float(v)) * scale;
}

void quantize_nvfp4_block(const float* x, float g, uint8_t* packed8, uint8_t* scale_e4m3) {
  float amax = 0.f;
  for (int i = 0; i < kNvfp4BlockValues; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const uint8_t s = float_to_e4m3(amax / (6.f * g));
  *scale_e4m3 = s;
  const float step = e4m3_to_float(s) * g;
  for (int i = 0; i < kNvfp4BlockValues; i += 2) {
    const uint8_t lo = step > 0.f ? float_to_e2m1(x[i] / step) : 0;
    const uint8_t hi = step > 0.f ? float_to_e2m1(x[i + 1] / step) : 0;
    packed8[i / 2] = static_cast<uint8_t>((lo & 0xF) | (hi << 4));
  }
}

void dequantize_nvfp4_block(const uint8_t* packed8, uint8_t scale_e4m3, float g, float* out16) {
  const float step = e4m3_to_float(scale_e4m3) * g;
  for (int i = 0; i < kNvfp4BlockValues; i += 2) {
    out16[i] = e2m1_to_float(packed8[i / 2] & 0xF) * step;
    out16[i + 1] = e2m1_to_float(packed8[i / 2] >> 4) * step;
  }
}

float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp8_e4m3: return e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::fp8_e5m2: return e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
    default: break;
  }
  fail("load_as_float", "dtype", dtype_name(t), "must be f32, f16, bf16 or fp8");
}

void store_from_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = x; return;
    case DType::f16: static_cast<uint16_t*>(base)[i] = float_to_f16_bits(x); return;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(x); return;
    default: break;
  }
  fail("store_from_float", "dtype", dtype_name(t), "must be f32, f16 or bf16");
}

}  // namespace attnkit
