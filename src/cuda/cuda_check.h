// CUDA error checking: every failed runtime call or launch becomes an attnkit::Error naming
// the call, the CUDA error and where it happened.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "attnkit/error.h"

namespace attnkit::cuda {

inline void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw Error(std::string(call) + " at " + file + ":" + std::to_string(line),
              std::string("cudaError = ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
              "CUDA calls must succeed");
}

// Streams cross the public API as void*; nullptr means the caller chose the legacy default
// stream explicitly. The library never picks a stream on its own.
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace attnkit::cuda

#define ATTNKIT_CUDA_CHECK(expr) ::attnkit::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations at once (not asynchronous faults).
#define ATTNKIT_CUDA_CHECK_LAUNCH() ATTNKIT_CUDA_CHECK(cudaGetLastError())
