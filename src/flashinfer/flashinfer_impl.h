// The FlashInfer-style impl: validates a forward call against the configuration it was made
// for and the metadata its builder planned. The GPU kernels come in a later issue; until then
// forward() throws after validation.
#pragma once
#include <memory>

#include "attnkit/backend.h"

namespace attnkit::flashinfer {

std::unique_ptr<AttentionImpl> make_flashinfer_impl(const AttentionConfig& cfg);

}  // namespace attnkit::flashinfer
