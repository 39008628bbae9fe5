// The backend abstraction (DESIGN.md sections 6-7): what a backend can serve, how its KV cache
// is shaped, how it turns batch metadata into its own, and how it runs attention.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit {

enum class CudagraphSupport : uint8_t { NEVER, UNIFORM_SINGLE_TOKEN_DECODE, UNIFORM_BATCH, ALWAYS };
std::string_view cudagraph_support_name(CudagraphSupport s);

// Which block sizes a backend's kernels take: every positive multiple of n, or a list.
struct BlockSizeRule {
  int multiple_of = 0;     // > 0: MultipleOf(multiple_of)
  std::vector<int> sizes;  // used when multiple_of == 0
  static BlockSizeRule MultipleOf(int n) { return {n, {}}; }
  static BlockSizeRule List(std::vector<int> s) { return {0, std::move(s)}; }
  bool allows(int block_size) const;
  std::string describe() const;  // "a multiple of 16" / "one of 16, 32, 64"
};

// Optional features a model needs (or a backend supports).
struct Features {
  bool sinks = false;
  bool alibi = false;
  bool softcap = false;
  bool sliding_window = false;
  bool non_causal = false;
  bool lse = false;  // returns the softmax LSE (needed for cascade / DCP merges)
};

// Where attention runs: the CPU, or a CUDA device of compute capability major.minor.
struct DeviceSpec {
  bool cpu = true;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;  // 0 = unknown (planners then assume the device's usual count)
  static DeviceSpec Cpu() { return {}; }
  static DeviceSpec Cuda(int major, int minor, int sms = 0) { return {false, major, minor, sms}; }
  int cc() const { return cc_major * 10 + cc_minor; }
  std::string describe() const;  // "cpu" / "sm90"
};

// A model layer's attention configuration on a device: the selector's and the backends' input.
struct AttentionConfig {
  int num_heads = 0, num_kv_heads = 0, head_size = 0;
  DType dtype = DType::bf16;
  DType cache_dtype = DType::bf16;  // "auto" resolves to dtype before it gets here
  int block_size = 16;
  KVLayout layout = KVLayout::NHD;
  Features features;
  DeviceSpec device;
};

struct Capabilities {
  std::vector<DType> dtypes;
  std::vector<DType> cache_dtypes;
  std::vector<int> head_sizes;
  BlockSizeRule block_sizes;
  std::vector<KVLayout> layouts;
  Features features;  // true = supported
  bool runs_on_cpu = false;
  int min_cc = 0;  // minimum compute capability (major*10+minor) on CUDA; 0 = no CUDA
};

// A backend's own metadata (each backend derives its type).
struct BackendMetadata {
  virtual ~BackendMetadata() = default;
};

class MetadataBuilder {
 public:
  virtual ~MetadataBuilder() = default;
  // Requests with query_len <= this are decodes that must come first (0: no ordering needed).
  virtual int reorder_batch_threshold() const { return 0; }
  virtual std::unique_ptr<BackendMetadata> build(const CommonAttentionMetadata& common) = 0;
};

class AttentionImpl {
 public:
  virtual ~AttentionImpl() = default;
  // q: [num_tokens, num_heads, head_size]; k, v: the new tokens' [num_tokens, num_kv_heads,
  // head_size] (already written to the cache by write_kv; a backend may read them directly);
  // kv_cache: the backend's cache tensor (get_kv_cache_shape, in get_kv_cache_stride_order);
  // out: [num_tokens, num_heads, head_size]. stream: cudaStream_t for CUDA tensors.
  virtual void forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& kv_cache, const BackendMetadata& metadata,
                       const AttentionParams& params, const TensorView& out,
                       void* stream = nullptr) = 0;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Every rule `cfg` breaks, in words; empty means this backend can serve `cfg`. The default
  // checks capabilities(); backends add their own rules (kernel generations, devices).
  virtual std::vector<std::string> check(const AttentionConfig& cfg) const;
  // Which kernel generation / path serves `cfg` and why, for the selector's report.
  virtual std::string variant(const AttentionConfig& /*cfg*/) const { return {}; }
  virtual std::vector<int64_t> get_kv_cache_shape(int64_t num_blocks, int block_size,
                                                  int num_kv_heads, int head_size,
                                                  DType cache_dtype) const;
  virtual std::array<int, 5> get_kv_cache_stride_order(KVLayout layout) const;
  virtual CudagraphSupport cudagraph_support(const AttentionConfig& cfg) const = 0;
  bool forward_includes_kv_cache_update() const { return false; }
  virtual std::unique_ptr<MetadataBuilder> make_builder(const AttentionConfig& cfg) const = 0;
  virtual std::unique_ptr<AttentionImpl> make_impl(const AttentionConfig& cfg) const = 0;
};

// The registry: every backend attnkit has, in the selector's order of preference.
const std::vector<const AttentionBackend*>& backends();
const AttentionBackend& backend(std::string_view name);  // Error listing the names if unknown

}  // namespace attnkit
