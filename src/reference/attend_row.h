// The attention math for one query row (one token, one query head) over its request's keys,
// in double, straight from docs/architecture.md section 4: mask -> logits -> score mods -> softmax.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "attnkit/dcp.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"
#include "reference/kv_row_reader.h"

namespace attnkit::reference {

// Keys j in [begin, end) are visible; begin >= end means none.
struct KeyRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

// Causal (bottom-right: j <= pos) and sliding window (pos - left <= j <= pos + right, -1 =
// unbounded) intersected with [0, seq_len). pos may be negative (query longer than keys).
KeyRange visible_keys(int64_t pos, int64_t seq_len, bool causal, int window_left,
                      int window_right);

struct RowProblem {
  int64_t pos = 0;      // the query's position among its request's keys
  int64_t seq_len = 0;  // the request's key count
  const int32_t* block_row = nullptr;  // the request's block-table row
  int block_size = 0;
  int kv_head = 0;
  int head_size = 0;
  KeyRange keys;
  double scale = 1.0;
  double softcap = 0.0;      // > 0: s = c * tanh(s / c), after scaling
  double alibi_slope = 0.0;  // s += -slope * |pos - j|, after softcap
  bool has_sink = false;
  double sink = 0.0;  // logit joining the denominator with no value
  // DCP (attnkit/dcp.h): the keys are this rank's local tokens; pos is global and the ALiBi
  // distance is taken to key j's global position. nullptr: keys are the request's own.
  const DcpShard* shard = nullptr;
};

// Per-thread scratch so a row allocates nothing once warm.
struct RowScratch {
  std::vector<double> logits;
  std::vector<float> kv_row;
};

// Writes o (head_size values) and returns the natural-log LSE. No visible key: o = 0 and
// LSE = -inf, or the sink logit when there is a sink.
double attend_row(const RowProblem& p, const double* q, const KVRowReader& k,
                  const KVRowReader& v, double* o, RowScratch& scratch);

// Every (token, head) row of `batch` through attend_row, in parallel: q read, the row problem
// set up from the batch (position, block row, visible keys, score mods, sink), then changed by
// `adjust` (if set: request, token, problem), o stored in out and the LSE in lse (if defined,
// f32 [num_heads, num_tokens]). Rows past the batch's tokens get 0 and -inf. The caller
// validates the inputs first.
using RowAdjust = std::function<void(int req, int64_t token, RowProblem&)>;
void attend_batch_rows(const TensorView& q, const PagedKV& cache, const BatchView& batch,
                       const AttentionParams& params, const TensorView& out, const TensorView& lse,
                       const RowAdjust& adjust);

}  // namespace attnkit::reference
