// The host rules of the tensor maps (cuda/tensor_map.h), the paged cache's and the output rows':
// geometries TMA cannot express are refused with the rule they broke, before any driver call, so
// the launcher falls back (decode: to cp.async; hopper output: to the threads' copy). (Encoding
// itself needs a driver; the GPU tests cover the TMA path end to end.)
#ifdef ATTNKIT_WITH_CUDA
#include <gtest/gtest.h>

#include <string>

#include "cuda/tensor_map.h"

namespace attnkit {
namespace {

cuda::PagedSideGeometry nhd_fp8_hd128() {
  cuda::PagedSideGeometry g;
  g.base = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  g.row_bytes = 128;
  g.block_size = 16;
  g.num_kv_heads = 8;
  g.num_blocks = 1000;
  g.stride_head = 128;
  g.stride_slot = 8 * 128;
  g.stride_block = 16 * 8 * 128;
  return g;
}

// A geometry broken one way: `apply` breaks a valid one, `rule` is a piece of the reason.
template <class G>
struct Broken {
  const char* what;
  void (*apply)(G&);
  const char* rule;
};

// Each case, applied to valid(), is refused by encode(g, desc, &why) with its rule in `why`.
template <class G, size_t N, class Encode>
void expect_refused(const Broken<G> (&cases)[N], G (*valid)(), Encode encode) {
  for (const Broken<G>& c : cases) {
    SCOPED_TRACE(c.what);
    G g = valid();
    c.apply(g);
    cuda::TmaDesc desc{};
    std::string why;
    EXPECT_FALSE(encode(g, desc, &why));
    EXPECT_NE(why.find(c.rule), std::string::npos) << "reason: " << why;
  }
}

TEST(TensorMap, RefusesGeometriesTmaCannotExpress) {
  const Broken<cuda::PagedSideGeometry> cases[] = {
      {"row of 64 bytes (fp8 head size 64)", [](cuda::PagedSideGeometry& g) { g.row_bytes = 64; }, "row bytes 64"},
      {"row of 192 bytes", [](cuda::PagedSideGeometry& g) { g.row_bytes = 192; }, "row bytes 192"},
      {"row of 1024 bytes", [](cuda::PagedSideGeometry& g) { g.row_bytes = 1024; }, "row bytes 1024"},
      {"block size 24", [](cuda::PagedSideGeometry& g) { g.block_size = 24; }, "block size"},
      {"base off 16 bytes", [](cuda::PagedSideGeometry& g) { g.base = reinterpret_cast<const void*>(uintptr_t{1} << 20 | 8); }, "16-byte aligned"},
      {"slot stride 1000", [](cuda::PagedSideGeometry& g) { g.stride_slot = 1000; }, "stride 1000"},
      {"block stride 0", [](cuda::PagedSideGeometry& g) { g.stride_block = 0; }, "stride 0"},
      {"head stride 2^40", [](cuda::PagedSideGeometry& g) { g.stride_head = int64_t{1} << 40; }, "below 2^40"},
  };
  expect_refused(cases, nhd_fp8_hd128, cuda::encode_paged_side_map);
}

// The output rows' map (the hopper kernel's TMA stores, LaunchPlan::tma_output): [tokens][heads]
// rows of bf16 head size 128, boxes of a warp's 16 rows at GQA group 4. Refused geometries
// leave the launch on the threads' copy.
cuda::RowsGeometry out_rows_hd128() {
  cuda::RowsGeometry g;
  g.base = reinterpret_cast<void*>(uintptr_t{1} << 20);
  g.row_bytes = 256;
  g.heads = 32;
  g.tokens = 1000;
  g.stride_head = 256;
  g.stride_token = 32 * 256;
  g.box_heads = 4;
  g.box_tokens = 4;
  return g;
}

TEST(TensorMap, RefusesOutputRowGeometriesTmaCannotExpress) {
  EXPECT_EQ(cuda::rows_map_refusal(out_rows_hd128()), "");
  const Broken<cuda::RowsGeometry> cases[] = {
      {"base off 16 bytes", [](cuda::RowsGeometry& g) { g.base = reinterpret_cast<void*>(uintptr_t{1} << 20 | 8); }, "16-byte aligned"},
      {"row of 0 bytes", [](cuda::RowsGeometry& g) { g.row_bytes = 0; }, "row bytes 0"},
      {"row of 72 bytes", [](cuda::RowsGeometry& g) { g.row_bytes = 72; }, "row bytes 72"},
      {"head stride 8", [](cuda::RowsGeometry& g) { g.stride_head = 8; }, "stride 8"},
      {"token stride 2^40", [](cuda::RowsGeometry& g) { g.stride_token = int64_t{1} << 40; }, "below 2^40"},
      {"no tokens", [](cuda::RowsGeometry& g) { g.tokens = 0; }, "tokens 0"},
      {"box of 0 heads", [](cuda::RowsGeometry& g) { g.box_heads = 0; }, "box sides 0 x 4"},
      {"box of 512 tokens", [](cuda::RowsGeometry& g) { g.box_tokens = 512; }, "box sides 4 x 512"},
  };
  expect_refused(cases, out_rows_hd128, cuda::encode_rows_map);
}

}  // namespace
}  // namespace attnkit
#endif
