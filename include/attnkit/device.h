// A thin, CUDA-free view of the GPU runtime for programs that include only attnkit's headers
// (the CLI, the Python extension): device discovery, memory and copies. In a build without
// CUDA, cuda_device_count() is 0 and the rest throws Error.
#pragma once
#include <cstddef>
#include <cstdint>
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

// What GPU kernels found wrong in the metadata they were given, since the last read (on the
// current device): a block id outside the cache, a key count past its block-table row or
// negative, query offsets that decrease or run past the batch, a query longer than
// max_seqlen_q; and the write_kv tokens dropped for out-of-range slots. The kernels read no
// memory outside their buffers and write NaN to the rows a violation affects (the rows past
// max_seqlen_q are not computed at all); this record says which and why. Only the first
// violation's details are kept.
struct DeviceErrors {
  int64_t faults = 0;         // kernel violations (0: none)
  std::string first;          // the first one, in words
  int request = -1;           // ... its request
  int64_t value = 0;          // ... and offending value
  int64_t dropped_kv_tokens = 0;  // write_kv tokens dropped for a slot outside the cache
  bool any() const { return faults > 0 || dropped_kv_tokens > 0; }
  std::string describe() const;  // one line ("none" when !any())
};
// Reads and clears the record of the current device: one small copy on `stream`
// (cudaStream_t), then a wait for it; the caller chooses when (e.g. once per engine step). A
// build without CUDA returns an empty record.
DeviceErrors device_errors(void* stream = nullptr);
// Debug mode: every GPU entry point (attention, planned parts, write_kv) reads the record after
// its launches and throws Error if it holds anything (not on a stream that is capturing a CUDA
// graph). Off by default; ATTNKIT_CHECK_DEVICE_ERRORS=1 in the environment turns it on too.
void set_check_device_errors(bool on);
bool check_device_errors_enabled();

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
