// The backend abstraction (docs/architecture.md sections 6-7): what a backend can serve, how its KV cache
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
  // num_sms, or when unknown the SM count of the usual data-center part of this compute
  // capability (sm80 A100 108, sm89 L40S 142, sm90 H100/H200 132, sm100 B200 148; else 108).
  int sms_or_default() const;
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

  // Throws Error unless the counts are positive, num_heads % num_kv_heads == 0 and dtype is
  // one attention computes in (a malformed configuration, as opposed to one a backend refuses).
  void validate(std::string_view where) const;
  // One line: "32 heads / 8 KV heads, head size 128, bf16, cache bf16, block 16, NHD, sm90".
  std::string describe() const;
};

// The features that are on, in words ("ALiBi, sinks"); "none" when none is.
std::string describe_features(const Features& f);

struct Capabilities {
  std::vector<DType> dtypes;
  std::vector<DType> cache_dtypes;
  std::vector<int> head_sizes;    // the sizes served; empty = any multiple of head_size_multiple_of
  int head_size_multiple_of = 8;  // used only when head_sizes is empty
  BlockSizeRule block_sizes;
  std::vector<KVLayout> layouts;
  Features features;  // true = supported
  bool runs_on_cpu = false;
  int min_cc = 0;  // minimum compute capability (major*10+minor) on CUDA; 0 = no CUDA
};

// The capability rules `cfg` breaks, one sentence each with the value and the allowed set
// (dtype, cache dtype, head size, block size, layout, each feature). Device rules excluded.
std::vector<std::string> capability_refusals(const Capabilities& caps, const AttentionConfig& cfg);
// The device rule: CPU-only backends refuse GPUs, GPU backends refuse the CPU and devices
// below min_cc. Empty when the device is fine.
std::vector<std::string> device_refusals(const Capabilities& caps, const DeviceSpec& device);

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
  // Device memory the builder's metadata needs for GPU forwards (the FlashInfer-style plans'
  // device copies, sized for the builder's limits; 0: none). The caller allocates it and hands
  // it over with set_device_buffer (16-byte aligned, kept alive while the builder's metadata is
  // used): the library allocates no device memory, so a forward can be captured in a CUDA graph.
  virtual size_t device_buffer_bytes() const { return 0; }
  virtual void set_device_buffer(void* /*device_ptr*/, size_t /*bytes*/) {}
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
  // Device memory for the impl's GPU launches (split-KV or plan partials), owned by the caller:
  // the impl never allocates it. workspace_bytes(max_tokens) is what any batch of up to
  // max_tokens query tokens can need (0: none; a backend whose plans lay partials out for its
  // builder's capacity, as flashinfer's do, returns that capacity's size);
  // workspace_bytes_for(metadata) is what the GPU forward of that batch needs. set_workspace
  // hands the buffer over before the forwards that use it (an engine: once, sized by
  // workspace_bytes for its largest batch, so CUDA-graph replays reuse it). A GPU forward that
  // needs more than it was given is an Error before any launch. Impls that run on one stream
  // may share one buffer.
  virtual size_t workspace_bytes(int64_t max_tokens) const {
    (void)max_tokens;
    return 0;
  }
  virtual size_t workspace_bytes_for(const BackendMetadata& metadata) const {
    (void)metadata;
    return 0;
  }
  virtual void set_workspace(void* device_ptr, size_t bytes) {
    (void)device_ptr;
    (void)bytes;
  }
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string_view name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Every rule `cfg` breaks, in words; empty means this backend can serve `cfg`. The default
  // is capability_refusals + device_refusals; backends add their own rules (kernel
  // generations, devices). `cfg` must be valid (AttentionConfig::validate).
  virtual std::vector<std::string> check(const AttentionConfig& cfg) const;
  // Which kernel generation / path serves `cfg` and why, for the selector's report.
  virtual std::string variant(const AttentionConfig& /*cfg*/) const { return {}; }
  // Why this backend should serve `cfg` ahead of the registry's order, in words (empty: no
  // claim). The selector picks the first backend that serves cfg and claims it, else the first
  // that serves it.
  virtual std::string preference(const AttentionConfig& /*cfg*/) const { return {}; }
  // Default: KVCacheSpec's logical shape (num_blocks, 2, block_size, num_kv_heads, row) where
  // row is head_size (head_size/2 + head_size/16 bytes for nvfp4); Error when the block size,
  // cache dtype or head size is one this backend refuses.
  virtual std::vector<int64_t> get_kv_cache_shape(int64_t num_blocks, int block_size,
                                                  int num_kv_heads, int head_size,
                                                  DType cache_dtype) const;
  // Permutation from logical to physical dims: NHD (0,1,2,3,4), HND (0,1,3,2,4); Error for a
  // layout the backend does not serve.
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
