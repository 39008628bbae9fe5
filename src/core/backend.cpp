// The parts of the backend abstraction every backend shares: block-size rules, device and
// configuration descriptions, the capability check and the default KV cache shape.
#include "attnkit/backend.h"

#include <algorithm>
#include <sstream>

#include "attnkit/error.h"

namespace attnkit {

namespace {

template <class T, class Name>
std::string join(const std::vector<T>& items, Name name) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) s += ", ";
    s += name(items[i]);
  }
  return s;
}

template <class T>
bool contains(const std::vector<T>& items, const T& x) {
  return std::find(items.begin(), items.end(), x) != items.end();
}

std::string dtype_list(const std::vector<DType>& ts) {
  return join(ts, [](DType t) { return std::string(dtype_name(t)); });
}

}  // namespace

std::string_view cudagraph_support_name(CudagraphSupport s) {
  switch (s) {
    case CudagraphSupport::NEVER: return "NEVER";
    case CudagraphSupport::UNIFORM_SINGLE_TOKEN_DECODE: return "UNIFORM_SINGLE_TOKEN_DECODE";
    case CudagraphSupport::UNIFORM_BATCH: return "UNIFORM_BATCH";
    case CudagraphSupport::ALWAYS: return "ALWAYS";
  }
  return "unknown";
}

// ---- BlockSizeRule -------------------------------------------------------------------------

bool BlockSizeRule::allows(int block_size) const {
  if (block_size <= 0) return false;
  if (multiple_of > 0) return block_size % multiple_of == 0;
  return contains(sizes, block_size);
}

std::string BlockSizeRule::describe() const {
  if (multiple_of > 0) return "a multiple of " + std::to_string(multiple_of);
  if (sizes.empty()) return "no block size at all";
  return "one of " + join(sizes, [](int s) { return std::to_string(s); });
}

// ---- DeviceSpec / AttentionConfig ----------------------------------------------------------

std::string DeviceSpec::describe() const {
  if (cpu) return "cpu";
  return "sm" + std::to_string(cc());
}

int DeviceSpec::sms_or_default() const {
  if (num_sms > 0) return num_sms;
  switch (cc()) {
    case 89: return 142;
    case 90: return 132;
    case 100: return 148;
    default: return 108;
  }
}

void AttentionConfig::validate(std::string_view where) const {
  ATTNKIT_REQUIRE(num_heads > 0, where, "num_heads", num_heads, "must be > 0");
  ATTNKIT_REQUIRE(num_kv_heads > 0, where, "num_kv_heads", num_kv_heads, "must be > 0");
  ATTNKIT_REQUIRE(num_heads % num_kv_heads == 0, where, "num_heads", num_heads,
                  "must be a multiple of num_kv_heads = " + std::to_string(num_kv_heads) +
                      " (each KV head serves a whole group of query heads)");
  ATTNKIT_REQUIRE(head_size > 0, where, "head_size", head_size, "must be > 0");
  ATTNKIT_REQUIRE(block_size > 0, where, "block_size", block_size, "must be > 0");
  ATTNKIT_REQUIRE(is_float(dtype), where, "dtype", dtype_name(dtype),
                  "must be f32, f16 or bf16 (the types attention computes in)");
  ATTNKIT_REQUIRE(is_float(cache_dtype) || is_fp8(cache_dtype) || cache_dtype == DType::nvfp4,
                  where, "cache_dtype", dtype_name(cache_dtype),
                  "must be f32, f16, bf16, fp8_e4m3, fp8_e5m2 or nvfp4");
  ATTNKIT_REQUIRE(device.cpu || device.cc_major > 0, where, "device",
                  device.describe(), "a CUDA device needs a compute capability");
}

std::string describe_features(const Features& f) {
  std::vector<std::string> on;
  if (f.sinks) on.push_back("sinks");
  if (f.alibi) on.push_back("ALiBi");
  if (f.softcap) on.push_back("softcap");
  if (f.sliding_window) on.push_back("sliding window");
  if (f.non_causal) on.push_back("non-causal");
  if (f.lse) on.push_back("LSE output");
  if (on.empty()) return "none";
  return join(on, [](const std::string& s) { return s; });
}

std::string AttentionConfig::describe() const {
  std::ostringstream os;
  os << num_heads << " heads / " << num_kv_heads << " KV heads, head size " << head_size << ", "
     << dtype_name(dtype) << ", cache " << dtype_name(cache_dtype) << ", block " << block_size
     << ", " << layout_name(layout) << ", features: " << describe_features(features)
     << ", device " << device.describe();
  return os.str();
}

// ---- the capability check --------------------------------------------------------------------

