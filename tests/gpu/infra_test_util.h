// Helpers for the GPU tests of the KV write, merge and conversion kernels: device copies of
// host vectors, a per-test stream, and poisoning.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"

namespace attnkit::test {

// A device copy of a host vector (same bytes).
template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& host) {
  cuda::DeviceBuffer buf(std::max<size_t>(1, host.size() * sizeof(T)));
  if (!host.empty())
    ATTNKIT_CUDA_CHECK(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buf;
}

template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer& buf, size_t n) {
  std::vector<T> host(n);
  if (n) ATTNKIT_CUDA_CHECK(cudaMemcpy(host.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Each test gets its own non-blocking stream: the library must never rely on the legacy one.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void sync() { ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* stream() const { return stream_; }
  cudaStream_t stream_ = nullptr;
};

template <class P>
class GpuParamTest : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override { ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void sync() { ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* stream() const { return stream_; }
  cudaStream_t stream_ = nullptr;
};

// Fills bytes with a repeating non-zero pattern that decodes to no plausible result: byte i =
// 0xA5 ^ (i * 29 + seed), of period 256, written once and then copied in doubling runs (caches of
// up to 84 MB: a byte loop there was a visible part of the KV-write grid's time).
inline void poison(std::vector<uint8_t>& bytes, uint8_t seed) {
  const size_t n = bytes.size(), period = n < 256 ? n : 256;
  for (size_t i = 0; i < period; ++i) bytes[i] = static_cast<uint8_t>(0xA5 ^ (i * 29 + seed));
  for (size_t done = period; done < n; done *= 2) std::memcpy(bytes.data() + done, bytes.data(), std::min(done, n - done));
}

}  // namespace attnkit::test
