// The backend objects the registry lists. Each backend's own directory defines its accessor
// (a function-local static), so the registry needs no backend's headers.
#pragma once
#include "attnkit/backend.h"

namespace attnkit {

const AttentionBackend& reference_backend();   // src/reference/
const AttentionBackend& flash_attn_backend();  // src/flash_attn/
const AttentionBackend& flashinfer_backend();  // src/flashinfer/

}  // namespace attnkit