std::vector<std::string> capability_refusals(const Capabilities& caps, const AttentionConfig& cfg) {
  std::vector<std::string> why;
  if (!contains(caps.dtypes, cfg.dtype))
    why.push_back("dtype " + std::string(dtype_name(cfg.dtype)) +
                  " is not supported (supported: " + dtype_list(caps.dtypes) + ")");
  if (!contains(caps.cache_dtypes, cfg.cache_dtype))
    why.push_back("KV cache dtype " + std::string(dtype_name(cfg.cache_dtype)) +
                  " is not supported (supported: " + dtype_list(caps.cache_dtypes) + ")");
  if (caps.head_sizes.empty()) {
    const int m = caps.head_size_multiple_of > 0 ? caps.head_size_multiple_of : 1;
    if (cfg.head_size % m != 0)
      why.push_back("head size " + std::to_string(cfg.head_size) + " is not supported (it must be a multiple of " +
                    std::to_string(m) + ")");
  } else if (!contains(caps.head_sizes, cfg.head_size)) {
    why.push_back("head size " + std::to_string(cfg.head_size) + " is not supported (supported: " +
                  join(caps.head_sizes, [](int h) { return std::to_string(h); }) + ")");
  }
  if (!caps.block_sizes.allows(cfg.block_size))
    why.push_back("block size " + std::to_string(cfg.block_size) + " is not allowed (it must be " +
                  caps.block_sizes.describe() + ")");
  if (!contains(caps.layouts, cfg.layout))
    why.push_back("KV cache layout " + std::string(layout_name(cfg.layout)) +
                  " is not supported (supported: " +
                  join(caps.layouts, [](KVLayout l) { return std::string(layout_name(l)); }) + ")");
  const Features& need = cfg.features;
  const Features& have = caps.features;
  auto feature = [&](bool needed, bool supported, const char* what) {
    if (needed && !supported) why.push_back(std::string(what) + " is not supported");
  };
  feature(need.sinks, have.sinks, "attention sinks");
  feature(need.alibi, have.alibi, "ALiBi");
  feature(need.softcap, have.softcap, "logit softcapping");
  feature(need.sliding_window, have.sliding_window, "sliding-window attention");
  feature(need.non_causal, have.non_causal, "non-causal attention");
  feature(need.lse, have.lse, "returning the LSE");
  return why;
}

std::vector<std::string> device_refusals(const Capabilities& caps, const DeviceSpec& device) {
  const bool gpu = caps.min_cc > 0;
  if (device.cpu) {
    if (caps.runs_on_cpu) return {};
    return {"runs on CUDA GPUs only (the device is the CPU)"};
  }
  if (!gpu) return {"runs on the CPU only (the device is the CUDA GPU " + device.describe() + ")"};
  if (device.cc() < caps.min_cc)
    return {"needs compute capability " + std::to_string(caps.min_cc / 10) + "." +
            std::to_string(caps.min_cc % 10) + " or newer (the device is " + device.describe() + ")"};
  return {};
}

// ---- AttentionBackend defaults ---------------------------------------------------------------

std::vector<std::string> AttentionBackend::check(const AttentionConfig& cfg) const {
  const Capabilities caps = capabilities();
  auto why = capability_refusals(caps, cfg);
  for (auto& r : device_refusals(caps, cfg.device)) why.push_back(std::move(r));
  return why;
}

std::vector<int64_t> AttentionBackend::get_kv_cache_shape(int64_t num_blocks, int block_size,
                                                          int num_kv_heads, int head_size,
                                                          DType cache_dtype) const {
  const std::string where = std::string(name()) + " get_kv_cache_shape";
  const Capabilities caps = capabilities();
  ATTNKIT_REQUIRE(caps.block_sizes.allows(block_size), where, "block_size", block_size,
                  "must be " + caps.block_sizes.describe());
  ATTNKIT_REQUIRE(contains(caps.cache_dtypes, cache_dtype), where, "cache_dtype",
                  dtype_name(cache_dtype), "must be one of " + dtype_list(caps.cache_dtypes));
  if (!caps.head_sizes.empty())
    ATTNKIT_REQUIRE(contains(caps.head_sizes, head_size), where, "head_size", head_size,
                    "must be one of " + join(caps.head_sizes, [](int h) { return std::to_string(h); }));
  KVCacheSpec spec;
  spec.num_blocks = num_blocks;
  spec.block_size = block_size;
  spec.num_kv_heads = num_kv_heads;
  spec.head_size = head_size;
  spec.cache_dtype = cache_dtype;
  spec.validate(where);
  const auto shape = spec.logical_shape();
  return {shape.begin(), shape.end()};
}

std::array<int, 5> AttentionBackend::get_kv_cache_stride_order(KVLayout layout) const {
  const Capabilities caps = capabilities();
  ATTNKIT_REQUIRE(contains(caps.layouts, layout), std::string(name()) + " get_kv_cache_stride_order",
                  "layout", layout_name(layout),
                  "must be one of " +
                      join(caps.layouts, [](KVLayout l) { return std::string(layout_name(l)); }));
  if (layout == KVLayout::HND) return {0, 1, 3, 2, 4};
  return {0, 1, 2, 3, 4};
}

}  // namespace attnkit
