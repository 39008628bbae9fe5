// KV cache: shapes and strides (NHD/HND), view addressing against the documented layout, and
// write_kv through slot_mapping for every cache dtype (padding, per-tensor/per-head fp8
// scales, nvfp4, strided inputs, separate strided K/V views). Expected cache bytes are built
// from the layout formulas written out here, not from the library's addressing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "reference/kv_row_reader.h"
#include "test_util.h"

namespace attnkit {
namespace {

constexpr uint8_t kPoison = 0xA5;

struct Geometry {
  int64_t num_blocks;
  int block_size, num_kv_heads, head_size;
};

const Geometry kGeometries[] = {{3, 16, 2, 32}, {2, 32, 3, 64}, {4, 16, 1, 16}, {2, 48, 4, 48}};
const DType kCacheDTypes[] = {DType::f32,      DType::f16,      DType::bf16,
                              DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4};

KVCacheSpec make_spec(const Geometry& g, DType t, KVLayout l) {
  KVCacheSpec s;
  s.num_blocks = g.num_blocks;
  s.block_size = g.block_size;
  s.num_kv_heads = g.num_kv_heads;
  s.head_size = g.head_size;
  s.cache_dtype = t;
  s.layout = l;
  return s;
}

std::vector<KVCacheSpec> all_specs() {
  std::vector<KVCacheSpec> out;
  for (const auto& g : kGeometries)
    for (DType t : kCacheDTypes) {
      if (t == DType::nvfp4 && g.head_size % 16) continue;
      for (KVLayout l : {KVLayout::NHD, KVLayout::HND}) out.push_back(make_spec(g, t, l));
    }
  return out;
}

std::string describe(const KVCacheSpec& s) {
  return std::string(dtype_name(s.cache_dtype)) + "_" + std::string(layout_name(s.layout)) +
         "_nb" + std::to_string(s.num_blocks) + "_bs" + std::to_string(s.block_size) + "_h" +
         std::to_string(s.num_kv_heads) + "_d" + std::to_string(s.head_size);
}

// ---- the documented layout, written out independently ---------------------------------------
struct HandLayout {
  KVCacheSpec s;
  int64_t elem() const { return s.cache_dtype == DType::nvfp4 ? 1 : dtype_size(s.cache_dtype); }
  int64_t row_elems() const {
    return s.cache_dtype == DType::nvfp4 ? s.head_size / 2 + s.head_size / 16 : s.head_size;
  }
  int64_t side_elems() const {
    return static_cast<int64_t>(s.block_size) * s.num_kv_heads * row_elems();
  }
  int64_t row_index(int slot_in_block, int head) const {
    return s.layout == KVLayout::NHD ? static_cast<int64_t>(slot_in_block) * s.num_kv_heads + head
                                     : static_cast<int64_t>(head) * s.block_size + slot_in_block;
  }
  // Element offset of row (b, side, s, h) for whole-element caches.
  int64_t row(int64_t b, int side, int slot_in_block, int head) const {
    return b * 2 * side_elems() + side * side_elems() + row_index(slot_in_block, head) * row_elems();
  }
  // nvfp4: byte offsets of the packed data row and of the scale row.
  int64_t nvfp4_data(int64_t b, int side, int sl, int h) const {
    return b * 2 * side_elems() + side * side_elems() + row_index(sl, h) * (s.head_size / 2);
  }
  int64_t nvfp4_scales(int64_t b, int side, int sl, int h) const {
    return b * 2 * side_elems() + side * side_elems() +
           static_cast<int64_t>(s.block_size) * s.num_kv_heads * (s.head_size / 2) +
           row_index(sl, h) * (s.head_size / 16);
  }
};

}  // namespace

// gtest prints parameters with these (internal linkage: other test files may print specs too).
static void PrintTo(const KVCacheSpec& s, std::ostream* os) { *os << describe(s); }

namespace {

class SpecTest : public ::testing::TestWithParam<KVCacheSpec> {};

TEST_P(SpecTest, ShapeStridesAndSizes) {
  const KVCacheSpec s = GetParam();
  ASSERT_NO_THROW(s.validate());
  const HandLayout hl{s};
  const int64_t R = hl.row_elems(), BS = s.block_size, H = s.num_kv_heads;
  EXPECT_EQ(s.storage_dtype(), s.cache_dtype == DType::nvfp4 ? DType::u8 : s.cache_dtype);
  EXPECT_EQ(s.row_elems(), R);
  EXPECT_EQ(s.logical_shape(), (std::array<int64_t, 5>{s.num_blocks, 2, BS, H, R}));
  if (s.layout == KVLayout::NHD) {
    EXPECT_EQ(s.stride_order(), (std::array<int, 5>{0, 1, 2, 3, 4}));
    EXPECT_EQ(s.logical_strides(), (std::array<int64_t, 5>{2 * BS * H * R, BS * H * R, H * R, R, 1}));
  } else {
    EXPECT_EQ(s.stride_order(), (std::array<int, 5>{0, 1, 3, 2, 4}));
    EXPECT_EQ(s.logical_strides(), (std::array<int64_t, 5>{2 * H * BS * R, H * BS * R, R, BS * R, 1}));
  }
  EXPECT_EQ(s.bytes_per_block(), 2 * BS * H * R * hl.elem());
  EXPECT_EQ(s.total_bytes(), s.num_blocks * s.bytes_per_block());
  if (s.cache_dtype == DType::nvfp4) EXPECT_EQ(R * 16, 9 * s.head_size);  // 9 * D / 16 bytes
}

// Every row (and nvfp4 scale row) the view addresses sits where the documented layout says,
// and together they cover the cache exactly once.
TEST_P(SpecTest, ViewAddressingMatchesLayoutAndCoversCacheOnce) {
  const KVCacheSpec s = GetParam();
  const HandLayout hl{s};
  std::vector<uint8_t> buf(s.total_bytes());
  const PagedKV kv = s.view(TensorView(buf.data(), s.storage_dtype(), {s.total_bytes() / hl.elem()}));
  EXPECT_EQ(kv.dtype, s.cache_dtype);
  EXPECT_EQ(kv.num_slots(), s.num_blocks * s.block_size);
  const auto ls = s.logical_strides();
  std::vector<int> covered(buf.size(), 0);
  auto cover = [&](int64_t byte, int64_t n) {
    ASSERT_GE(byte, 0);
    ASSERT_LE(byte + n, static_cast<int64_t>(buf.size()));
    for (int64_t i = 0; i < n; ++i) ++covered[byte + i];
  };
  for (int64_t b = 0; b < s.num_blocks; ++b)
    for (int side = 0; side < 2; ++side)
      for (int sl = 0; sl < s.block_size; ++sl)
        for (int h = 0; h < s.num_kv_heads; ++h) {
          const PagedKVSide& ps = side ? kv.v : kv.k;
          const int64_t slot = b * s.block_size + sl;
          const int64_t base = static_cast<uint8_t*>(ps.base) - buf.data();
          const int64_t at = base + row_offset(ps, s.block_size, slot, h) * hl.elem();
          if (s.cache_dtype != DType::nvfp4) {
            ASSERT_EQ(at, hl.row(b, side, sl, h) * hl.elem()) << b << side << sl << h;
            // Consistent with logical_strides() of the logical view.
            ASSERT_EQ(at, (b * ls[0] + side * ls[1] + sl * ls[2] + h * ls[3]) * hl.elem());
            cover(at, s.head_size * hl.elem());
          } else {
            ASSERT_EQ(at, hl.nvfp4_data(b, side, sl, h));
            const int64_t sat = static_cast<uint8_t*>(ps.scale_base) - buf.data() +
                                scale_offset(ps, s.block_size, slot, h);
            ASSERT_EQ(sat, hl.nvfp4_scales(b, side, sl, h));
            cover(at, s.head_size / 2);
            cover(sat, s.head_size / 16);
          }
        }
  const auto bad = std::count_if(covered.begin(), covered.end(), [](int c) { return c != 1; });
  EXPECT_EQ(bad, 0) << "bytes not covered exactly once";
}

// A 1-D view, the physical contiguous view and the logical strided view give the same PagedKV.
TEST_P(SpecTest, ViewAcceptsOneDPhysicalAndLogicalForms) {
  const KVCacheSpec s = GetParam();
  const HandLayout hl{s};
  std::vector<uint8_t> buf(s.total_bytes());
  const auto shape = s.logical_shape();
  const auto order = s.stride_order();
  const auto ls = s.logical_strides();
  const PagedKV a = s.view(TensorView(buf.data(), s.storage_dtype(), {s.total_bytes() / hl.elem()}));
  const PagedKV b = s.view(TensorView(buf.data(), s.storage_dtype(),
                                      {shape[order[0]], shape[order[1]], shape[order[2]],
                                       shape[order[3]], shape[order[4]]}));
  const PagedKV c = s.view(TensorView(buf.data(), s.storage_dtype(),
                                      {shape[0], shape[1], shape[2], shape[3], shape[4]},
                                      {ls[0], ls[1], ls[2], ls[3], ls[4]}));
  for (const PagedKV* p : {&b, &c}) {
    for (int side = 0; side < 2; ++side) {
      const PagedKVSide &x = side ? a.v : a.k, &y = side ? p->v : p->k;
      EXPECT_EQ(x.base, y.base);
      EXPECT_EQ(x.scale_base, y.scale_base);
      EXPECT_EQ(x.stride_block, y.stride_block);
      EXPECT_EQ(x.stride_slot, y.stride_slot);
      EXPECT_EQ(x.stride_head, y.stride_head);
      EXPECT_EQ(x.scale_stride_slot, y.scale_stride_slot);
      EXPECT_EQ(x.scale_stride_head, y.scale_stride_head);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, SpecTest, ::testing::ValuesIn(all_specs()),
                         [](const ::testing::TestParamInfo<KVCacheSpec>& i) {
                           return describe(i.param);
                         });

TEST(KVLayoutNames, ParseIsCaseInsensitive) {
  EXPECT_EQ(parse_layout("nhd"), KVLayout::NHD);
  EXPECT_EQ(parse_layout("HND"), KVLayout::HND);
  EXPECT_EQ(parse_layout("Hnd"), KVLayout::HND);
  EXPECT_EQ(layout_name(parse_layout(layout_name(KVLayout::HND))), "HND");
  EXPECT_TRUE(test::throws_error_with([] { parse_layout("NDH"); }, {"layout = NDH"}));
}

// ---- write_kv --------------------------------------------------------------------------------
enum class ScaleMode { none, per_tensor, per_head };

struct WriteCase {
  KVCacheSpec spec;
  DType input = DType::f32;
  ScaleMode scales = ScaleMode::none;
  bool strided_input = false;  // key/value rows inside a wider (fused qkv-like) buffer
};

std::string describe(const WriteCase& c) {
  const char* sm[] = {"noscale", "pertensor", "perhead"};
  return describe(c.spec) + "_in" + std::string(dtype_name(c.input)) + "_" +
         sm[static_cast<int>(c.scales)] + (c.strided_input ? "_strided" : "");
}

std::vector<WriteCase> write_cases() {
  std::vector<WriteCase> out;
  int i = 0;
  for (const KVCacheSpec& s : all_specs()) {
    std::vector<ScaleMode> modes = {ScaleMode::none};
    if (is_fp8(s.cache_dtype)) modes = {ScaleMode::per_tensor, ScaleMode::per_head};
    if (s.cache_dtype == DType::nvfp4) modes = {ScaleMode::none, ScaleMode::per_tensor};
    for (ScaleMode m : modes) {
      const DType inputs[] = {DType::f32, DType::bf16, DType::f16};
      out.push_back({s, inputs[i % 3], m, i % 2 == 1});
      ++i;
    }
  }
  return out;
}

// Host-owned input tensor [num_tokens, H, D] of dtype t, optionally with a wider token stride.
struct Input {
  std::vector<uint64_t> storage;
  TensorView view;
  std::vector<float> values;  // the values as stored (after conversion to t)
  float at(int64_t t, int h, int d, int H, int D) const { return values[(t * H + h) * D + d]; }
};

Input make_input(int64_t tokens, int H, int D, DType t, bool strided, uint64_t seed, float range) {
  Input in;
  const int64_t tok_stride = strided ? 3 * H * D : H * D;
  const int64_t elem = dtype_size(t);
  in.storage.assign((tokens * tok_stride * elem + 7) / 8 + 1, 0);
  auto* base = reinterpret_cast<uint8_t*>(in.storage.data());
  // The K (or V) part of a fused row starts after one H*D slice, as a qkv split would.
  auto* data = base + (strided ? H * D * elem : 0);
  in.view = TensorView(data, t, {tokens, H, D}, {tok_stride, D, 1});
  const auto x = test::random_floats(tokens * H * D, seed, -range, range);
  in.values.resize(x.size());
  for (int64_t tk = 0; tk < tokens; ++tk)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        const int64_t i = (tk * H + h) * D + d;
        store_from_float(data, t, tk * tok_stride + h * D + d, x[i]);
        in.values[i] = load_as_float(data, t, tk * tok_stride + h * D + d);
      }
  return in;
}

// Distinct random slots with some negative (padding) entries.
std::vector<int64_t> make_slots(int64_t num_slots, int64_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> all(num_slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(all.begin(), all.begin() + tokens);
  for (int64_t t = 0; t < tokens; ++t)
    if (rng() % 5 == 0) slots[t] = (rng() % 2) ? -1 : -static_cast<int64_t>(rng() % 1000) - 2;
  return slots;
}

// The cache bytes write_kv must produce: poison everywhere but the written rows, built with
// the HandLayout offsets. k_scales/v_scales are per KV head.
std::vector<uint8_t> expected_cache(const KVCacheSpec& s, const Input& k, const Input& v,
                                    const std::vector<int64_t>& slots,
                                    const std::vector<float>& ks, const std::vector<float>& vs) {
  const HandLayout hl{s};
  std::vector<uint8_t> out(s.total_bytes(), kPoison);
  const int H = s.num_kv_heads, D = s.head_size;
  std::vector<float> row(D);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    const int64_t b = slots[t] / s.block_size;
    const int sl = static_cast<int>(slots[t] % s.block_size);
    for (int side = 0; side < 2; ++side)
      for (int h = 0; h < H; ++h) {
        const Input& in = side ? v : k;
        for (int d = 0; d < D; ++d) row[d] = in.at(t, h, d, H, D);
        const float scale = side ? vs[h] : ks[h];
        if (is_float(s.cache_dtype)) {
          for (int d = 0; d < D; ++d)
            store_from_float(out.data(), s.cache_dtype, hl.row(b, side, sl, h) + d, row[d]);
        } else if (is_fp8(s.cache_dtype)) {
          for (int d = 0; d < D; ++d)
            out[hl.row(b, side, sl, h) + d] = quantize_fp8(s.cache_dtype, row[d], scale);
        } else {
          for (int j = 0; j < D / 16; ++j)
            quantize_nvfp4_block(row.data() + 16 * j, scale,
                                 out.data() + hl.nvfp4_data(b, side, sl, h) + 8 * j,
                                 out.data() + hl.nvfp4_scales(b, side, sl, h) + j);
        }
      }
  }
  return out;
}

void PrintTo(const WriteCase& c, std::ostream* os) { *os << describe(c); }

class WriteKVTest : public ::testing::TestWithParam<WriteCase> {};

TEST_P(WriteKVTest, WritesThroughSlotMappingAndLeavesOtherSlots) {
  const WriteCase c = GetParam();
  const KVCacheSpec& s = c.spec;
  const int H = s.num_kv_heads, D = s.head_size;
  const int64_t num_slots = s.num_blocks * s.block_size;
  const int64_t tokens = std::min<int64_t>(num_slots - 3, 41);
  const uint64_t seed = std::hash<std::string>()(describe(c));
  // fp8 inputs span several binades of the scaled range without saturating (saturation is
  // covered by the dtype tests).
  const float range = is_fp8(s.cache_dtype) ? 20.f : 3.f;
  const Input k = make_input(tokens, H, D, c.input, c.strided_input, seed, range);
  const Input v = make_input(tokens, H, D, c.input, c.strided_input, seed + 1, range);
  auto slots = make_slots(num_slots, tokens, seed + 2);

  std::vector<float> ks(H, 1.f), vs(H, 1.f);
  std::vector<float> k_scale_buf, v_scale_buf;
  KVScales scales;
  if (c.scales != ScaleMode::none) {
    const int n = c.scales == ScaleMode::per_head ? H : 1;
    for (int i = 0; i < n; ++i) {
      k_scale_buf.push_back(0.1f * (i + 1));
      v_scale_buf.push_back(0.3f / (i + 1));
    }
    for (int h = 0; h < H; ++h) {
      ks[h] = k_scale_buf[n == 1 ? 0 : h];
      vs[h] = v_scale_buf[n == 1 ? 0 : h];
    }
    scales.k_scale = TensorView(k_scale_buf.data(), DType::f32, {n});
    scales.v_scale = TensorView(v_scale_buf.data(), DType::f32, {n});
  }

  std::vector<uint8_t> buf(s.total_bytes(), kPoison);
  const PagedKV kv =
      s.view(TensorView(buf.data(), s.storage_dtype(), {s.total_bytes() / HandLayout{s}.elem()}));
  write_kv(k.view, v.view, kv, TensorView(slots.data(), DType::i64, {tokens}), scales);

  const auto want = expected_cache(s, k, v, slots, ks, vs);
  EXPECT_TRUE(test::all_close(buf, want, {s.num_blocks, s.bytes_per_block()}, 0, 0))
      << "cache bytes [block, byte in block]";

  // Reading back through the PagedKV addressing dequantizes to the inputs within the format's
  // resolution (this also shows which scale each head used).
  double worst = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int side = 0; side < 2; ++side)
      for (int h = 0; h < H; ++h) {
        const PagedKVSide& ps = side ? kv.v : kv.k;
        const Input& in = side ? v : k;
        const float scale = side ? vs[h] : ks[h];
        const int64_t off = row_offset(ps, s.block_size, slots[t], h);
        std::vector<float> got(D);
        if (is_float(s.cache_dtype)) {
          for (int d = 0; d < D; ++d)
            got[d] = load_as_float(static_cast<uint8_t*>(ps.base) +
                                       off * static_cast<int64_t>(dtype_size(s.cache_dtype)),
                                   s.cache_dtype, d);
        } else if (is_fp8(s.cache_dtype)) {
          for (int d = 0; d < D; ++d)
            got[d] = dequantize_fp8(s.cache_dtype, static_cast<uint8_t*>(ps.base)[off + d], scale);
        } else {
          const uint8_t* sc = static_cast<uint8_t*>(ps.scale_base) +
                              scale_offset(ps, s.block_size, slots[t], h);
          for (int j = 0; j < D / 16; ++j)
            dequantize_nvfp4_block(static_cast<uint8_t*>(ps.base) + off + 8 * j, sc[j], scale,
                                   got.data() + 16 * j);
        }
        for (int d = 0; d < D; ++d) {
          const double x = in.at(t, h, d, H, D);
          double tol;
          if (s.cache_dtype == DType::f32) tol = 0;
          else if (s.cache_dtype == DType::f16) tol = std::fabs(x) * 0x1p-11;
          else if (s.cache_dtype == DType::bf16) tol = std::fabs(x) * 0x1p-8;
          else if (s.cache_dtype == DType::fp8_e4m3) tol = std::fabs(x) / 16 + scale * 0x1p-10;
          else if (s.cache_dtype == DType::fp8_e5m2) tol = std::fabs(x) / 8 + scale * 0x1p-17;
          else tol = range / 6 * 17 / 16;  // nvfp4: at most one step of the block's grid
          worst = std::max(worst, std::fabs(got[d] - x) - tol);
        }
      }
  }
  EXPECT_LE(worst, 1e-6) << "dequantized read-back off by more than the format's resolution";
}

INSTANTIATE_TEST_SUITE_P(Grid, WriteKVTest, ::testing::ValuesIn(write_cases()),
                         [](const ::testing::TestParamInfo<WriteCase>& i) {
                           return describe(i.param);
                         });

TEST(WriteKV, EmptyAndAllPaddingWriteNothing) {
  const KVCacheSpec s = make_spec({2, 16, 2, 16}, DType::bf16, KVLayout::HND);
  std::vector<uint8_t> buf(s.total_bytes(), kPoison);
  const PagedKV kv = s.view(TensorView(buf.data(), DType::bf16, {s.total_bytes() / 2}));
  for (int64_t tokens : {0, 5}) {
    const Input k = make_input(tokens, 2, 16, DType::f32, false, 1, 1.f);
    std::vector<int64_t> slots(tokens, -1);
    write_kv(k.view, k.view, kv, TensorView(slots.data(), DType::i64, {tokens}));
    EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == kPoison; }));
  }
}

