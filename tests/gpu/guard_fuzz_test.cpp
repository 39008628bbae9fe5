// GPU fuzz of the kernels' metadata guards (src/cuda/metadata_guard.cuh): random batches over
// every FlashAttention-style kernel family the small-case generator reaches (decode tiles with
// cp.async and TMA fills, the transposed fp8 tile, the mma_sync prefill tile, the hopper kernel,
// split launches, contiguous K/V), each under every tuning variant of its launch, with valid
// metadata or one violation written into the device copies only (the references read the
// host's): a block id past the cache or negative, a key count past the table row or negative,
// query offsets that decrease or run past the batch, a max_seqlen_q below a query's length.
// Checks: no CUDA error; valid metadata matches the CPU reference with an empty error record;
// a violation is in the record (kind and request), the request's rows are NaN (a block fault:
// the rows that read the block; the others may still match), and the requests it cannot touch
// match the reference. DeviceGuardsSanitizer runs a reduced grid under compute-sanitizer
// memcheck (tools/gpu-check.sh: SANITIZER_FILTER '*Sanitizer*'): no access outside the buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "attnkit/device.h"
#include "device_fill.h"

namespace attnkit::test {
Case random_small_case(uint64_t seed);
Case random_head_size_case(uint64_t seed);

namespace {

enum class Fault { none, block_high, block_negative, seq_past_table, seq_negative, cu_decreasing, cu_past_tokens,
                   max_q_small };
const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none: return "none";
    case Fault::block_high: return "block id past the cache";
    case Fault::block_negative: return "negative block id";
    case Fault::seq_past_table: return "key count past the table row";
    case Fault::seq_negative: return "negative key count";
    case Fault::cu_decreasing: return "decreasing query offsets";
    case Fault::cu_past_tokens: return "query offsets past the batch";
    case Fault::max_q_small: return "max_seqlen_q below a query";
  }
  return "?";
}
// What the record's first violation says for each (DeviceErrors::first).
const char* recorded_as(Fault f) {
  switch (f) {
    case Fault::block_high:
    case Fault::block_negative: return "block id";
    case Fault::seq_past_table:
    case Fault::seq_negative: return "key count";
    case Fault::cu_decreasing:
    case Fault::cu_past_tokens: return "query offsets";
    case Fault::max_q_small: return "max_seqlen_q";
    case Fault::none: break;
  }
  return "";
}

struct Tally {
  int64_t cases = 0, runs = 0, faulty = 0;
};

// Rows [t0, t1) of [T, H, D] values.
std::vector<float> token_rows(const std::vector<float>& v, int64_t t0, int64_t t1, int64_t row) {
  return {v.begin() + t0 * row, v.begin() + t1 * row};
}
bool row_is_nan(const std::vector<float>& v, int64_t t, int64_t row) {
  return std::all_of(v.begin() + t * row, v.begin() + (t + 1) * row, [](float x) { return std::isnan(x); });
}

