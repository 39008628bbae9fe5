#include "core/cuda_archs.h"

#include <algorithm>
#include <cctype>

#include "attnkit/error.h"

namespace attnkit {

BuiltCudaArchs parse_cuda_archs(const std::string& list) {
  BuiltCudaArchs a;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find_first_of(",;", begin);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    bool sass = true, ptx = true;
    if (item.ends_with("-real")) {
      ptx = false;
      item.resize(item.size() - 5);
    } else if (item.ends_with("-virtual")) {
      sass = false;
      item.resize(item.size() - 8);
    }
    const bool arch_a = !item.empty() && item.back() == 'a';
    if (arch_a) item.pop_back();
    ATTNKIT_REQUIRE(!item.empty() && item.size() <= 3 && std::all_of(item.begin(), item.end(), ::isdigit),
                    "parse_cuda_archs", "architecture", item, "must be a CUDA architecture such as 80, 90a or 90-virtual");
    const int cc = std::stoi(item);
    if (sass) a.sass.push_back(cc);
    if (ptx && !arch_a) a.ptx.push_back(cc);  // (an sm_90a PTX runs on sm90 only: its SASS covers it)
    if (sass && arch_a && cc == 90) a.sm90a = true;
  }
  return a;
}

const BuiltCudaArchs& built_cuda_archs() {
#ifdef ATTNKIT_CUDA_ARCHS_STR
  static const BuiltCudaArchs archs = parse_cuda_archs(ATTNKIT_CUDA_ARCHS_STR);
#else
  static const BuiltCudaArchs archs;
#endif
  return archs;
}

bool cuda_archs_run_on(const BuiltCudaArchs& archs, int cc) {
  for (int s : archs.sass)
    if (s / 10 == cc / 10 && s % 10 <= cc % 10) return true;
  for (int p : archs.ptx)
    if (p <= cc) return true;
  return false;
}

int cuda_code_cc(const BuiltCudaArchs& archs, int cc) {
  int best = 0;
  for (int s : archs.sass)
    if (s / 10 == cc / 10 && s % 10 <= cc % 10) best = std::max(best, s);
  if (best > 0) return best;
  for (int p : archs.ptx)
    if (p <= cc) best = std::max(best, p);
  return best;
}

std::string describe_cuda_archs(const BuiltCudaArchs& archs) {
  std::string s;
  for (int cc : archs.sass) s += (s.empty() ? "sm_" : ", sm_") + std::to_string(cc) + (cc == 90 && archs.sm90a ? "a" : "");
  for (int cc : archs.ptx) s += (s.empty() ? "PTX compute_" : ", PTX compute_") + std::to_string(cc);
  return s.empty() ? "no GPU code" : s;
}

int smem_per_block_optin(int cc) {
  switch (cc) {
    case 90: case 100: case 103: case 110: return 227 * 1024;
    case 80: case 87: return 163 * 1024;
    default: return 99 * 1024;
  }
}

std::string gpu_code_refusal(int cc) {
  const BuiltCudaArchs& b = built_cuda_archs();
  if ((b.sass.empty() && b.ptx.empty()) || cuda_archs_run_on(b, cc)) return {};
  return "this build has no GPU code that runs on sm" + std::to_string(cc) + " (it contains " + describe_cuda_archs(b) +
         "; CMake ATTNKIT_CUDA_ARCHS)";
}

}  // namespace attnkit
