// The device error record: what GPU kernels found wrong in the metadata they were given (a block
// id outside the cache, a length past its table row, query rows past the batch), kept on the
// device (one record per GPU, a __device__ variable in device_errors.cu) until the host reads
// and clears it (attnkit::device_errors, include/attnkit/device.h). Kernels keep the first
// violation (kind, request, value) and count all of them; the rows it affects get NaN output
// and no memory outside the buffers is read (cuda/metadata_guard.cuh).
#pragma once
#include <cstdint>

namespace attnkit::cuda {

enum class DeviceFault : int32_t {
  none = 0,
  block_id = 1,            // a block-table / page-table entry outside [0, num_blocks): value = the id
  seq_len = 2,             // a request's key count < 0 or past its table row: value = the count
  query_rows = 3,          // cu_seqlens_q decreasing or past the batch's tokens: value = the end offset
  query_len_past_max = 4,  // query rows past max_seqlen_q (those rows are not computed): value = q_len
};
// In words, for the host's report ("unknown fault" for another value).
const char* device_fault_name(int32_t kind);

struct DeviceErrorRecord {
  unsigned int count;  // violations since the last clear
  int32_t kind;        // the first one's DeviceFault ...
  int32_t request;     // ... request ...
  int32_t pad;
  long long value;     // ... and offending value
};

#if defined(__CUDACC__)
// Counts a violation; the first one since the last clear leaves its kind, request and value.
__device__ __forceinline__ void record_fault(DeviceErrorRecord* r, DeviceFault kind, int request, long long value) {
  if (r != nullptr && atomicAdd(&r->count, 1u) == 0u) {
    r->kind = static_cast<int32_t>(kind);
    r->request = request;
    r->value = value;
  }
}
#endif

// The current device's record (host, CUDA builds; its address is cached per device).
DeviceErrorRecord* device_error_record();
// Copies the current device's record to the host on `stream` (cudaStream_t), waits, and clears it.
DeviceErrorRecord take_device_error_record(void* stream);
// The debug mode (attnkit::set_check_device_errors, or ATTNKIT_CHECK_DEVICE_ERRORS=1 in the
// environment): after each GPU entry point, unless `stream` is capturing a CUDA graph, read the
// record and throw an Error naming `where` and the first violation.
void check_device_errors_after(const char* where, void* stream);

}  // namespace attnkit::cuda
