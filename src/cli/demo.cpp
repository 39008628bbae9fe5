// `attnkit demo`: a few serving steps of continuous batching on a small model shape, each step's
// K/V written into a paged bf16 cache through slot_mapping and attention run over the mixed
// prefill/decode batch, with one line of numbers per step.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "cli/commands.h"
#include "cli/serving_sim.h"
#include "cli/step_attention.h"

namespace attnkit::cli {
namespace {

constexpr int kNumHeads = 32, kNumKvHeads = 8, kHeadSize = 128, kBlockSize = 16;
constexpr DType kDtype = DType::bf16;

void print_help(FILE* f) {
  std::fprintf(f,
               "usage: attnkit demo [--steps N] [--seed N]\n\n"
               "Simulates continuous batching (requests arriving, chunked prefills, one-token\n"
               "decodes, finished requests freeing their KV blocks) for a model with %d query\n"
               "heads, %d KV heads, head size %d and a paged bf16 cache of block size %d, and\n"
               "runs attention for every step.\n\n"
               "  --steps N   serving steps to run (1..1000, default 16)\n"
               "  --seed N    seed of arrivals, lengths and data (default 0)\n"
               "  --help      this text\n",
               kNumHeads, kNumKvHeads, kHeadSize, kBlockSize);
}

struct Options {
  int steps = 16;
  uint64_t seed = 0;
};

bool parse_number(std::string_view s, uint64_t* v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// Returns -1 when the flags are good, else the exit code (0 for --help, 2 for bad flags).
int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i], value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--help" || flag == "-h") {
      print_help(stdout);
      return 0;
    }
    if (flag != "--steps" && flag != "--seed") {
      std::fprintf(stderr, "attnkit demo: unknown flag '%s'\n\n", argv[i]);
      print_help(stderr);
      return 2;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attnkit demo: %s needs a value\n", argv[i]);
        return 2;
      }
      value = argv[++i];
    }
    uint64_t n = 0;
    if (!parse_number(value, &n)) {
      std::fprintf(stderr, "attnkit demo: %.*s = '%.*s' is not a non-negative integer\n",
                   static_cast<int>(flag.size()), flag.data(), static_cast<int>(value.size()),
                   value.data());
      return 2;
    }
    if (flag == "--steps") {
      if (n < 1 || n > 1000) {
        std::fprintf(stderr, "attnkit demo: --steps = %llu must be in 1..1000\n",
                     static_cast<unsigned long long>(n));
        return 2;
      }
      o->steps = static_cast<int>(n);
    } else {
      o->seed = n;
    }
  }
  return -1;
}

void fill_random(std::vector<uint16_t>& buf, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (uint16_t& x : buf) x = float_to_bf16_bits(u(rng));
}

int run_demo(int argc, char** argv) {
  Options opt;
  if (const int rc = parse(argc, argv, &opt); rc >= 0) return rc;

  SimConfig cfg;
  cfg.block_size = kBlockSize;
  cfg.seed = opt.seed;
  ServingSim sim(cfg);

  KVCacheSpec spec;
  spec.num_blocks = cfg.num_blocks;
  spec.block_size = kBlockSize;
  spec.num_kv_heads = kNumKvHeads;
  spec.head_size = kHeadSize;
  spec.cache_dtype = kDtype;
  spec.layout = KVLayout::NHD;
  spec.validate("demo");
  std::vector<uint16_t> cache_mem(spec.total_bytes() / sizeof(uint16_t));
  const PagedKV cache =
      spec.view(TensorView(cache_mem.data(), kDtype, {static_cast<int64_t>(cache_mem.size())}));

  std::printf("attnkit demo: continuous batching, attention on the CPU reference backend\n");
  std::printf("model: %d query heads, %d KV heads, head size %d, %s; cache: %lld blocks x %d "
              "tokens, %s, %.1f MiB\n",
              kNumHeads, kNumKvHeads, kHeadSize, std::string(dtype_name(kDtype)).c_str(),
              static_cast<long long>(spec.num_blocks), kBlockSize,
              std::string(layout_name(spec.layout)).c_str(), spec.total_bytes() / 1048576.0);
  std::printf("%4s %7s %8s %6s %8s %7s %7s %11s %9s\n", "step", "decodes", "prefills", "tokens",
              "kv_read", "running", "waiting", "free_blocks", "time_ms");

  std::mt19937_64 rng(opt.seed * 0x9E3779B97F4A7C15ull + 1);
  double total_ms = 0;
  for (int step = 0; step < opt.steps; ++step) {
    StepPlan plan = sim.plan_step();
    const CommonAttentionMetadata& md = plan.metadata;
    md.validate(spec.num_blocks, spec.block_size);
    // The engine-side split must agree with the plan (and throws unless decodes come first).
    const DecodePrefillSplit split = split_decodes_and_prefills(md, kDecodeThreshold);
    ATTNKIT_REQUIRE(split.num_decodes == plan.num_decodes && split.num_prefills == plan.num_prefills,
                    "demo", "split_decodes_and_prefills().num_decodes", split.num_decodes,
                    "must match the simulation's plan (" + std::to_string(plan.num_decodes) +
                        " decodes, " + std::to_string(plan.num_prefills) + " prefills)");
    const int64_t t = md.num_actual_tokens;

    std::vector<uint16_t> q(t * kNumHeads * kHeadSize), k(t * kNumKvHeads * kHeadSize),
        v(k.size()), out(q.size());
    fill_random(q, rng);
    fill_random(k, rng);
    fill_random(v, rng);
    std::vector<int64_t> slots = md.slot_mapping;
    StepTensors st;
    st.q = TensorView(q.data(), kDtype, {t, kNumHeads, kHeadSize});
    st.k = TensorView(k.data(), kDtype, {t, kNumKvHeads, kHeadSize});
    st.v = TensorView(v.data(), kDtype, {t, kNumKvHeads, kHeadSize});
    st.out = TensorView(out.data(), kDtype, {t, kNumHeads, kHeadSize});
    st.cache = cache;
    write_kv(st.k, st.v, cache, TensorView(slots.data(), DType::i64, {t}));

    const auto start = std::chrono::steady_clock::now();
    run_step_attention(st, md, AttentionParams{});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    total_ms += ms;
    for (size_t i = 0; i < out.size(); ++i) {
      const float x = bf16_bits_to_float(out[i]);
      ATTNKIT_REQUIRE(std::isfinite(x), "demo", "out[" + std::to_string(i) + "]", x,
                      "attention over finite inputs must be finite");
    }
    std::printf("%4d %7d %8d %6d %8lld %7d %7d %11d %9.1f\n", plan.step, plan.num_decodes,
                plan.num_prefills, plan.num_tokens, static_cast<long long>(plan.kv_tokens_read),
                plan.running, plan.waiting, plan.free_blocks, ms);
    sim.finish_step(plan);
  }
  std::printf("done: %d steps, %d requests finished, attention %.1f ms in total\n", opt.steps,
              sim.finished(), total_ms);
  return 0;
}

const RegisterCommand kRegister("demo", "simulate continuous-batching serving steps", run_demo);

}  // namespace
}  // namespace attnkit::cli
