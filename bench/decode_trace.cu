// Decode timeline (attnkit_bench --decode-trace, not part of the default run): where a decode
// call's time goes around its main loops. A few decode shapes run as a CUDA graph of back-to-back
// calls, as the decode section times them, with per-CTA timestamps (cuda/cta_trace.h); for the
// middle calls it prints, in us from the moment call k's first CTA passed its PDL wait (R_k):
//   first   median / max time its CTAs' first K/V tile landed
//   loop    min / median / max time its CTAs' main loops ended
//   epi     median epilogue length; merge: median length of the split merges (the merging CTAs)
//   exit    its last CTA's exit (E_k)
//   next    call k+1's CTAs: first / median entry (resident on an SM) and R_{k+1}
//   gap     R_{k+1} - E_k: grid completion -> the next grid's release
// and the ideal call time at the read-only ceiling of the same run. Medians over the calls.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_setup.h"
#include "bench_util.h"
#include "cuda/cta_trace.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"

namespace attnkit::bench {

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadSize = 128, kBlock = 16;
constexpr int kCalls = 12;  // graph length; calls 2 .. kCalls-3 are reported

struct TraceShape {
  DType cache;
  int batch, kv_len, splits;  // splits 0: the builder's count
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

// One call's CTA records, in ns relative to an origin.
struct CallTrace {
  std::vector<double> entry, released, first, loop_done, epi_len, merge_len, exit;
};

CallTrace call_trace(const uint64_t* rec, int ctas, uint64_t origin) {
  CallTrace c;
  auto at = [&](int i, int slot) { return static_cast<double>(static_cast<int64_t>(rec[i * cuda::kCtaTraceSlots + slot] - origin)); };
  for (int i = 0; i < ctas; ++i) {
    c.entry.push_back(at(i, cuda::kTraceEntry));
    c.released.push_back(at(i, cuda::kTraceReleased));
    c.first.push_back(at(i, cuda::kTraceFirstTile));
    c.loop_done.push_back(at(i, cuda::kTraceLoopDone));
    c.exit.push_back(at(i, cuda::kTraceExit));
    const double epi = at(i, cuda::kTraceEpilogue) - at(i, cuda::kTraceLoopDone);
    c.epi_len.push_back(epi);
    if (rec[i * cuda::kCtaTraceSlots + cuda::kTraceFlags] & 1)
      c.merge_len.push_back(at(i, cuda::kTraceExit) - at(i, cuda::kTraceEpilogue));
  }
  return c;
}

}  // namespace

void run_decode_trace(Recorder& rec, cudaStream_t stream, double read_gbps, const std::string& dump_dir) {
  const auto& props = cuda::current_device_props();
  DecodeBuffers buf = make_decode_buffers(int64_t{12} << 30, int64_t{4} << 30, 256, kHeads, kHeadSize, stream);
  if (buf.pool_bytes <= 0) {
    rec.fail("trace", "decode trace pool", "not enough free device memory");
    return;
  }
  const std::vector<TraceShape> shapes = {
      {DType::bf16, 16, 4096, 0},  {DType::bf16, 16, 4096, 1},  {DType::bf16, 16, 32768, 0},
      {DType::bf16, 64, 4096, 0},  {DType::fp8_e4m3, 16, 4096, 0}, {DType::fp8_e4m3, 16, 32768, 0},
      {DType::fp8_e4m3, 64, 4096, 0}};
  std::printf("\ndecode trace: us from R_k (call k's first CTA past its PDL wait), medians over calls 2..%d; read BW %.0f GB/s\n",
              kCalls - 3, read_gbps);
  std::printf("%-22s %5s %7s %7s | %6s %6s | %6s %6s %6s | %5s %5s | %6s | %6s %6s %6s | %5s\n", "shape", "CTAs",
              "call", "ideal", "first", "max", "loop0", "loop", "loopmx", "epi", "merge", "exit", "nxt0", "nxt50",
              "R_k+1", "gap");
  DType filled = DType::f32;
  for (const TraceShape& t : shapes) {
    const std::string key = std::string("decode ") + (t.cache == DType::bf16 ? "bf16" : "fp8") + " b" +
                            std::to_string(t.batch) + " kv" + std::to_string(t.kv_len);
    if (!key_selected(key)) continue;
    try {
      const KVCacheSpec spec = decode_pool_spec(t.cache, buf.pool_bytes, kBlock, kKvHeads, kHeadSize);
      if (filled != t.cache) {
        fill_random(buf.pool.get(), spec.total_bytes() / static_cast<int64_t>(dtype_size(t.cache)), t.cache, 41, stream);
        filled = t.cache;
      }
      const PagedKV cache = pool_view(spec, buf.pool.get());
      DecodeShape shape = make_decode_shape(t.batch, t.kv_len, spec, cache, buf.q.get(), buf.out.get(),
                                            t.cache == DType::bf16 ? nullptr : buf.scale.as<float>(), kHeads,
                                            props.l2_bytes, stream);
      const int splits = t.splits > 0 ? t.splits
                                      : builder_num_splits(t.batch, 1, t.kv_len, kHeads, kKvHeads, t.cache, props.sm_count);
      cuda::DeviceBuffer workspace =
          split_workspace(flash_attn::varlen_workspace_bytes(t.batch, kHeads, kHeadSize, splits), stream);
      const int ctas = t.batch * kKvHeads * splits;  // decode: one row tile per (request, KV head, split)
      cuda::DeviceBuffer trace(static_cast<size_t>(kCalls) * ctas * cuda::kCtaTraceSlots * sizeof(uint64_t));
      std::vector<flash_attn::VarlenArgs> calls;
      std::vector<flash_attn::LaunchTuning> tunings;
      for (int i = 0; i < kCalls; ++i) {
        flash_attn::VarlenArgs a = shape.args[i % shape.args.size()];
        a.num_splits = splits;
        a.workspace = workspace.get();
        a.workspace_bytes = workspace.bytes();
        calls.push_back(a);
        tunings.emplace_back();
        tunings.back().cta_trace = trace.as<uint64_t>() + static_cast<int64_t>(i) * ctas * cuda::kCtaTraceSlots;
      }
      time_rotating(calls, kCalls, stream, tunings);  // warm-up, then graph replays; the last one's stamps stay
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint64_t> host(static_cast<size_t>(kCalls) * ctas * cuda::kCtaTraceSlots);
      ATTNKIT_CUDA_CHECK(cudaMemcpy(host.data(), trace.get(), host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));

      if (!dump_dir.empty()) {  // every CTA of every call, ns from the first call's first release
        std::string name = key.substr(7) + "_s" + std::to_string(splits);  // (CTA = kv_head * splits + split + z * ...)
        for (char& ch : name) if (ch == ' ') ch = '_';
        const std::string path = dump_dir + "/trace_" + name + ".csv";
        if (FILE* f = std::fopen(path.c_str(), "w")) {
          uint64_t origin = ~uint64_t{0};
          for (int i = 0; i < ctas; ++i) origin = std::min(origin, host[i * cuda::kCtaTraceSlots + cuda::kTraceReleased]);
          std::fprintf(f, "call,cta,sm,entry,released,first,loop_done,epilogue,exit,merged\n");
          for (int k = 0; k < kCalls; ++k)
            for (int i = 0; i < ctas; ++i) {
              const uint64_t* r = host.data() + (static_cast<size_t>(k) * ctas + i) * cuda::kCtaTraceSlots;
              auto rel = [&](int slot) { return static_cast<long long>(r[slot] - origin); };
              std::fprintf(f, "%d,%d,%llu,%lld,%lld,%lld,%lld,%lld,%lld,%llu\n", k, i,
                           static_cast<unsigned long long>(r[cuda::kTraceSm]), rel(cuda::kTraceEntry),
                           rel(cuda::kTraceReleased), rel(cuda::kTraceFirstTile), rel(cuda::kTraceLoopDone),
                           rel(cuda::kTraceEpilogue), rel(cuda::kTraceExit),
                           static_cast<unsigned long long>(r[cuda::kTraceFlags]));
            }
          std::fclose(f);
        }
      }
      std::vector<double> call_us, first50, first_mx, loop0, loop50, loopmx, epi, merge, exit_mx, nxt0, nxt50, r_next, gap;
      for (int k = 2; k <= kCalls - 3; ++k) {
        const uint64_t* rk = host.data() + static_cast<size_t>(k) * ctas * cuda::kCtaTraceSlots;
        uint64_t origin = ~uint64_t{0};
        for (int i = 0; i < ctas; ++i) origin = std::min(origin, rk[i * cuda::kCtaTraceSlots + cuda::kTraceReleased]);
        const CallTrace c = call_trace(rk, ctas, origin);
        const CallTrace n = call_trace(rk + static_cast<size_t>(ctas) * cuda::kCtaTraceSlots, ctas, origin);
        const double e = quantile(c.exit, 1.0), rn = quantile(n.released, 0.0);
        first50.push_back(quantile(c.first, 0.5) / 1e3);
        first_mx.push_back(quantile(c.first, 1.0) / 1e3);
        loop0.push_back(quantile(c.loop_done, 0.0) / 1e3);
        loop50.push_back(quantile(c.loop_done, 0.5) / 1e3);
        loopmx.push_back(quantile(c.loop_done, 1.0) / 1e3);
        epi.push_back(quantile(c.epi_len, 0.5) / 1e3);
        merge.push_back(quantile(c.merge_len, 0.5) / 1e3);
        exit_mx.push_back(e / 1e3);
        nxt0.push_back(quantile(n.entry, 0.0) / 1e3);
        nxt50.push_back(quantile(n.entry, 0.5) / 1e3);
        r_next.push_back(rn / 1e3);
        gap.push_back((rn - e) / 1e3);
        call_us.push_back(rn / 1e3);
      }
      const double ideal = read_gbps > 0 ? shape.bytes / read_gbps / 1e3 : 0;
      char name[64];
      std::snprintf(name, sizeof name, "%s s%d", key.c_str() + 7, splits);
      std::printf("%-22s %5d %7.1f %7.1f | %6.2f %6.2f | %6.1f %6.1f %6.1f | %5.2f %5.2f | %6.1f | %6.1f %6.1f %6.1f | %5.2f\n",
                  name, ctas, quantile(call_us, 0.5), ideal, quantile(first50, 0.5), quantile(first_mx, 0.5),
                  quantile(loop0, 0.5), quantile(loop50, 0.5), quantile(loopmx, 0.5), quantile(epi, 0.5),
                  quantile(merge, 0.5), quantile(exit_mx, 0.5), quantile(nxt0, 0.5), quantile(nxt50, 0.5),
                  quantile(r_next, 0.5), quantile(gap, 0.5));
      std::fflush(stdout);
      char note[200];
      std::snprintf(note, sizeof note, "R_k to R_k+1 (traced graph of %d calls, %d splits); ideal at read BW %.1f us",
                    kCalls, splits, ideal);
      rec.add({"trace", key + " s" + std::to_string(splits), "attnkit", "us/call", quantile(call_us, 0.5),
               quantile(call_us, 0.5) / 1e3, note});
    } catch (const std::exception& e) {
      rec.fail("trace", key, e.what());
      cudaGetLastError();
    }
  }
}

}  // namespace attnkit::bench
