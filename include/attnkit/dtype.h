// Element types and exact host conversions (round to nearest even everywhere).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnkit {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  fp8_e4m3,  // OCP E4M3 "FN": max 448, no inf, NaN = S.1111.111
  fp8_e5m2,  // OCP E5M2: max 57344, has inf
  nvfp4,     // e2m1 packed two per byte (low nibble first) + e4m3 scale per 16 values + f32 global
  u8,        // raw bytes (packed NVFP4 cache storage)
  i32,
  i64,
};

std::string_view dtype_name(DType t);
// Accepts the names dtype_name prints plus engine spellings: "float32", "float16", "half",
// "bfloat16", "fp8" (= e4m3), "fp8_e4m3", "fp8_e5m2", "nvfp4", "uint8", "int32", "int64".
DType parse_dtype(std::string_view name);
// Bits of storage per element (4 for nvfp4 values, excluding their scales).
int dtype_bits(DType t);
// Bytes per element for whole-byte types; throws for nvfp4.
size_t dtype_size(DType t);
bool is_fp8(DType t);
bool is_float(DType t);  // f32, f16, bf16 (the types attention computes in)

// ---- exact host conversions --------------------------------------------------------------
uint16_t float_to_f16_bits(float x);   // IEEE binary16, RNE, overflow -> inf
float f16_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float x);  // RNE, NaN stays NaN (quiet)
float bf16_bits_to_float(uint16_t b);

// FP8 e4m3 (FN): RNE; |x| beyond 448 (including +-inf) saturates to +-448; NaN -> 0x7F.
uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t v);
// FP8 e5m2: RNE; finite |x| beyond 57344 saturates to +-57344; +-inf stays +-inf; NaN -> 0x7F.
uint8_t float_to_e5m2(float x);
float e5m2_to_float(uint8_t v);
// FP4 e2m1 (one nibble, values 0, 0.5, 1, 1.5, 2, 3, 4, 6): RNE, saturates at +-6; NaN -> +6.
uint8_t float_to_e2m1(float x);
float e2m1_to_float(uint8_t nibble);

// Quantize one value to the storage format `t` (fp8 types) given its dequant scale:
// stored = saturate(RNE(x / scale)). Returns the stored byte.
uint8_t quantize_fp8(DType t, float x, float scale);
float dequantize_fp8(DType t, uint8_t v, float scale);

// NVFP4: 16 values -> 8 packed bytes + one e4m3 block scale, given the global scale g:
// s = e4m3(amax / (6 g)); q_i = e2m1(x_i / (s g)) (0 when s == 0); value = q * s * g.
constexpr int kNvfp4BlockValues = 16;
void quantize_nvfp4_block(const float* x16, float global_scale, uint8_t* packed8,
                          uint8_t* scale_e4m3);
void dequantize_nvfp4_block(const uint8_t* packed8, uint8_t scale_e4m3, float global_scale,
                            float* out16);

// Reads element i of a buffer of dtype t as float (f32/f16/bf16; fp8 raw code, unscaled).
float load_as_float(const void* base, DType t, int64_t i);
// Writes float x as element i (f32/f16/bf16 with RNE).
void store_from_float(void* base, DType t, int64_t i, float x);

}  // namespace attnkit