// A rejected slot leaves the cache untouched (every slot is checked before any write).
TEST(WriteKV, RejectedCallWritesNothing) {
  const KVCacheSpec s = make_spec({2, 16, 1, 16}, DType::f32, KVLayout::NHD);
  std::vector<uint8_t> buf(s.total_bytes(), kPoison);
  const PagedKV kv = s.view(TensorView(buf.data(), DType::f32, {s.total_bytes() / 4}));
  const Input k = make_input(3, 1, 16, DType::f32, false, 2, 1.f);
  std::vector<int64_t> slots = {0, 1, 32};
  EXPECT_TRUE(test::throws_error_with(
      [&] { write_kv(k.view, k.view, kv, TensorView(slots.data(), DType::i64, {3})); },
      {"slot_mapping[2] = 32", "< num_blocks * block_size = 32"}));
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == kPoison; }));
}

// ---- separate strided K/V views (vLLM's kv_cache[:, 0] / kv_cache[:, 1]) --------------------
struct SeparateCase {
  DType dtype;
  bool head_major;     // strides of an HND tensor's K/V halves
  int64_t block_pad;   // extra elements between blocks
};

void PrintTo(const SeparateCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << (c.head_major ? " head-major" : " slot-major") << " pad "
      << c.block_pad;
}

