// The build's GPU architectures (src/core/cuda_archs.h): the CMake list as parsed, which devices
// its code runs on, and the selector's rule for devices it does not.
#include <gtest/gtest.h>

#include "attnkit/error.h"
#include "core/cuda_archs.h"
#include "test_util.h"

namespace attnkit {
namespace {

TEST(CudaArchs, ParseAndRunOn) {
  struct Row {
    const char* list;
    std::vector<int> runs, not_runs;
  };
  const Row rows[] = {
      {"90a", {90}, {80, 86, 89, 100, 120}},                       // sm_90a SASS + its PTX: sm90 only
      {"90a-real;90-virtual", {90, 100, 120}, {80, 89}},          // + compute_90 PTX for later GPUs
      {"80-real;86-real;89-real;90a-real;90-virtual", {80, 86, 87, 89, 90, 100}, {75}},
      {"80;89-real;90a-real", {80, 86, 87, 89, 90, 100, 120}, {75}},  // the default: compute_80 PTX for later GPUs
      {"80-virtual", {80, 86, 89, 90, 100}, {75}},                 // PTX only: JIT on every later GPU
      {"80-real", {80, 86, 89}, {75, 90, 100}},                    // SASS runs within its major
      {"86,89", {86, 89, 100}, {80}},
  };
  for (const Row& r : rows) {
    const BuiltCudaArchs a = parse_cuda_archs(r.list);
    for (int cc : r.runs) EXPECT_TRUE(cuda_archs_run_on(a, cc)) << r.list << " on sm" << cc;
    for (int cc : r.not_runs) EXPECT_FALSE(cuda_archs_run_on(a, cc)) << r.list << " on sm" << cc;
  }
  const BuiltCudaArchs fat = parse_cuda_archs("80-real;86-real;89-real;90a-real;90-virtual");
  EXPECT_TRUE(fat.sm90a);
  EXPECT_EQ(describe_cuda_archs(fat), "sm_80, sm_86, sm_89, sm_90a, PTX compute_90");
  EXPECT_FALSE(parse_cuda_archs("90-real").sm90a);
  // The code a device runs: its SASS, else the newest PTX below it.
  EXPECT_EQ(cuda_code_cc(fat, 90), 90);
  EXPECT_EQ(cuda_code_cc(fat, 89), 89);
  EXPECT_EQ(cuda_code_cc(fat, 87), 86);
  EXPECT_EQ(cuda_code_cc(fat, 100), 90);
  const BuiltCudaArchs by_default = parse_cuda_archs("80;89-real;90a-real");
  EXPECT_TRUE(by_default.sm90a);
  EXPECT_EQ(describe_cuda_archs(by_default), "sm_80, sm_89, sm_90a, PTX compute_80");
  EXPECT_EQ(cuda_code_cc(by_default, 86), 80);  // (sm86 runs the sm_80 SASS)
  EXPECT_EQ(cuda_code_cc(by_default, 89), 89);
  EXPECT_EQ(cuda_code_cc(by_default, 90), 90);
  EXPECT_EQ(cuda_code_cc(by_default, 100), 80);  // (later GPUs JIT the compute_80 PTX: no TMA tiles)
  EXPECT_EQ(cuda_code_cc(parse_cuda_archs("80-virtual"), 90), 80);
  EXPECT_EQ(cuda_code_cc(parse_cuda_archs("90a"), 80), 0);
  EXPECT_EQ(describe_cuda_archs(BuiltCudaArchs{}), "no GPU code");
  EXPECT_TRUE(test::throws_error_with([] { parse_cuda_archs("80;sm_90"); }, {"sm_90", "CUDA architecture"}));
}

TEST(CudaArchs, SelectorRuleFollowsTheBuild) {
  const BuiltCudaArchs& b = built_cuda_archs();
  for (int cc : {80, 86, 89, 90, 100}) {
    const std::string why = gpu_code_refusal(cc);
    if ((b.sass.empty() && b.ptx.empty()) || cuda_archs_run_on(b, cc)) {
      EXPECT_EQ(why, "") << "sm" << cc;
    } else {
      EXPECT_NE(why.find("no GPU code that runs on sm" + std::to_string(cc)), std::string::npos) << why;
      EXPECT_NE(why.find(describe_cuda_archs(b)), std::string::npos) << why;
    }
  }
}

}  // namespace
}  // namespace attnkit
