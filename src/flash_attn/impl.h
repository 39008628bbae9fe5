// The FlashAttention-style impl: validates a forward call and launches the varlen kernel.
#pragma once
#include <cstddef>
#include <memory>

#include "attnkit/backend.h"
#include "flash_attn/generation.h"

namespace attnkit::flash_attn {

class FlashAttnImpl final : public AttentionImpl {
 public:
  explicit FlashAttnImpl(const AttentionConfig& cfg);
  ~FlashAttnImpl() override;
  // Device memory for split-KV partials, owned by the caller (an engine allocates it once,
  // sized by max_workspace_bytes for its largest batch, so CUDA-graph replays reuse it). A
  // launch whose metadata asks for more bytes than given throws. Without it, a CUDA build
  // allocates (and keeps, growing) its own on the first split launch that needs it, which
  // must then not be inside a CUDA-graph capture; a CPU build throws. The first split launch
  // after set_workspace (or after the own buffer grows) zeroes the buffer's counters on its
  // stream first (varlen_workspace_init; inside a capture the memset joins the graph, which
  // is harmless). Several impls may share one buffer if they run on one stream.
  void set_workspace(void* device_ptr, size_t bytes) override;
  // The workspace any batch of up to max_tokens tokens can need (kMaxSplits splits).
  size_t max_workspace_bytes(int64_t max_tokens) const;
  size_t workspace_bytes(int64_t max_tokens) const override { return max_workspace_bytes(max_tokens); }
  Generation generation() const { return generation_; }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& kv_cache, const BackendMetadata& metadata,
               const AttentionParams& params, const TensorView& out,
               void* stream = nullptr) override;

 private:
  AttentionConfig cfg_;
  Generation generation_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool workspace_ready_ = false;  // its counters were zeroed (varlen_workspace_init)
  struct OwnedWorkspace;  // a device buffer, CUDA builds only
  std::unique_ptr<OwnedWorkspace> owned_;
  struct Workspace {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  // The workspace for a launch needing `bytes`: the caller's, else the owned one (whole size).
  Workspace workspace_for(size_t bytes, int num_splits);
};

}  // namespace attnkit::flash_attn
