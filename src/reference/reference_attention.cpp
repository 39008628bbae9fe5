// reference_attention: validate, then one attend_row per (token, head) in parallel
// (attend_batch_rows, which the DCP shard reference shares).
#include "attnkit/reference.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "reference/attend_row.h"
#include "reference/kv_row_reader.h"
#include "reference/validate_inputs.h"

namespace attnkit {

namespace {

float head_value(const TensorView& t, int h) {
  return t.ptr<const float>()[static_cast<int64_t>(h) * t.stride(0)];
}

// Request of every token; -1 for tokens past the batch (padding: output 0, LSE -inf).
std::vector<int> token_requests(const BatchView& batch, int64_t num_tokens) {
  std::vector<int> req(num_tokens, -1);
  for (int r = 0; r < batch.num_reqs(); ++r)
    for (int t = batch.query_start_loc[r]; t < batch.query_start_loc[r + 1]; ++t) req[t] = r;
  return req;
}

}  // namespace

namespace reference {

void attend_batch_rows(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                       const AttentionParams& params, const TensorView& out, const TensorView& lse,
                       const RowAdjust& adjust) {
  const int64_t num_tokens = q.size(0);
  const int num_heads = static_cast<int>(q.size(1));
  const int head_size = static_cast<int>(q.size(2));
  const int group = num_heads / cache.num_kv_heads;
  const double scale = params.resolved_scale(head_size);
  const KVRowReader k_reader(cache, cache.k, params.k_scale);
  const KVRowReader v_reader(cache, cache.v, params.v_scale);
  const std::vector<int> req_of = token_requests(batch, num_tokens);
  const size_t q_elem = dtype_size(q.dtype), out_elem = dtype_size(out.dtype);

  detail::parallel_for(num_tokens * num_heads, [&](int64_t item) {
    thread_local RowScratch scratch;
    thread_local std::vector<double> qd, od;
    const int64_t t = item / num_heads;
    const int h = static_cast<int>(item % num_heads);
    qd.resize(head_size);
    od.resize(head_size);

    double row_lse = -INFINITY;
    const int r = req_of[t];
    if (r < 0) {
      std::fill(od.begin(), od.end(), 0.0);
    } else {
      const char* q_row = static_cast<const char*>(q.data) +
                          (t * q.stride(0) + h * q.stride(1)) * static_cast<int64_t>(q_elem);
      for (int c = 0; c < head_size; ++c) qd[c] = load_as_float(q_row, q.dtype, c);

      RowProblem p;
      p.seq_len = batch.seq_lens[r];
      p.pos = p.seq_len - batch.query_len(r) + (t - batch.query_start_loc[r]);
      p.block_row = batch.block_row(r);
      p.block_size = cache.block_size;
      p.kv_head = h / group;
      p.head_size = head_size;
      p.keys = visible_keys(p.pos, p.seq_len, params.causal, params.window_left, params.window_right);
      p.scale = scale;
      p.softcap = params.softcap;
      p.alibi_slope = params.alibi_slope(r, h);
      if (params.sinks.defined()) {
        p.has_sink = true;
        p.sink = head_value(params.sinks, h);
      }
      if (adjust) adjust(r, t, p);
      row_lse = attend_row(p, qd.data(), k_reader, v_reader, od.data(), scratch);
    }

    char* o_row = static_cast<char*>(out.data) +
                  (t * out.stride(0) + h * out.stride(1)) * static_cast<int64_t>(out_elem);
    for (int c = 0; c < head_size; ++c)
      store_from_float(o_row, out.dtype, c, static_cast<float>(od[c]));
    if (lse.defined())
      lse.ptr<float>()[h * lse.stride(0) + t * lse.stride(1)] = static_cast<float>(row_lse);
  }, /*grain=*/4);
}

}  // namespace reference

void reference_attention(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                         const AttentionParams& params, const TensorView& out,
                         bool allow_query_longer_than_keys) {
  reference::validate_inputs(q, cache, batch, params, out, allow_query_longer_than_keys);
  reference::attend_batch_rows(q, cache, batch, params, out, params.lse, {});
}

}  // namespace attnkit
