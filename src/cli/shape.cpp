// `attnkit shape`: a backend's KV cache shape, stride order, physical shape and block size
// in bytes for a configuration.
#include <cstdio>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace attnkit::cli {

namespace {

constexpr FlagRequirements kNeed{.device = false, .backend = true, .num_blocks = true};

template <class V>
std::string tuple(const V& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

// The storage element of a cache tensor (bytes for nvfp4: packed values + block scales).
DType storage_dtype(DType cache_dtype) {
  KVCacheSpec spec;
  spec.cache_dtype = cache_dtype;
  return spec.storage_dtype();
}

int run_shape(int argc, char** argv) {
  ConfigFlags f;
  try {
    f = parse_config_flags(argc, argv, kNeed);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "attnkit shape: %s\n", e.what());
    return kExitUsage;
  }
  if (f.help) {
    std::printf(
        "usage: attnkit shape --backend NAME --heads N --head-size N --num-blocks N [flags]\n\n"
        "Prints the backend's logical KV cache shape, its stride order for --layout, the\n"
        "physical shape in memory and the bytes of one block (K and V).\n"
        "Exit status: 0 printed; 1 the backend refuses this cache; 2 bad flags.\n\nflags:\n%s",
        config_flags_help(kNeed).c_str());
    return kExitOk;
  }
  const AttentionConfig& c = f.cfg;
  const AttentionBackend& b = backend(*f.backend);
  // get_kv_cache_shape / get_kv_cache_stride_order throw Error (exit 1) for what b refuses.
  const std::vector<int64_t> shape =
      b.get_kv_cache_shape(*f.num_blocks, c.block_size, c.num_kv_heads, c.head_size, c.cache_dtype);
  const std::array<int, 5> order = b.get_kv_cache_stride_order(c.layout);
  std::vector<int64_t> physical(shape.size());
  for (size_t i = 0; i < shape.size(); ++i)
    physical[i] = i < order.size() ? shape[order[i]] : shape[i];
  int64_t per_block = 1;
  for (size_t i = 1; i < shape.size(); ++i) per_block *= shape[i];
  const DType storage = storage_dtype(c.cache_dtype);
  const int64_t bytes_per_block = per_block * dtype_bits(storage) / 8;
  std::printf("backend: %s\n", std::string(b.name()).c_str());
  std::printf("cache dtype: %s (stored as %s)\n", std::string(dtype_name(c.cache_dtype)).c_str(),
              std::string(dtype_name(storage)).c_str());
  std::printf("kv cache shape: %s\n", tuple(shape).c_str());
  std::printf("stride order (%s): %s\n", std::string(layout_name(c.layout)).c_str(), tuple(order).c_str());
  std::printf("physical shape: %s\n", tuple(physical).c_str());
  std::printf("bytes per block: %lld\n", static_cast<long long>(bytes_per_block));
  std::printf("total bytes: %lld\n", static_cast<long long>(bytes_per_block * *f.num_blocks));
  return kExitOk;
}

const RegisterCommand kRegister("shape", "print a backend's KV cache shape, stride order and bytes per block",
                                run_shape);

}  // namespace

}  // namespace attnkit::cli
