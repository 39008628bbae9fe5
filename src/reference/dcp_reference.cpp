// The CPU reference of DCP (attnkit/dcp.h): one rank's sharded attention, and the combine.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/dcp.h"
#include "attnkit/error.h"
#include "core/parallel.h"
#include "reference/attend_row.h"
#include "reference/validate_inputs.h"

namespace attnkit {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Empty shards: -inf, +inf and NaN LSEs count as -inf (docs/architecture.md section 5).
double sanitized(double lse) { return std::isnan(lse) || lse == std::numeric_limits<double>::infinity() ? kNegInf : lse; }

}  // namespace

void reference_attention_dcp_shard(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                                   std::span<const int32_t> global_seq_lens, const AttentionParams& params,
                                   const DcpShard& shard, const TensorView& out, const TensorView& lse) {
  constexpr std::string_view kWhere = "reference_attention_dcp_shard";
  shard.validate(kWhere);
  ATTNKIT_REQUIRE(!params.sinks.defined(), kWhere, "params.sinks", "defined",
                  "must be empty: the sink joins once, in the combine (dcp_combine_reference)");
  ATTNKIT_REQUIRE(lse.defined(), kWhere, "lse", "undefined", "must be given: the combine needs every shard's LSE");
  AttentionParams p = params;
  p.lse = lse;
  reference::validate_inputs(q, cache, batch, p, out, /*allow_query_longer_than_keys=*/true);
  ATTNKIT_REQUIRE(global_seq_lens.size() == batch.seq_lens.size(), kWhere, "global_seq_lens.size()",
                  global_seq_lens.size(), "must be num_reqs = " + std::to_string(batch.seq_lens.size()));
  for (int r = 0; r < batch.num_reqs(); ++r) {
    const int64_t want = dcp_local_len(global_seq_lens[r], shard);
    ATTNKIT_REQUIRE(batch.seq_lens[r] == want, kWhere, "seq_lens[" + std::to_string(r) + "]", batch.seq_lens[r],
                    "must be the rank's local length of global_seq_lens = " + std::to_string(global_seq_lens[r]) +
                        " (dcp_local_len: " + std::to_string(want) + ")");
    ATTNKIT_REQUIRE(batch.query_len(r) <= global_seq_lens[r], kWhere, "query_len[" + std::to_string(r) + "]",
                    batch.query_len(r), "must be <= global_seq_lens = " + std::to_string(global_seq_lens[r]));
  }
  // The batch's rows with the global position and the rank's share of the visible global keys:
  // the rank's tokens below global key x are exactly dcp_local_len(x) of them (the rule is
  // monotone), so the global range [lo, hi) is the local range [local_len(lo), local_len(hi)).
  reference::attend_batch_rows(q, cache, batch, params, out, lse, [&](int r, int64_t t, reference::RowProblem& rp) {
    rp.pos = global_seq_lens[r] - batch.query_len(r) + (t - batch.query_start_loc[r]);
    const reference::KeyRange vis =
        reference::visible_keys(rp.pos, global_seq_lens[r], params.causal, params.window_left, params.window_right);
    rp.keys = {dcp_local_len(vis.begin, shard), dcp_local_len(std::max(vis.end, vis.begin), shard)};
    rp.shard = &shard;
  });
}

void dcp_combine_reference(std::span<const TensorView> outs, std::span<const TensorView> lses, const TensorView& sinks,
                           const TensorView& out, const TensorView& out_lse) {
  constexpr std::string_view kWhere = "dcp_combine_reference";
  ATTNKIT_REQUIRE(!outs.empty() && outs.size() == lses.size(), kWhere, "outs.size() / lses.size()",
                  std::to_string(outs.size()) + " / " + std::to_string(lses.size()), "must be equal and >= 1 (one per rank)");
  out.require_device(kWhere, "out", Device::CPU);
  out.require_ndim(kWhere, "out", 3);
  const int64_t T = out.size(0), H = out.size(1), D = out.size(2);
  for (size_t r = 0; r < outs.size(); ++r) {
    const std::string o = "outs[" + std::to_string(r) + "]", l = "lses[" + std::to_string(r) + "]";
    outs[r].require_device(kWhere, o, Device::CPU);
    outs[r].require_shape(kWhere, o, {T, H, D});
    lses[r].require_device(kWhere, l, Device::CPU);
    lses[r].require_dtype(kWhere, l, DType::f32);
    lses[r].require_shape(kWhere, l, {H, T});
  }
  if (sinks.defined()) {
    sinks.require_dtype(kWhere, "sinks", DType::f32);
    sinks.require_shape(kWhere, "sinks", {H});
  }
  if (out_lse.defined()) {
    out_lse.require_dtype(kWhere, "out_lse", DType::f32);
    out_lse.require_shape(kWhere, "out_lse", {H, T});
  }
  detail::parallel_for(T * H, [&](int64_t item) {
    const int64_t t = item / H, h = item % H;
    thread_local std::vector<double> acc;
    acc.assign(D, 0.0);
    const double sink = sinks.defined() ? sinks.ptr<const float>()[h * sinks.stride(0)] : kNegInf;
    double m = sanitized(sink);
    std::vector<double> l(outs.size());
    for (size_t r = 0; r < outs.size(); ++r) {
      l[r] = sanitized(lses[r].ptr<const float>()[h * lses[r].stride(0) + t * lses[r].stride(1)]);
      m = std::max(m, l[r]);
    }
    double row_lse = kNegInf;
    if (m != kNegInf) {
      double sum = std::exp(sanitized(sink) - m);
      for (double x : l) sum += std::exp(x - m);
      row_lse = m + std::log(sum);
      for (size_t r = 0; r < outs.size(); ++r) {
        const double w = std::exp(l[r] - m) / sum;
        if (w == 0.0) continue;  // (an empty shard contributes exactly 0, whatever it holds)
        const char* row = static_cast<const char*>(outs[r].data) +
                          (t * outs[r].stride(0) + h * outs[r].stride(1)) * static_cast<int64_t>(dtype_size(outs[r].dtype));
        for (int64_t c = 0; c < D; ++c) acc[c] += w * load_as_float(row, outs[r].dtype, c);
      }
    }
    char* o_row = static_cast<char*>(out.data) + (t * out.stride(0) + h * out.stride(1)) * static_cast<int64_t>(dtype_size(out.dtype));
    for (int64_t c = 0; c < D; ++c) store_from_float(o_row, out.dtype, static_cast<int>(c), static_cast<float>(acc[c]));
    if (out_lse.defined())
      out_lse.ptr<float>()[h * out_lse.stride(0) + t * out_lse.stride(1)] = static_cast<float>(row_lse);
  }, /*grain=*/8);
}

}  // namespace attnkit
