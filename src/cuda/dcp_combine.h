// The local steps of the DCP combine on one rank (include/attnkit/dcp.h dcp_combine). The
// collectives between them are NCCL's in dcp_combine (dcp_combine.cu) or, in the tests, a
// simulation of N ranks in one process. Shapes: T tokens, H query heads, D head size, N ranks,
// Hs = H / N heads per rank (rank r's output: heads [r * Hs, (r + 1) * Hs)). partial_out
// [T, H, D] (f16 / bf16 / f32, last dim contiguous), LSEs f32 natural log, contiguous. The merge
// rule is docs/architecture.md section 5's, as dcp_combine_reference applies it: an LSE of -inf,
// +inf or NaN is an empty part (weight exactly 0, its values unread), the sink joins once, a row
// no rank saw is 0 with LSE -inf (or the sink's logit).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attnkit/detail/host_device.h"
#include "attnkit/tensor.h"

namespace attnkit::cuda {

struct DcpShape {
  int64_t tokens = 0;
  int heads = 0, head_size = 0, world = 1, rank = 0;
  ATTNKIT_HD int slice() const { return heads / world; }
};

// All-gather + reduce-scatter. lse_all [N][H][T] (every rank's LSE, all-gathered) -> send
// [N][T][Hs][D] f32: this rank's partial weighted by its share of each row (sinks f32 [H] or
// nullptr), chunk j holding rank j's heads. The reduce-scatter's sum of the chunks is the merged
// output; finish writes it ([T][Hs][D] f32 recv) to out [T, Hs, D] and the merged LSE to
// out_lse [Hs][T] (nullptr: none).
void dcp_weigh_for_reduce_scatter(const DcpShape& s, const TensorView& partial_out, const float* lse_all,
                                  const float* sinks, float* send, void* stream);
void dcp_finish_reduce_scatter(const DcpShape& s, const float* recv, const float* lse_all, const float* sinks,
                               const TensorView& out, float* out_lse, void* stream);

// All-to-all. pack: send_o [N][T][Hs][D] f32 and send_lse [N][Hs][T], chunk j for rank j; after
// the exchange recv_o / recv_lse hold chunk r from rank r, which merge combines into out / out_lse.
void dcp_pack_all_to_all(const DcpShape& s, const TensorView& partial_out, const float* partial_lse, float* send_o,
                         float* send_lse, void* stream);
void dcp_merge_all_to_all(const DcpShape& s, const float* recv_o, const float* recv_lse, const float* sinks,
                          const TensorView& out, float* out_lse, void* stream);

}  // namespace attnkit::cuda
