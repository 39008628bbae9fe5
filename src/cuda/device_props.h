// Per-device properties the launchers size their grids with (SM count, L2, shared memory),
// queried once per device and cached: cudaGetDeviceProperties is far too slow for a hot path.
#pragma once
#include <cstddef>
#include <string>

namespace attnkit::cuda {

struct DeviceProps {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // dynamic shared memory a kernel may opt into
  size_t smem_per_sm = 0;
  int max_threads_per_sm = 0;
  size_t global_mem_bytes = 0;
};

// Properties of device `device` (cached after the first call; thread-safe). Throws Error for
// an index that names no device.
const DeviceProps& device_props(int device);
// Properties of the calling thread's current device.
const DeviceProps& current_device_props();

}  // namespace attnkit::cuda
