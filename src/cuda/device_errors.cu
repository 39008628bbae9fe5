#include "cuda/device_errors.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attnkit/device.h"
#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kv_write.h"

namespace attnkit::cuda {

namespace {

__device__ DeviceErrorRecord g_device_errors = {0u, 0, -1, 0, 0};

constexpr int kMaxDevices = 64;
std::array<std::atomic<DeviceErrorRecord*>, kMaxDevices> g_record_addr{};

std::atomic<int> g_checks{-1};  // -1: not read from the environment yet

bool checks_on() {
  int v = g_checks.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("ATTNKIT_CHECK_DEVICE_ERRORS");
    v = (env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0) ? 1 : 0;
    int expected = -1;
    g_checks.compare_exchange_strong(expected, v);
    v = g_checks.load(std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

const char* device_fault_name(int32_t kind) {
  switch (static_cast<DeviceFault>(kind)) {
    case DeviceFault::none: return "none";
    case DeviceFault::block_id: return "block id outside the cache's [0, num_blocks)";
    case DeviceFault::seq_len: return "key count (seq_lens / seqused_k) negative or past its block-table row";
    case DeviceFault::query_rows: return "query offsets (cu_seqlens_q) decreasing or past the batch's tokens";
    case DeviceFault::query_len_past_max: return "query length above max_seqlen_q (its rows past it are not written)";
  }
  return "unknown fault";
}

DeviceErrorRecord* device_error_record() {
  int dev = 0;
  ATTNKIT_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNKIT_REQUIRE(dev >= 0 && dev < kMaxDevices, "device error record", "device", dev,
                  "must be < " + std::to_string(kMaxDevices));
  DeviceErrorRecord* addr = g_record_addr[dev].load(std::memory_order_acquire);
  if (addr == nullptr) {
    void* p = nullptr;
    ATTNKIT_CUDA_CHECK(cudaGetSymbolAddress(&p, g_device_errors));
    addr = static_cast<DeviceErrorRecord*>(p);
    g_record_addr[dev].store(addr, std::memory_order_release);
  }
  return addr;
}

DeviceErrorRecord take_device_error_record(void* stream) {
  DeviceErrorRecord* addr = device_error_record();
  DeviceErrorRecord r{};
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(&r, addr, sizeof r, cudaMemcpyDeviceToHost, as_stream(stream)));
  ATTNKIT_CUDA_CHECK(cudaMemsetAsync(addr, 0, sizeof(unsigned int), as_stream(stream)));
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
  if (r.count == 0) {
    r.kind = 0;
    r.request = -1;
    r.value = 0;
  }
  return r;
}

void check_device_errors_after(const char* where, void* stream) {
  if (!checks_on()) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ATTNKIT_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream), &status));
  if (status != cudaStreamCaptureStatusNone) return;  // (a capture cannot synchronise)
  const DeviceErrors e = device_errors(stream);
  if (e.any()) throw Error(where, "device errors", e.describe());
}

}  // namespace attnkit::cuda

namespace attnkit {

DeviceErrors device_errors(void* stream) {
  const cuda::DeviceErrorRecord r = cuda::take_device_error_record(stream);
  DeviceErrors e;
  e.faults = r.count;
  if (r.count > 0) {
    e.first = cuda::device_fault_name(r.kind);
    e.request = r.request;
    e.value = r.value;
  }
  int dev = 0;
  ATTNKIT_CUDA_CHECK(cudaGetDevice(&dev));
  e.dropped_kv_tokens = cuda::take_write_kv_dropped_tokens(dev, stream);
  return e;
}

void set_check_device_errors(bool on) { cuda::g_checks.store(on ? 1 : 0); }
bool check_device_errors_enabled() { return cuda::checks_on(); }

}  // namespace attnkit