class SeparateViewsTest : public ::testing::TestWithParam<SeparateCase> {};

TEST_P(SeparateViewsTest, WriteLandsAtTheViewsStrides) {
  const SeparateCase c = GetParam();
  const int64_t NB = 3, BS = 16, H = 2, D = 32;
  const int64_t elem = dtype_size(c.dtype);
  const int64_t side = BS * H * D, bstride = 2 * side + c.block_pad;
  std::vector<uint8_t> buf(NB * bstride * elem, kPoison);
  const int64_t s_slot = c.head_major ? D : H * D, s_head = c.head_major ? BS * D : D;
  const TensorView kview(buf.data(), c.dtype, {NB, BS, H, D}, {bstride, s_slot, s_head, 1});
  const TensorView vview(buf.data() + side * elem, c.dtype, {NB, BS, H, D},
                         {bstride, s_slot, s_head, 1});
  const PagedKV kv = paged_kv_from_views(kview, vview);
  EXPECT_EQ(kv.num_blocks, NB);
  EXPECT_EQ(kv.block_size, BS);
  EXPECT_EQ(kv.num_kv_heads, H);
  EXPECT_EQ(kv.head_size, D);
  EXPECT_EQ(kv.dtype, c.dtype);

  const int64_t tokens = 20;
  const Input k = make_input(tokens, H, D, DType::f32, true, 9, 4.f);
  const Input v = make_input(tokens, H, D, DType::f32, false, 10, 4.f);
  auto slots = make_slots(NB * BS, tokens, 11);
  std::vector<float> scale = {0.5f};
  KVScales sc{TensorView(scale.data(), DType::f32, {1}), TensorView(scale.data(), DType::f32, {1})};
  write_kv(k.view, v.view, kv, TensorView(slots.data(), DType::i64, {tokens}), sc);

  std::vector<uint8_t> want(buf.size(), kPoison);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t b = slots[t] / BS, sl = slots[t] % BS;
    for (int sd = 0; sd < 2; ++sd)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const float x = (sd ? v : k).at(t, h, d, H, D);
          const int64_t e = b * bstride + sd * side + sl * s_slot + h * s_head + d;
          if (is_fp8(c.dtype)) want[e] = quantize_fp8(c.dtype, x, 0.5f);
          else store_from_float(want.data(), c.dtype, e, x);
        }
  }
  EXPECT_TRUE(test::all_close(buf, want, {NB, bstride * elem}, 0, 0));
}

