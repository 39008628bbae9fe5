// A thin, CUDA-free view of the GPU runtime for programs that include only attnkit's headers
// (the CLI, the Python extension): device discovery, memory and copies. In a build without
// CUDA, cuda_device_count() is 0 and the rest throws Error.
#pragma once
#include <cstddef>
#include <string>

#include "attnkit/backend.h"

namespace attnkit {

// CUDA devices visible to this process; 0 when attnkit was built without CUDA, no driver is
// loaded or no GPU is present (never throws).
int cuda_device_count();
// Compute capability and SM count of a device (Error for an index that names none).
DeviceSpec cuda_device_spec(int device = 0);
std::string cuda_device_name(int device = 0);

// Memory and copies on the current device; stream = cudaStream_t (nullptr = legacy default).
void* cuda_malloc(size_t bytes);
void cuda_free(void* ptr) noexcept;
void cuda_copy_to_device(void* dst, const void* src, size_t bytes, void* stream);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
void cuda_stream_synchronize(void* stream);
// A non-blocking stream of the current device (never the legacy default stream).
void* cuda_stream_create();
void cuda_stream_destroy(void* stream) noexcept;

// Owning device allocation for host programs (move-only).
class CudaMemory {
 public:
  CudaMemory() = default;
  explicit CudaMemory(size_t bytes) : ptr_(bytes ? cuda_malloc(bytes) : nullptr), bytes_(bytes) {}
  ~CudaMemory() { cuda_free(ptr_); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    if (this != &o) {
      cuda_free(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace attnkit
