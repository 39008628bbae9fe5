// The CPU reference backend behind the common interface: every dtype, cache dtype and
// feature, CPU only. It is the oracle the GPU backends are tested against.
#pragma once
#include "attnkit/backend.h"

namespace attnkit::reference {

// The reference needs nothing beyond the batch itself: it reads the host arrays.
struct ReferenceMetadata : BackendMetadata {
  CommonAttentionMetadata common;
  int max_block_id = -1;  // the largest block id any request reads (checked against the cache)
};

class ReferenceBackend final : public AttentionBackend {
 public:
  std::string_view name() const override { return "reference"; }
  Capabilities capabilities() const override;
  std::vector<std::string> check(const AttentionConfig& cfg) const override;
  std::string variant(const AttentionConfig& cfg) const override;
  CudagraphSupport cudagraph_support(const AttentionConfig&) const override {
    return CudagraphSupport::NEVER;
  }
  std::unique_ptr<MetadataBuilder> make_builder(const AttentionConfig& cfg) const override;
  std::unique_ptr<AttentionImpl> make_impl(const AttentionConfig& cfg) const override;
};

}  // namespace attnkit::reference
