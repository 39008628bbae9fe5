// The FlashInfer-style impl: validates a forward call against the configuration it was made
// for and the metadata its builder planned, then runs a decode-only batch on the planned decode
// (gpu_decode.h; the plan's device copy is refreshed when the builder re-planned). Batches with
// prefills are refused until the FlashInfer-style prefill kernels have run on a GPU (forward says so).
#pragma once
#include <memory>

#include "attnkit/backend.h"

namespace attnkit::flashinfer {

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg);

}  // namespace attnkit::flashinfer
