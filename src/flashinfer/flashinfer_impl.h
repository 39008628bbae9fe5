// The FlashInfer-style impl: validates a forward call against the configuration it was made
// for and the metadata its builder planned, then runs the batch's decode part and then its
// prefill part on the planned kernels (gpu_planned.h; the plans' device copies are refreshed
// when the builder re-planned), into one output and LSE.
#pragma once
#include <memory>

#include "attnkit/backend.h"

namespace attnkit::flashinfer {

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg);

}  // namespace attnkit::flashinfer
