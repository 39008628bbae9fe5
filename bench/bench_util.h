// Shared pieces of attnkit_bench: event timing, device random fill, and the result records
// (one JSON line each, the format bench/peers.py also writes and bench/report.py reads).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attnkit/dtype.h"

namespace attnkit::bench {

struct Record {
  std::string section;  // ceiling, kv_write, merge, prefill, decode
  std::string key;      // shape key shared with the peers
  std::string impl;     // attnkit, torch-FLASH, torch-cuDNN, ...
  std::string metric;   // GB/s, TFLOP/s
  double value = 0;
  double ms = 0;        // time per call
  std::string note;
};

class Recorder {
 public:
  explicit Recorder(const std::string& json_path);
  ~Recorder();
  void add(const Record& r);
  // A section that could not run: recorded with value 0 and the reason, so the table says so.
  void fail(const std::string& section, const std::string& key, const std::string& why);
  const std::vector<Record>& records() const { return records_; }

 private:
  FILE* json_ = nullptr;
  std::vector<Record> records_;
};

// Milliseconds per call of `fn` on `stream`: `warmup` untimed calls, then the median over
// `reps` samples, each sample timing `inner` back-to-back calls between two events.
double time_ms(const std::function<void()>& fn, cudaStream_t stream, int warmup, int reps, int inner = 1);

// Fills n values of dtype t (f32/f16/bf16/fp8 codes) with uniform values in [-1, 1) from a
// counter-based hash (different `seed`, different data; never zeros-only, never NaN).
void fill_random(void* data, int64_t n, DType t, uint64_t seed, cudaStream_t stream);
// Fills n raw bytes with hash bytes (for packed formats).
void fill_random_bytes(void* data, int64_t bytes, uint64_t seed, cudaStream_t stream);

// --match SUBSTR: the prefill and decode sections run only the shapes whose key contains it,
// or one of its '|'-separated alternatives (to profile one shape); empty = all.
void set_key_match(const std::string& substr);
bool key_selected(const std::string& key);

// Sections (each records what it measured; returns normally even when a part fails).
struct Ceilings {
  double read_gbps = 0, copy_gbps = 0, gemm_tflops = 0;
};
Ceilings run_ceilings(Recorder& rec, cudaStream_t stream);
void run_kv_write(Recorder& rec, cudaStream_t stream);
void run_merge(Recorder& rec, cudaStream_t stream);
void run_prefill(Recorder& rec, cudaStream_t stream, bool quick);
void run_decode(Recorder& rec, cudaStream_t stream, double read_gbps, bool quick);
// The FlashInfer-style planned decode on the decode shapes, pages 16 / 128 (decode_flashinfer.cpp).
void run_decode_flashinfer(Recorder& rec, cudaStream_t stream, double read_gbps, bool quick);
// The FlashInfer-style planned prefill (paged, ragged, skewed) and a mixed engine step through
// both backends' forwards (prefill_flashinfer.cpp).
void run_prefill_flashinfer(Recorder& rec, cudaStream_t stream, bool quick);
// "prefill d128 h32/8 causal s512x32": the prefill rows' key (shared with bench/peers.py).
std::string prefill_key(int head_size, int hq, int hkv, bool causal, int seqlen, int batch);
// attnkit_bench --split-sweep: decode shapes x forced split-KV counts, one printed table.
void run_split_sweep(Recorder& rec, cudaStream_t stream, double read_gbps);
// Per-CTA timeline of a few decode shapes (decode_trace.cu; attnkit_bench --decode-trace [DIR]:
// with DIR, every CTA's stamps also go to DIR/trace_<shape>.csv).
void run_decode_trace(Recorder& rec, cudaStream_t stream, double read_gbps, const std::string& dump_dir);

}  // namespace attnkit::bench
