#include "bench_util.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "cuda/convert.cuh"
#include "cuda/cuda_check.h"

namespace attnkit::bench {

namespace {

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

__device__ __forceinline__ uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(void* data, int64_t n, DType t, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float x = static_cast<float>(static_cast<int64_t>(h >> 40) - (1ll << 23)) * (1.f / (1 << 23));
    switch (t) {
      case DType::f32: static_cast<float*>(data)[i] = x; break;
      case DType::f16: static_cast<uint16_t*>(data)[i] = cuda::f32_to_f16_bits(x); break;
      case DType::bf16: static_cast<uint16_t*>(data)[i] = cuda::f32_to_bf16_bits(x); break;
      case DType::fp8_e4m3: static_cast<uint8_t*>(data)[i] = cuda::f32_to_e4m3(x); break;
      case DType::fp8_e5m2: static_cast<uint8_t*>(data)[i] = cuda::f32_to_e5m2(x); break;
      default: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(h); break;
    }
  }
}

}  // namespace

Recorder::Recorder(const std::string& json_path) {
  if (!json_path.empty()) {
    json_ = std::fopen(json_path.c_str(), "w");
    if (!json_) std::fprintf(stderr, "attnkit_bench: cannot write %s\n", json_path.c_str());
  }
}

Recorder::~Recorder() {
  if (json_) std::fclose(json_);
}

void Recorder::add(const Record& r) {
  records_.push_back(r);
  std::printf("%-9s %-44s %-12s %10.2f %-8s %9.4f ms  %s\n", r.section.c_str(), r.key.c_str(),
              r.impl.c_str(), r.value, r.metric.c_str(), r.ms, r.note.c_str());
  std::fflush(stdout);
  if (json_) {
    std::fprintf(json_,
                 "{\"section\": \"%s\", \"key\": \"%s\", \"impl\": \"%s\", \"metric\": \"%s\", "
                 "\"value\": %.6g, \"ms\": %.6g, \"note\": \"%s\"}\n",
                 json_escape(r.section).c_str(), json_escape(r.key).c_str(),
                 json_escape(r.impl).c_str(), json_escape(r.metric).c_str(), r.value, r.ms,
                 json_escape(r.note).c_str());
    std::fflush(json_);
  }
}

void Recorder::fail(const std::string& section, const std::string& key, const std::string& why) {
  Record r;
  r.section = section;
  r.key = key;
  r.impl = "attnkit";
  r.metric = "error";
  r.note = "FAILED: " + why;
  add(r);
}

double time_ms(const std::function<void()>& fn, cudaStream_t stream, int warmup, int reps, int inner) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&a));
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> samples;
  for (int r = 0; r < reps; ++r) {
    ATTNKIT_CUDA_CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < inner; ++i) fn();
    ATTNKIT_CUDA_CHECK(cudaEventRecord(b, stream));
    ATTNKIT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ATTNKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    samples.push_back(ms / inner);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

void fill_random(void* data, int64_t n, DType t, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<4096, 256, 0, stream>>>(data, n, t, seed);
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

void fill_random_bytes(void* data, int64_t bytes, uint64_t seed, cudaStream_t stream) {
  fill_random(data, bytes, DType::u8, seed, stream);
}

namespace {
std::string g_key_match;
}  // namespace

void set_key_match(const std::string& substr) { g_key_match = substr; }
bool key_selected(const std::string& key) {
  size_t begin = 0;
  while (true) {  // alternatives separated by '|'
    const size_t end = g_key_match.find('|', begin);
    const std::string alt = g_key_match.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (key.find(alt) != std::string::npos) return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

}  // namespace attnkit::bench
