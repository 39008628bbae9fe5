#include "cuda/device_props.h"

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"

namespace attnkit::cuda {

namespace {

DeviceProps query(int device) {
  DeviceProps p;
  p.index = device;
  auto attr = [device](cudaDeviceAttr a) {
    int v = 0;
    ATTNKIT_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, device));
    return v;
  };
  p.cc_major = attr(cudaDevAttrComputeCapabilityMajor);
  p.cc_minor = attr(cudaDevAttrComputeCapabilityMinor);
  p.sm_count = attr(cudaDevAttrMultiProcessorCount);
  p.l2_bytes = static_cast<size_t>(attr(cudaDevAttrL2CacheSize));
  p.smem_per_block_optin = static_cast<size_t>(attr(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  p.smem_per_sm = static_cast<size_t>(attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
  p.max_threads_per_sm = attr(cudaDevAttrMaxThreadsPerMultiProcessor);
  // Name and total memory only come with the full property struct (slow, but once).
  cudaDeviceProp prop{};
  ATTNKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  p.name = prop.name;
  p.global_mem_bytes = prop.totalGlobalMem;
  return p;
}

struct Cache {
  std::mutex mu;
  std::vector<std::unique_ptr<DeviceProps>> props;  // stable addresses once filled
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

const DeviceProps& device_props(int device) {
  int count = 0;
  ATTNKIT_CUDA_CHECK(cudaGetDeviceCount(&count));
  ATTNKIT_REQUIRE(device >= 0 && device < count, "device_props", "device", device,
                  "must name one of the " + std::to_string(count) + " CUDA devices");
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.props.size() < static_cast<size_t>(count)) c.props.resize(count);
  if (!c.props[device]) c.props[device] = std::make_unique<DeviceProps>(query(device));
  return *c.props[device];
}

const DeviceProps& current_device_props() {
  int device = 0;
  ATTNKIT_CUDA_CHECK(cudaGetDevice(&device));
  return device_props(device);
}

}  // namespace attnkit::cuda
