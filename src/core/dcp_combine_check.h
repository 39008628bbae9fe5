// The checks and workspace layout of attnkit::dcp_combine (include/attnkit/dcp.h), host code
// shared by the CUDA combine (src/cuda/dcp_combine.cu) and a build without CUDA.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attnkit/dcp.h"

namespace attnkit {

struct DcpCombineLayout {
  int64_t tokens = 0;
  int heads = 0, head_size = 0;
  // Byte offsets in the workspace: all-gather + reduce-scatter: the gathered LSEs [N][H][T],
  // the weighted partials [N][T][H/N][D], the reduce-scatter's result [T][H/N][D]; all-to-all:
  // sent partials [N][T][H/N][D] and LSEs [N][H/N][T], received ones likewise. All f32.
  size_t offsets[4] = {0, 0, 0, 0};
  size_t bytes = 0;
};

DcpCombineLayout dcp_combine_layout(int64_t num_tokens, int num_heads, int head_size, int world_size,
                                    DcpCombinePath path);
// Every rule of dcp_combine that needs no collective (Error naming the value); the layout.
DcpCombineLayout dcp_combine_check(const DcpCombineArgs& a);

}  // namespace attnkit
