// The CUDA reshape-and-cache (attnkit::cuda::write_kv, declared in core/cuda_dispatch.h) and
// its out-of-range policy.
//
// Policy for slot values. The public write_kv checks slot values on the host only for a CPU
// slot_mapping; a CUDA slot_mapping stays on the device (reading it back would cost a copy and
// a synchronization per call and could not be captured in a CUDA graph). So the kernel itself
// writes token t only when 0 <= slot_mapping[t] < num_blocks * block_size: negative slots are
// padding (skipped, not counted) and a slot >= num_slots is skipped too and counted, once per
// token, in a per-device counter. No write can land outside the cache whatever the slots hold.
// The counter is the cheap flag the host can look at when it wants to know (tests, debug
// builds of an engine): one 8-byte read on a stream of its choice.
#pragma once
#include <cstdint>

namespace attnkit::cuda {

// Tokens dropped for an out-of-range slot by write_kv calls on `device` since the last take.
// Ordered after the work already queued on `stream` (a cudaStream_t; synchronizes it).
int64_t write_kv_dropped_tokens(int device, void* stream);
// The same, and resets the counter to 0 (ordered on `stream`).
int64_t take_write_kv_dropped_tokens(int device, void* stream);

}  // namespace attnkit::cuda