INSTANTIATE_TEST_SUITE_P(Grid, SeparateViewsTest,
                         ::testing::Values(SeparateCase{DType::bf16, false, 0},
                                           SeparateCase{DType::f16, true, 0},
                                           SeparateCase{DType::f32, false, 24},
                                           SeparateCase{DType::fp8_e4m3, true, 40},
                                           SeparateCase{DType::fp8_e5m2, false, 8}));

// NVFP4 in FlashInfer's form: the codes and block scales of each side in their own tensors. The
// view reads what the tensors hold (the reference's row reader, against a direct decode), and
// every shape / dtype rule is an Error naming the tensor.
TEST(KVCache, Nvfp4FromSeparateViews) {
  constexpr int64_t NB = 3, BS = 16, H = 2, D = 64;
  std::vector<uint8_t> codes(2 * NB * BS * H * D / 2), scales(2 * NB * BS * H * D / 16);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + 11) & 0xff);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(0x20 + i % 32);
  // [NB, 2, BS, H, D / 2] and [NB, 2, BS, H, D / 16]: side s of block b at (b * 2 + s) * ...
  auto code_view = [&](int s) {
    return TensorView(codes.data() + s * BS * H * D / 2, DType::u8, {NB, BS, H, D / 2},
                      {2 * BS * H * D / 2, H * D / 2, D / 2, 1});
  };
  auto scale_view = [&](int s) {
    return TensorView(scales.data() + s * BS * H * D / 16, DType::u8, {NB, BS, H, D / 16},
                      {2 * BS * H * D / 16, H * D / 16, D / 16, 1});
  };
  const PagedKV kv = paged_kv_nvfp4_from_views(code_view(0), code_view(1), scale_view(0), scale_view(1));
  EXPECT_EQ(kv.dtype, DType::nvfp4);
  EXPECT_EQ(kv.head_size, D);
  EXPECT_EQ(kv.num_blocks, NB);
  const TensorView g;  // global scale 1
  for (int s = 0; s < 2; ++s) {
    const reference::KVRowReader reader(kv, s ? kv.v : kv.k, g);
    for (int64_t slot = 0; slot < NB * BS; slot += 7)
      for (int h = 0; h < H; ++h) {
        float row[D], want[D];
        reader.read(slot, h, row);
        const int64_t b = slot / BS, sl = slot % BS;
        const uint8_t* c = codes.data() + ((b * 2 + s) * BS + sl) * H * D / 2 + h * D / 2;
        const uint8_t* sc = scales.data() + ((b * 2 + s) * BS + sl) * H * D / 16 + h * D / 16;
        for (int blk = 0; blk < D / 16; ++blk) dequantize_nvfp4_block(c + blk * 8, sc[blk], 1.f, want + blk * 16);
        for (int d = 0; d < D; ++d) ASSERT_EQ(row[d], want[d]) << "side " << s << " slot " << slot << " head " << h << " dim " << d;
      }
  }
  EXPECT_TRUE(test::throws_error_with(
      [&] { paged_kv_nvfp4_from_views(code_view(0), code_view(1), scale_view(0), code_view(1)); },
      {"value_scales", "shape"}));
  const TensorView f32(codes.data(), DType::f32, {NB, BS, H, D / 8}, {2 * BS * H * D / 8, H * D / 8, D / 8, 1});
  EXPECT_TRUE(test::throws_error_with(
      [&] { paged_kv_nvfp4_from_views(f32, code_view(1), scale_view(0), scale_view(1)); }, {"key_codes", "dtype"}));
}

}  // namespace
}  // namespace attnkit
