// A build without CUDA: the GPU entry points exist and say why they cannot run.
#ifndef ATTNKIT_WITH_CUDA
#include "attnkit/dcp.h"
#include "attnkit/device.h"
#include "core/dcp_combine_check.h"
#include "attnkit/error.h"
#include "core/cuda_dispatch.h"
#include "flash_attn/varlen_launch.h"
#include "flashinfer/gpu_planned.h"

namespace attnkit::cuda {

[[noreturn]] static void no_cuda(const char* where) {
  throw Error(where, "device = cuda", "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

void write_kv(const TensorView&, const TensorView&, const PagedKV&, const TensorView&,
              const KVScales&, void*) {
  no_cuda("write_kv");
}

void merge_states(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                  const TensorView&, const TensorView&, void*) {
  no_cuda("merge_states");
}

}  // namespace attnkit::cuda

namespace attnkit {

int cuda_device_count() { return 0; }

[[noreturn]] static void no_cuda_runtime(const char* where) {
  throw Error(where, "device = cuda", "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

DeviceSpec cuda_device_spec(int) { no_cuda_runtime("cuda_device_spec"); }
std::string cuda_device_name(int) { no_cuda_runtime("cuda_device_name"); }
void* cuda_malloc(size_t) { no_cuda_runtime("cuda_malloc"); }
void cuda_free(void*) noexcept {}
void cuda_copy_to_device(void*, const void*, size_t, void*) { no_cuda_runtime("cuda_copy_to_device"); }
void cuda_copy_to_host(void*, const void*, size_t, void*) { no_cuda_runtime("cuda_copy_to_host"); }
void cuda_stream_synchronize(void*) { no_cuda_runtime("cuda_stream_synchronize"); }
void* cuda_stream_create() { no_cuda_runtime("cuda_stream_create"); }
void cuda_stream_destroy(void*) noexcept {}
DeviceErrors device_errors(void*) { return {}; }  // (no kernel ever ran)
bool dcp_combine_available() { return false; }
void dcp_combine(const DcpCombineArgs& a) {
  (void)dcp_combine_check(a);  // (the same errors as a CUDA build's for bad arguments)
  no_cuda_runtime("dcp_combine");
}
void set_check_device_errors(bool) {}
bool check_device_errors_enabled() { return false; }

}  // namespace attnkit

namespace attnkit::flash_attn {

void varlen_workspace_init(void*, size_t, void*) {
  throw Error("flash_attn varlen workspace init", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

void run_varlen_attention(const VarlenArgs&, const LaunchTuning&) {
  throw Error("flash_attn varlen attention", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}
void run_planned_attention(const VarlenArgs&, const PlannedLaunch&, const LaunchTuning&) {
  throw Error("flash_attn varlen attention", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

LaunchFacts varlen_launch_facts(const VarlenArgs&) {
  throw Error("flash_attn varlen launch facts", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

bool hopper_kernels_available() { return false; }

}  // namespace attnkit::flash_attn
namespace attnkit::flashinfer {

DevicePlan::DevicePlan(const PlanCapacity&, int, int64_t, void*, size_t) {
  throw Error("flashinfer planned part", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}
DevicePlan::~DevicePlan() = default;
void DevicePlan::upload(const PlanBuffers&, const PageTable&, const PlanBatch&, void*) {}
void DevicePlan::stage(const PlanBuffers&, const PageTable&, const PlanBatch&) {}
bool DevicePlan::copy_staged(void*) { return false; }
bool stream_capturing(void*) {
  throw Error("flashinfer planned part", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}
void run_planned_part(const DevicePlan&, const PlanBuffers&, const PageTable&, const PlanBatch&,
                        const PlannedPartArgs&, const flash_attn::LaunchTuning&) {
  throw Error("flashinfer planned part", "device = cuda",
              "this attnkit was built without CUDA (ATTNKIT_CUDA=OFF or no nvcc)");
}

}  // namespace attnkit::flashinfer

#endif
