#include "flashinfer/cpu_forward.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "core/parallel.h"
#include "reference/attend_row.h"
#include "reference/kv_row_reader.h"
#include "reference/validate_inputs.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer cpu forward";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace

void check_planned_call(const TensorView& q, const PagedKV& cache, const PageTable& pages, const PlanBuffers& plan,
                        const PlanBatch& batch, const AttentionParams& p, std::string_view kWhere) {
  const PlanConfig& cfg = plan.config;
  const int64_t n = static_cast<int64_t>(batch.kv_lens.size());
  ATTNKIT_REQUIRE(plan.num_reqs == n && pages.num_reqs == n, kWhere, "plan / page table requests",
                  std::to_string(plan.num_reqs) + " / " + std::to_string(pages.num_reqs),
                  "must both be the planned batch's num_reqs = " + std::to_string(n));
  for (int r = 0; r < n; ++r)
    ATTNKIT_REQUIRE(pages.kv_len(r) == batch.kv_lens[r], kWhere,
                    "page table kv_len of request " + std::to_string(r), pages.kv_len(r),
                    "must be the planned kv_len = " + std::to_string(batch.kv_lens[r]));
  ATTNKIT_REQUIRE(p.causal == batch.causal && p.window_left == batch.window_left &&
                      p.window_right == batch.window_right,
                  kWhere, "params (causal, window_left, window_right)",
                  std::to_string(p.causal) + ", " + std::to_string(p.window_left) + ", " +
                      std::to_string(p.window_right),
                  "must be the ones the batch was planned with: " + std::to_string(batch.causal) +
                      ", " + std::to_string(batch.window_left) + ", " +
                      std::to_string(batch.window_right));
  ATTNKIT_REQUIRE(cache.num_kv_heads == cfg.num_kv_heads, kWhere, "cache num_kv_heads",
                  cache.num_kv_heads,
                  "must be the plan's num_kv_heads = " + std::to_string(cfg.num_kv_heads));
  ATTNKIT_REQUIRE(q.size(1) == int64_t{cfg.num_kv_heads} * cfg.group_size, kWhere, "q.size(1) (num_heads)",
                  q.size(1), "must be the plan's num_kv_heads * group_size = " +
                                 std::to_string(cfg.num_kv_heads * cfg.group_size));
  ATTNKIT_REQUIRE(q.size(2) == cfg.head_size, kWhere, "q.size(2) (head_size)", q.size(2),
                  "must be the plan's head_size = " + std::to_string(cfg.head_size));
  ATTNKIT_REQUIRE(cache.block_size == cfg.page_size && pages.page_size == cfg.page_size, kWhere,
                  "cache page_size", cache.block_size,
                  "must be the plan's page_size = " + std::to_string(cfg.page_size));
  ATTNKIT_REQUIRE(plan.num_tokens <= q.size(0), kWhere, "planned query tokens", plan.num_tokens,
                  "must be <= q.size(0) = " + std::to_string(q.size(0)));
  if (pages.max_page_id >= cache.num_blocks)  // (the table's largest id: O(1) per call; the first bad one named)
    for (int64_t i = 0; i < pages.num_pages; ++i)
      ATTNKIT_REQUIRE(pages.indices[i] < cache.num_blocks, kWhere,
                      "planned page id indices[" + std::to_string(i) + "]", pages.indices[i],
                      "must be < the cache's num_blocks = " + std::to_string(cache.num_blocks));
}

namespace {

float head_value(const TensorView& t, int h) { return t.ptr<const float>()[h * t.stride(0)]; }

}  // namespace

