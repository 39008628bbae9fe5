// Functions written once for host and device code: __host__ __device__ under nvcc, inline in
// host-only translation units.
#pragma once

#if defined(__CUDACC__)
#define ATTNKIT_HD __host__ __device__ __forceinline__
#else
#define ATTNKIT_HD inline
#endif
