// attnkit_bench: ceilings, KV write, prefill and decode in one run (about two minutes on an
// H200). Usage: attnkit_bench [--json results.jsonl] [--quick] [--only ceiling,kv_write,merge,prefill,decode,decode-fi,prefill-fi]
// [--match SUBSTR] (prefill / decode shapes whose key contains SUBSTR, e.g. "fp8 b16 kv4096")
// | --split-sweep (split_sweep.cpp) | --decode-trace (decode_trace.cu): diagnostics, with the ceilings
// Every number is the median of several event-timed samples after warm-up; decode is timed as
// CUDA graphs of back-to-back calls over KV instances that together exceed the L2 8x.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "bench_util.h"
#include "cuda/cuda_check.h"

int main(int argc, char** argv) {
  using namespace attnkit::bench;
  std::string json, only = "ceiling,kv_write,merge,prefill,decode,decode-fi,prefill-fi";
  bool quick = false, sweep = false, trace = false;
  std::string trace_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--match" && i + 1 < argc) {
      set_key_match(argv[++i]);
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--split-sweep") {
      sweep = true;
      only = "ceiling";
    } else if (a == "--decode-trace") {
      trace = true;
      only = "ceiling";
      if (i + 1 < argc && argv[i + 1][0] != '-') trace_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick] [--only ceiling,kv_write,merge,prefill,decode,decode-fi,prefill-fi] [--match SUBSTR] | --split-sweep | --decode-trace [DIR]\n", argv[0]);
      return 2;
    }
  }
  auto wanted = [&](const char* s) { return ("," + only + ",").find("," + std::string(s) + ",") != std::string::npos; };
  try {
    cudaStream_t stream;
    ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Recorder rec(json);
    std::printf("%-9s %-44s %-12s %10s %-8s %12s  %s\n", "section", "key", "impl", "value", "unit", "time", "note");
    Ceilings c;
    if (wanted("ceiling")) c = run_ceilings(rec, stream);
    if (wanted("kv_write")) run_kv_write(rec, stream);
    if (wanted("merge")) run_merge(rec, stream);
#ifdef ATTNKIT_BENCH_NO_ATTENTION
    const char* why = "not built: this tree has no flash_attn kernels (src/flash_attn/*.cu)";
    if (wanted("prefill")) rec.fail("prefill", "all prefill shapes", why);
    if (wanted("decode")) rec.fail("decode", "all decode shapes", why);
    if (wanted("decode-fi")) rec.fail("decode-fi", "all decode shapes", why);
    if (wanted("prefill-fi")) rec.fail("prefill-fi", "all prefill shapes", why);
    if (quick) std::printf("--quick: no attention sections to shorten in this build\n");
    if (sweep) rec.fail("sweep", "split sweep", why);
    if (trace) rec.fail("trace", "decode trace", why);
#else
    if (wanted("prefill")) run_prefill(rec, stream, quick);
    if (wanted("decode")) run_decode(rec, stream, c.read_gbps, quick);
    if (wanted("decode-fi")) run_decode_flashinfer(rec, stream, c.read_gbps, quick);
    if (wanted("prefill-fi")) run_prefill_flashinfer(rec, stream, quick);
    if (sweep) run_split_sweep(rec, stream, c.read_gbps);
    if (trace) run_decode_trace(rec, stream, c.read_gbps, trace_dir);
#endif
    ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaStreamDestroy(stream);
    if (wanted("ceiling"))
      std::printf("ceilings: read-only %.0f GB/s, copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", c.read_gbps,
                  c.copy_gbps, c.gemm_tflops);
    int failed = 0;
    for (const auto& r : rec.records()) failed += r.metric == "error";
    std::printf("attnkit_bench: %zu records, %d failed\n", rec.records().size(), failed);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnkit_bench: %s\n", e.what());
    return 1;
  }
}
