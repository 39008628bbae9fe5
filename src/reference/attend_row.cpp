#include "reference/attend_row.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnkit::reference {

namespace {
// Four partial sums let the additions overlap; the result differs from a plain loop only by
// double rounding.
double dot(const double* q, const float* k, int d) {
  double acc[4] = {0, 0, 0, 0};
  int c = 0;
  for (; c + 4 <= d; c += 4)
    for (int i = 0; i < 4; ++i) acc[i] += q[c + i] * static_cast<double>(k[c + i]);
  for (; c < d; ++c) acc[0] += q[c] * static_cast<double>(k[c]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
}  // namespace

KeyRange visible_keys(int64_t pos, int64_t seq_len, bool causal, int window_left,
                      int window_right) {
  KeyRange r{0, seq_len};
  if (causal) r.end = std::min(r.end, pos + 1);
  if (window_left >= 0) r.begin = std::max(r.begin, pos - window_left);
  if (window_right >= 0) r.end = std::min(r.end, pos + window_right + 1);
  return r;
}

double attend_row(const RowProblem& p, const double* q, const KVRowReader& k,
                  const KVRowReader& v, double* o, RowScratch& scratch) {
  const int d = p.head_size;
  std::fill(o, o + d, 0.0);
  const int64_t n = p.keys.size();
  if (n == 0) return p.has_sink ? p.sink : -std::numeric_limits<double>::infinity();

  scratch.logits.resize(n);
  scratch.kv_row.resize(d);
  float* row = scratch.kv_row.data();
  double max_logit = p.has_sink ? p.sink : -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = p.keys.begin + i;
    k.read(slot_of(p.block_row, p.block_size, j), p.kv_head, row);
    double s = p.scale * dot(q, row, d);
    if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
    const int64_t key_pos = p.shard != nullptr ? dcp_global_token(j, *p.shard) : j;
    s -= p.alibi_slope * static_cast<double>(std::llabs(p.pos - key_pos));
    scratch.logits[i] = s;
    max_logit = std::max(max_logit, s);
  }

  double denom = p.has_sink ? std::exp(p.sink - max_logit) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = std::exp(scratch.logits[i] - max_logit);
    denom += w;
    v.read(slot_of(p.block_row, p.block_size, p.keys.begin + i), p.kv_head, row);
    for (int c = 0; c < d; ++c) o[c] += w * static_cast<double>(row[c]);
  }
  for (int c = 0; c < d; ++c) o[c] /= denom;
  return max_logit + std::log(denom);
}

}  // namespace attnkit::reference
