// The one place the CLI runs attention on a serving step: the selector picks the backend for
// the model and device, and every step goes through that backend's builder and impl.
#pragma once
#include <memory>
#include <optional>
#include <string_view>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/selector.h"
#include "attnkit/tensor.h"

namespace attnkit::cli {

struct StepTensors {
  TensorView q;         // [num_tokens, num_heads, head_size]
  TensorView k, v;      // the new tokens' [num_tokens, num_kv_heads, head_size], already cached
  TensorView kv_cache;  // the backend's cache tensor (flat view of its storage)
  TensorView out;       // [num_tokens, num_heads, head_size]
};

class StepAttention {
 public:
  // Runs the selector (Error when `preferred` cannot serve cfg or nothing can).
  StepAttention(const AttentionConfig& cfg, std::optional<std::string_view> preferred);
  const Selection& selection() const { return selection_; }
  // Builds the backend's metadata for the step and runs its impl (stream: cudaStream_t). A GPU
  // step whose launches need device workspace gets it from here (grown as steps need more).
  void run(const StepTensors& t, const CommonAttentionMetadata& md, const AttentionParams& params,
           void* stream);

 private:
  Selection selection_;
  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<AttentionImpl> impl_;
  CudaMemory workspace_;  // the impl's (AttentionImpl::set_workspace)
  CudaMemory plans_;      // the builder's (MetadataBuilder::set_device_buffer)
};

}  // namespace attnkit::cli
