// include/attnkit/device.h on the CUDA runtime.
#include <cuda_runtime.h>

#include "attnkit/device.h"
#include "cuda/cuda_check.h"

namespace attnkit {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

static void require_device_index(int device, const char* where) {
  const int n = cuda_device_count();
  ATTNKIT_REQUIRE(device >= 0 && device < n, where, "device", device,
                  "must name one of the " + std::to_string(n) + " visible CUDA devices");
}

DeviceSpec cuda_device_spec(int device) {
  require_device_index(device, "cuda_device_spec");
  int major = 0, minor = 0, sms = 0;
  ATTNKIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  ATTNKIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  ATTNKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return DeviceSpec::Cuda(major, minor, sms);
}

std::string cuda_device_name(int device) {
  require_device_index(device, "cuda_device_name");
  cudaDeviceProp p{};
  ATTNKIT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return p.name;
}

void* cuda_malloc(size_t bytes) {
  void* p = nullptr;
  ATTNKIT_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void cuda_free(void* ptr) noexcept {
  if (ptr) cudaFree(ptr);
}

void cuda_copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::as_stream(stream)));
}

void cuda_copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::as_stream(stream)));
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(cuda::as_stream(stream)));
}

void cuda_stream_synchronize(void* stream) {
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(cuda::as_stream(stream)));
}

void* cuda_stream_create() {
  cudaStream_t s = nullptr;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void cuda_stream_destroy(void* stream) noexcept {
  if (stream) cudaStreamDestroy(cuda::as_stream(stream));
}

}  // namespace attnkit
