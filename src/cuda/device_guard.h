// DeviceGuard: makes a tensor's device current for the launches in a scope and restores the
// caller's device afterwards, so a library call never leaves the thread on another GPU.
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace attnkit::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    ATTNKIT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) ATTNKIT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace attnkit::cuda