void fuzz_case(uint64_t seed, Tally& tally) {
  Case c = seed % 5 == 4 ? random_head_size_case(7000 + seed) : random_small_case(6000 + seed);
  c.pad_tokens = 0;
  c.want_lse = true;
  std::mt19937_64 rng(seed * 1000003 + 17);
  Problem p(c);
  const Result ref = p.run_cpu_reference();
  const int n = static_cast<int>(c.q_lens.size());
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  const int64_t row = int64_t{H} * D;
  std::vector<int32_t> cu = p.cu_seqlens(), seq = p.seq_lens(), table = p.block_table();
  const int mb = p.max_blocks();

  // The violation and its request (one with queries and keys; none: valid metadata).
  std::vector<int> candidates;
  for (int r = 0; r < n; ++r)
    if (c.q_lens[r] > 0 && c.seq_lens[r] > 0) candidates.push_back(r);
  Fault f = static_cast<Fault>(rng() % 8);
  if (candidates.empty()) f = Fault::none;
  if (f == Fault::max_q_small && c.max_query_len() * c.group <= 16) f = Fault::none;  // (no row tile to lose)
  if ((f == Fault::block_high || f == Fault::block_negative) && c.contiguous_kv) f = Fault::seq_negative;
  int bad = candidates.empty() ? -1 : candidates[rng() % candidates.size()];
  int max_query_len = c.max_query_len();
  switch (f) {
    case Fault::none: bad = -1; break;
    case Fault::block_high:
    case Fault::block_negative: {
      // A page the request's last query row reads (its last one; any one without a window).
      const int pages = (c.seq_lens[bad] + c.block_size - 1) / c.block_size;
      const int page = c.window_left < 0 && c.window_right < 0 ? static_cast<int>(rng() % pages) : pages - 1;
      table[static_cast<size_t>(bad) * mb + page] =
          f == Fault::block_high ? 0x7ffffff0 - static_cast<int32_t>(rng() % 1000) : -1 - static_cast<int32_t>(rng() % 1000);
      break;
    }
    case Fault::seq_past_table: seq[bad] = (c.contiguous_kv ? c.seq_lens[bad] : mb * c.block_size) + 1 + static_cast<int>(rng() % 500); break;
    case Fault::seq_negative: seq[bad] = -1 - static_cast<int>(rng() % 100); break;
    case Fault::cu_decreasing: cu[bad + 1] = cu[bad] - 1 - static_cast<int>(rng() % 3); break;
    case Fault::cu_past_tokens:
      bad = n - 1;
      cu[n] = static_cast<int32_t>(T) + 1 + static_cast<int>(rng() % 50);
      break;
    case Fault::max_q_small:
      // Packed rows of one decode tile: the longer queries' rows run past the grid (which ones:
      // per launch, below).
      max_query_len = std::max(1, 16 / c.group);
      bad = -1;
      break;
  }
  p.overwrite_device_metadata(cu, seq, table);
  const std::string what = c.describe() + ", fault: " + fault_name(f) + (bad >= 0 ? " in request " + std::to_string(bad) : "");
  SCOPED_TRACE(what);
  ++tally.cases;
  if (f != Fault::none) ++tally.faulty;


  cudaStream_t stream;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  (void)device_errors(stream);  // (a clear record)
  for (int splits : {1, c.num_splits}) {
    for (const Problem::Variant& v : p.launch_variants(splits)) {
      SCOPED_TRACE("num_splits " + std::to_string(splits) + ", " + v.name);
      const size_t ws_bytes = flash_attn::varlen_workspace_bytes(T, H, D, splits);
      cuda::DeviceBuffer out(std::max<int64_t>(T * row * 2, 16)), lse(std::max<int64_t>(T * H * 4, 16)),
          ws(std::max<size_t>(ws_bytes, 16));
      flash_attn::VarlenArgs a = p.make_args(out.get(), lse.get(), ws_bytes ? ws.get() : nullptr, ws_bytes, splits);
      a.max_query_len = max_query_len;
      a.stream = stream;
      poison_device(out.get(), T * row * 2, stream);
      poison_device(lse.get(), T * H * 4, stream);
      flash_attn::varlen_workspace_init(a.workspace, a.workspace_bytes, stream);
      flash_attn::run_varlen_attention(a, v.tuning);
      const bool q8 = fp8_wgmma(flash_attn::choose_launch(flash_attn::varlen_launch_facts(a), v.tuning), c.cache_dtype);
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // (a fault would be a CUDA error here)
      ++tally.runs;
      const DeviceErrors e = device_errors(stream);
      const std::vector<float> got = download_as_float(out.get(), c.dtype, T * row);
      // The requests the violation hits: `bad`; for max_seqlen_q, every request whose packed
      // rows the launch's row tiles do not cover.
      std::vector<int> hit;
      if (f == Fault::max_q_small) {
        const flash_attn::LaunchPlan plan = flash_attn::choose_launch(flash_attn::varlen_launch_facts(a), v.tuning);
        for (int r = 0; r < n; ++r)
          if (int64_t{c.q_lens[r]} * c.group > plan.row_tiles * plan.config.rows) hit.push_back(r);
      } else if (bad >= 0) {
        hit = {bad};
        if (f == Fault::cu_decreasing && bad + 1 < n) hit.push_back(bad + 1);  // (its start moved too)
      }
      if (hit.empty()) {
        EXPECT_EQ(e.faults, 0) << e.describe();
        EXPECT_TRUE(outputs_match(c.dtype, got, ref.out, {T, H, D}, q8));
        continue;
      }
      EXPECT_GE(e.faults, 1) << "no violation recorded";
      // (a key count clamped to the table row reads its padding entries: invalid block ids too;
      // a request moved by decreasing offsets may run past max_seqlen_q)
      const bool kind_ok = e.first.find(recorded_as(f)) != std::string::npos ||
                           (f == Fault::seq_past_table && e.first.find("block id") != std::string::npos) ||
                           (f == Fault::cu_decreasing && e.first.find("max_seqlen_q") != std::string::npos);
      EXPECT_TRUE(kind_ok) << e.describe();
      EXPECT_NE(std::find(hit.begin(), hit.end(), e.request), hit.end()) << e.describe();
      // Requests the violation cannot touch: all others; for offsets, those whose rows lie
      // before the first row a moved request may now write.
      std::vector<int> untouched;
      for (int r = 0; r < n; ++r) {
        if (std::find(hit.begin(), hit.end(), r) != hit.end()) continue;
        if (f == Fault::cu_decreasing || f == Fault::cu_past_tokens) {
          if (cu[r + 1] <= std::min(cu[bad], cu[bad + 1])) untouched.push_back(r);
        } else {
          untouched.push_back(r);
        }
      }
      if (f == Fault::block_high || f == Fault::block_negative) {
        // Rows that read the block are NaN (the request's last token's do), the others right.
        // NaN goes by row tile: with GQA packing a token's heads may lie in two tiles, of which
        // only the later read the block, so each (token, head) is NaN or right on its own.
        const int64_t t0 = p.cu_seqlens()[bad], t1 = p.cu_seqlens()[bad + 1];
        EXPECT_TRUE(row_is_nan(got, t1 - 1, row)) << "the last row of the request read the bad block";
        for (int64_t t = t0; t < t1 - 1; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            const int64_t at = t * row + h * D;
            const std::vector<float> g(got.begin() + at, got.begin() + at + D), r(ref.out.begin() + at, ref.out.begin() + at + D);
            if (std::all_of(g.begin(), g.end(), [](float x) { return std::isnan(x); })) continue;
            EXPECT_TRUE(outputs_match(c.dtype, g, r, {1, 1, D}, q8)) << "token " << t << ", head " << h;
          }
        }
      } else if (f != Fault::cu_decreasing) {  // (every row of a hit request: NaN or, past the grid, its poison)
        for (int r : hit)
          for (int64_t t = p.cu_seqlens()[r]; t < p.cu_seqlens()[r + 1]; ++t)
            EXPECT_TRUE(row_is_nan(got, t, row)) << "row " << t << " of request " << r;
      }
      for (int r : untouched) {
        const int64_t t0 = p.cu_seqlens()[r], t1 = p.cu_seqlens()[r + 1];
        if (t1 > t0) {
          EXPECT_TRUE(outputs_match(c.dtype, token_rows(got, t0, t1, row), token_rows(ref.out, t0, t1, row), {t1 - t0, H, D}, q8))
              << "request " << r << ", next to the bad one";
        }
      }
    }
    if (c.num_splits == 1) break;
  }
  ATTNKIT_CUDA_CHECK(cudaStreamDestroy(stream));
}

void run_grid(int cases, const char* name) {
  Tally t;
  for (int i = 0; i < cases; ++i) {
    fuzz_case(static_cast<uint64_t>(i), t);
    if (::testing::Test::HasFatalFailure()) break;
  }
  std::printf("[ %s ] %lld cases (%lld with a violation), %lld launches\n", name, static_cast<long long>(t.cases),
              static_cast<long long>(t.faulty), static_cast<long long>(t.runs));
  ::testing::Test::RecordProperty("cases", static_cast<int>(t.cases));
  ::testing::Test::RecordProperty("faulty_cases", static_cast<int>(t.faulty));
  ::testing::Test::RecordProperty("launches", static_cast<int>(t.runs));
}

TEST(DeviceGuardsFuzz, EveryKernelFamily) { run_grid(1500, "DeviceGuardsFuzz"); }

TEST(DeviceGuardsSanitizer, SmallGrid) { run_grid(120, "DeviceGuardsSanitizer"); }

}  // namespace
}  // namespace attnkit::test