void run_plan_on_cpu(const TensorView& q, const PagedKV& cache, const PageTable& pages,
                     const PlanBuffers& plan, const PlanBatch& batch, const AttentionParams& params,
                     const TensorView& out) {
  // The reference's checks of q, out, cache and params (its batch is the page table, checked
  // here: an empty BatchView), then the plan against the call.
  const std::array<int32_t, 1> no_reqs{0};
  BatchView empty;
  empty.query_start_loc = no_reqs;
  reference::validate_inputs(q, cache, empty, params, out, false);
  check_planned_call(q, cache, pages, plan, batch, params, kWhere);

  const int kv_heads = cache.num_kv_heads, group = plan.config.group_size;
  const int head_size = static_cast<int>(q.size(2));
  const int64_t num_tokens = q.size(0), tile_q = plan.tile_q;
  const double scale = params.resolved_scale(head_size);
  const reference::KVRowReader k_reader(cache, cache.k, params.k_scale);
  const reference::KVRowReader v_reader(cache, cache.v, params.v_scale);
  const size_t q_elem = dtype_size(q.dtype), out_elem = dtype_size(out.dtype);

  auto write = [&](int64_t t, int h, const double* o, double lse) {
    char* row = static_cast<char*>(out.data) +
                (t * out.stride(0) + h * out.stride(1)) * static_cast<int64_t>(out_elem);
    for (int c = 0; c < head_size; ++c)
      store_from_float(row, out.dtype, c, o ? static_cast<float>(o[c]) : 0.f);
    if (params.lse.defined())
      params.lse.ptr<float>()[h * params.lse.stride(0) + t * params.lse.stride(1)] = static_cast<float>(lse);
  };
  for (int64_t t = plan.num_tokens; t < num_tokens; ++t)  // padding rows
    for (int h = 0; h < kv_heads * group; ++h) write(t, h, nullptr, kNegInf);

  // Split tiles' partials, (partial row, kv head) major, in double as the reference computes.
  std::vector<double> part_o(static_cast<size_t>(plan.num_partial_rows) * kv_heads * head_size);
  std::vector<double> part_lse(static_cast<size_t>(plan.num_partial_rows) * kv_heads);

  // Pass 1: every (work item, KV head), as a CTA slot of the grid (num_slots, num_kv_heads).
  detail::parallel_for(int64_t{plan.num_items} * kv_heads, [&](int64_t job) {
    thread_local reference::RowScratch scratch;
    thread_local std::vector<double> qd, od;
    qd.resize(head_size);
    od.resize(head_size);
    const WorkItem& it = plan.items[job / kv_heads];
    const int kh = static_cast<int>(job % kv_heads);
    const int32_t q0 = batch.qo_indptr[it.request];
    const int64_t qo = batch.qo_indptr[it.request + 1] - q0, kv = batch.kv_lens[it.request];
    const int64_t row0 = it.q_tile * tile_q, row1 = std::min(qo * group, row0 + tile_q);
    for (int64_t row = row0; row < row1; ++row) {
      const int64_t t = q0 + row / group;
      const int h = kh * group + static_cast<int>(row % group);
      const char* q_row = static_cast<const char*>(q.data) +
                          (t * q.stride(0) + h * q.stride(1)) * static_cast<int64_t>(q_elem);
      for (int c = 0; c < head_size; ++c) qd[c] = load_as_float(q_row, q.dtype, c);
      reference::RowProblem p;
      p.seq_len = kv;
      p.pos = kv - qo + row / group;
      p.block_row = pages.indices.data() + pages.indptr[it.request];
      p.block_size = cache.block_size;
      p.kv_head = kh;
      p.head_size = head_size;
      const reference::KeyRange vis = reference::visible_keys(p.pos, kv, params.causal, params.window_left,
                                                              params.window_right);
      p.keys = {std::max<int64_t>(vis.begin, it.kv_begin), std::min<int64_t>(vis.end, it.kv_end)};
      p.scale = scale;
      p.softcap = params.softcap;
      p.alibi_slope = params.alibi_slope(it.request, h);
      // The sink joins a row's softmax once: in the item of an unsplit tile, else in the merge.
      if (params.sinks.defined() && it.num_chunks == 1) {
        p.has_sink = true;
        p.sink = head_value(params.sinks, h);
      }
      const double lse = reference::attend_row(p, qd.data(), k_reader, v_reader, od.data(), scratch);
      if (it.num_chunks == 1) {
        write(t, h, od.data(), lse);
      } else {
        const int64_t slot = (it.partial_base + (row - row0) * it.num_chunks + it.chunk) * kv_heads + kh;
        std::copy(od.begin(), od.end(), part_o.begin() + slot * head_size);
        part_lse[slot] = lse;
      }
    }
  }, /*grain=*/1);

  // Pass 2: the merge map; packed row g's partials are [merge_indptr[g], merge_indptr[g + 1]).
  detail::parallel_for(int64_t{plan.num_tokens} * group * kv_heads, [&](int64_t job) {
    const int64_t g = job / kv_heads;
    const int kh = static_cast<int>(job % kv_heads);
    const int32_t b = plan.merge_indptr[g], e = plan.merge_indptr[g + 1];
    if (b == e) return;  // written directly
    const int h = kh * group + static_cast<int>(g % group);
    const bool sink = params.sinks.defined();
    const double s = sink ? head_value(params.sinks, h) : kNegInf;
    double m = s;
    for (int32_t i = b; i < e; ++i) m = std::max(m, part_lse[int64_t{i} * kv_heads + kh]);
    thread_local std::vector<double> od;
    od.assign(head_size, 0.0);
    if (m == kNegInf) return write(g / group, h, od.data(), kNegInf);
    double denom = sink ? std::exp(s - m) : 0.0;
    for (int32_t i = b; i < e; ++i) {
      const int64_t slot = int64_t{i} * kv_heads + kh;
      const double w = std::exp(part_lse[slot] - m);
      if (w == 0.0) continue;
      denom += w;
      for (int c = 0; c < head_size; ++c) od[c] += w * part_o[slot * head_size + c];
    }
    for (int c = 0; c < head_size; ++c) od[c] /= denom;
    write(g / group, h, od.data(), m + std::log(denom));
  }, /*grain=*/4);
}

}  // namespace attnkit::flashinfer
