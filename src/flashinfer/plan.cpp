// The FlashInfer-style plan. Why the bounds hold (W = sum of the tiles' visible key counts,
// U = number of tiles, S = num_slots, C = chunk tokens, c_min = min chunk tokens):
//  * Items. If the search's chunk was taken, items <= S by construction. If the balance chunk
//    was taken, C >= W / S and n_t = ceil(v_t / C) <= v_t / C + 1, so items <= W / C + U <= S + U.
//    With no split, items = U. Hence items <= S + U.
//  * Partial rows (split tiles only, rows_t <= tile_q): with the search's chunk, sum n_t <= S
//    gives <= tile_q * S; with the balance chunk, rows_t * n_t <= rows_t + tile_q * v_t / C gives
//    <= packed rows + tile_q * S.
//  * Balance. Greedy least-loaded assignment ends with max load <= ideal + max item cost
//    (Graham; ideal = total cost / S >= W / S). An item costs <= C + kTileRowCost * tile_q,
//    and C <= the balance chunk = max(c_min, ceil(W / S) rounded up to pages) <= ideal + c_min
//    (a page is never more than c_min). So max load <= 2 * ideal + c_min + kTileRowCost * tile_q.
#include "flashinfer/plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "attnkit/error.h"
#include "core/int_math.h"
#include "cuda/fast_divmod.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer plan";

std::string idx(std::string_view name, int64_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

// A query tile and the keys its rows can see (int32, as kv_lens and packed rows are).
struct Tile {
  int32_t request, q_tile, rows;
  int32_t lo, hi;
  int32_t visible() const { return hi - lo; }
};

// Division by one divisor for many dividends in [0, 2^31): cuda::FastDivmod's multiply and
// shift instead of a division each (the plan divides every tile's packed rows by the group and
// its keys by the chunk, once per candidate of the chunk search; src/flash_attn/DECISIONS.md:
// Host plan: divisions by a precomputed divisor).
using Divisor = cuda::FastDivmod;
// ceil(a / d) for a in [0, 2^31).
int32_t ceil_div_by(int32_t a, const Divisor& d) {
  int32_t rem;
  const int32_t q = d.divmod(a, rem);
  return q + (rem != 0);
}
// The divisor for a chunk of c tokens: no tile sees 2^31 keys, so a larger chunk splits no tile
// either, and 2^31 - 1 counts the same.
Divisor chunk_divisor(int64_t c) {
  return Divisor(static_cast<int>(std::min<int64_t>(c, std::numeric_limits<int32_t>::max())));
}

// The union of the visible keys of queries [i0, i1] of a request with qo query tokens over kv
// keys (positions p = kv - qo + i; docs/architecture.md section 4).
void visible_range(const PlanBatch& b, int64_t qo, int64_t kv, int64_t i0, int64_t i1,
                   int64_t& lo, int64_t& hi) {
  const int64_t p0 = kv - qo + i0, p1 = kv - qo + i1;
  hi = kv;
  if (b.causal) hi = std::min(hi, p1 + 1);
  else if (b.window_right >= 0) hi = std::min(hi, p1 + b.window_right + 1);
  lo = b.window_left >= 0 ? std::max<int64_t>(0, p0 - b.window_left) : 0;
  if (hi < lo) hi = lo;
}

void validate_batch(const PlanBatch& b, const PlanBuffers& plan) {
  const PlanConfig& cfg = plan.config;
  const int64_t n = static_cast<int64_t>(b.kv_lens.size());
  ATTNKIT_REQUIRE(b.qo_indptr.size() == b.kv_lens.size() + 1, kWhere, "qo_indptr.size()",
                  b.qo_indptr.size(),
                  "must be num_reqs + 1 = " + std::to_string(n + 1) + " (num_reqs = kv_lens.size())");
  ATTNKIT_REQUIRE(n <= plan.capacity.max_reqs, kWhere, "num_reqs", n,
                  "must be <= the plan's capacity max_reqs = " +
                      std::to_string(plan.capacity.max_reqs));
  ATTNKIT_REQUIRE(b.qo_indptr[0] == 0, kWhere, "qo_indptr[0]", b.qo_indptr[0], "must be 0");
  for (int64_t r = 0; r < n; ++r) {
    const int64_t qo = int64_t{b.qo_indptr[r + 1]} - b.qo_indptr[r];
    ATTNKIT_REQUIRE(qo >= 0, kWhere, idx("qo_indptr", r + 1), b.qo_indptr[r + 1],
                    "must be >= qo_indptr[" + std::to_string(r) + "] = " +
                        std::to_string(b.qo_indptr[r]) + " (non-decreasing)");
    ATTNKIT_REQUIRE(b.kv_lens[r] >= 0, kWhere, idx("kv_lens", r), b.kv_lens[r], "must be >= 0");
    ATTNKIT_REQUIRE(qo <= b.kv_lens[r], kWhere, idx("kv_lens", r), b.kv_lens[r],
                    "must be >= the request's query_len = " + std::to_string(qo) +
                        " (the new tokens are among the keys)");
    if (cfg.kernel == PlanKernel::CudaCoreDecode)
      ATTNKIT_REQUIRE(qo <= 1, kWhere, "query_len of request " + std::to_string(r), qo,
                      "must be <= 1 for the CUDA-core decode kernel (one query token per item)");
  }
  const int64_t tokens = b.qo_indptr[n];
  ATTNKIT_REQUIRE(tokens <= plan.capacity.max_tokens, kWhere, "num_tokens", tokens,
                  "must be <= the plan's capacity max_tokens = " +
                      std::to_string(plan.capacity.max_tokens));
  ATTNKIT_REQUIRE(b.window_left >= -1, kWhere, "window_left", b.window_left, "must be >= -1 (-1 = unbounded)");
  ATTNKIT_REQUIRE(b.window_right >= -1, kWhere, "window_right", b.window_right, "must be >= -1 (-1 = unbounded)");
}

int choose_tile_q(const PlanBatch& b, const PlanConfig& cfg) {
  if (cfg.fixed_tile_q > 0) return cfg.fixed_tile_q;
  if (cfg.kernel == PlanKernel::CudaCoreDecode) return cfg.group_size;
  // Average over the requests that have query tokens: padding requests would shrink the tile.
  int64_t rows = 0, nonempty = 0;
  for (size_t r = 0; r + 1 < b.qo_indptr.size(); ++r) {
    const int64_t qo = b.qo_indptr[r + 1] - b.qo_indptr[r];
    rows += qo * cfg.group_size;
    nonempty += qo > 0;
  }
  return cta_tile_q(nonempty ? static_cast<double>(rows) / nonempty : 0.0, cfg.head_size);
}

// (packed rows < 2^31: the capacity's rule, which validate_batch holds the batch to)
std::vector<Tile> make_tiles(const PlanBatch& b, int group, int tile_q) {
  const Divisor by_group(group), by_tile(tile_q);
  const size_t num_reqs = b.kv_lens.size();
  std::vector<Tile> tiles;
  tiles.reserve(static_cast<size_t>(ceil_div_by(b.qo_indptr[num_reqs] * group, by_tile)) + num_reqs);
  for (size_t r = 0; r < num_reqs; ++r) {
    const int32_t qo = b.qo_indptr[r + 1] - b.qo_indptr[r], kv = b.kv_lens[r];
    const int32_t packed = qo * group;
    for (int64_t row0 = 0, t = 0; row0 < packed; row0 += tile_q, ++t) {
      const int32_t first = static_cast<int32_t>(row0);
      const int32_t last = static_cast<int32_t>(std::min<int64_t>(packed, row0 + tile_q) - 1);
      int64_t lo, hi;
      visible_range(b, qo, kv, by_group.div(first), by_group.div(last), lo, hi);
      tiles.push_back(Tile{static_cast<int32_t>(r), static_cast<int32_t>(t), last - first + 1, static_cast<int32_t>(lo),
                           static_cast<int32_t>(hi)});
    }
  }
  return tiles;
}

// Chunks of a tile for chunks of c tokens (chunk_divisor(c)); a tile that sees no key still
// gets one item, which writes its rows' empty result (output 0, LSE -inf).
int32_t chunks_of(const Tile& t, const Divisor& c) { return std::max(1, ceil_div_by(t.visible(), c)); }

int64_t count_items(const std::vector<Tile>& tiles, int64_t c) {
  const Divisor d = chunk_divisor(c);
  int64_t n = 0;
  for (const Tile& t : tiles) n += chunks_of(t, d);
  return n;
}

// The chunk size in tokens (a whole number of pages), steps 3 of plan.h.
int64_t choose_chunk(const std::vector<Tile>& tiles, const PlanConfig& cfg) {
  const int64_t page = cfg.page_size;
  int64_t max_visible = 0, total_visible = 0;
  for (const Tile& t : tiles) {
    max_visible = std::max<int64_t>(max_visible, t.visible());
    total_visible += t.visible();
  }
  const int64_t min_pages = cfg.min_chunk_tokens() / page;
  const int64_t max_pages = std::max<int64_t>(1, ceil_div(max_visible, page));
  int64_t search = max_pages;  // no split when even whole ranges do not fit one wave
  if (min_pages < max_pages && count_items(tiles, max_pages * page) <= cfg.num_slots) {
    int64_t lo = min_pages, hi = max_pages;  // the answer lies in [lo, hi]; hi fits
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (count_items(tiles, mid * page) <= cfg.num_slots) hi = mid;
      else lo = mid + 1;
    }
    search = lo;
  }
  const int64_t balance = std::max(min_pages, ceil_div(total_visible, cfg.num_slots * page));
  return std::min(search, balance) * page;
}

// Longest-processing-time-first assignment of items to the least-loaded slot.
void assign_slots(PlanBuffers& plan, const std::vector<int64_t>& cost) {
  const int n = plan.num_items, slots = plan.config.num_slots;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return cost[a] > cost[b]; });
  // A min-heap of (load, slot), ties to the lower slot: each item goes to the top's slot, whose
  // load then grows and sifts down (one pass, not a pop and a push).
  using Load = std::pair<int64_t, int32_t>;
  std::vector<Load> heap(static_cast<size_t>(slots));
  for (int32_t s = 0; s < slots; ++s) heap[s] = {0, s};  // (a valid heap: loads equal, slots ascending)
  std::vector<int32_t> slot_of(n);
  for (int32_t i : order) {
    slot_of[i] = heap[0].second;
    const Load top{heap[0].first + cost[i], heap[0].second};
    size_t at = 0;
    for (;;) {
      size_t child = 2 * at + 1;
      if (child >= heap.size()) break;
      if (child + 1 < heap.size() && heap[child + 1] < heap[child]) ++child;
      if (!(heap[child] < top)) break;
      heap[at] = heap[child];
      at = child;
    }
    heap[at] = top;
  }
  // Counting sort by slot, keeping the longest-first order within a slot.
  std::fill(plan.slot_indptr.begin(), plan.slot_indptr.end(), 0);
  for (int32_t i : order) ++plan.slot_indptr[slot_of[i] + 1];
  for (int s = 0; s < slots; ++s) plan.slot_indptr[s + 1] += plan.slot_indptr[s];
  std::vector<int32_t> cursor(plan.slot_indptr.begin(), plan.slot_indptr.end() - 1);
  for (int32_t i : order) plan.slot_items[cursor[slot_of[i]]++] = i;
}

}  // namespace

int cta_tile_q(double avg_packed_qo_len, int head_size) {
  if (avg_packed_qo_len > kTileQLargeAbove && head_size < kTileQLargeMaxHeadSize) return kTileQLarge;
  if (avg_packed_qo_len > kTileQMediumAbove) return kTileQMedium;
  return kTileQSmall;
}

int num_slots_for(int num_sms, int num_kv_heads) {
  ATTNKIT_REQUIRE(num_sms > 0, kWhere, "num_sms", num_sms, "must be > 0");
  ATTNKIT_REQUIRE(num_kv_heads > 0, kWhere, "num_kv_heads", num_kv_heads, "must be > 0");
  return std::max(1, num_sms * kCtasPerSm / num_kv_heads);
}

void PlanConfig::validate(std::string_view where) const {
  ATTNKIT_REQUIRE(num_kv_heads > 0, where, "num_kv_heads", num_kv_heads, "must be > 0");
  ATTNKIT_REQUIRE(group_size > 0, where, "group_size", group_size, "must be > 0");
  ATTNKIT_REQUIRE(head_size > 0, where, "head_size", head_size, "must be > 0");
  ATTNKIT_REQUIRE(page_size > 0, where, "page_size", page_size, "must be > 0");
  ATTNKIT_REQUIRE(num_slots > 0, where, "num_slots", num_slots, "must be > 0");
  ATTNKIT_REQUIRE(fixed_tile_q >= 0, where, "fixed_tile_q", fixed_tile_q, "must be >= 0 (0 = chosen per batch)");
  if (kernel == PlanKernel::CudaCoreDecode)
    ATTNKIT_REQUIRE(fixed_tile_q == 0 || fixed_tile_q == group_size, where, "fixed_tile_q",
                    fixed_tile_q,
                    "must be 0 or group_size = " + std::to_string(group_size) +
                        " for the CUDA-core decode kernel (one query token's heads per item)");
}

int PlanConfig::min_tile_q() const {
  if (fixed_tile_q > 0) return fixed_tile_q;
  return kernel == PlanKernel::CudaCoreDecode ? group_size : kTileQSmall;
}

int PlanConfig::max_tile_q() const {
  if (fixed_tile_q > 0) return fixed_tile_q;
  if (kernel == PlanKernel::CudaCoreDecode) return group_size;
  return head_size < kTileQLargeMaxHeadSize ? kTileQLarge : kTileQMedium;
}

int64_t PlanConfig::min_chunk_tokens() const {
  return std::max<int64_t>(kMinKVChunkTokens / page_size, 1) * page_size;
}

PlanCapacity PlanCapacity::for_limits(const PlanConfig& cfg, int max_reqs, int max_tokens) {
  cfg.validate(kWhere);
  ATTNKIT_REQUIRE(max_reqs >= 0, kWhere, "max_reqs", max_reqs, "must be >= 0");
  ATTNKIT_REQUIRE(max_tokens >= 0, kWhere, "max_tokens", max_tokens, "must be >= 0");
  const int64_t packed = int64_t{max_tokens} * cfg.group_size;
  // Tiles: sum over requests of ceil(packed_r / tile) <= packed / tile + requests, and no more
  // than one per packed row.
  const int64_t tiles = std::min(packed, ceil_div(packed, cfg.min_tile_q()) + max_reqs);
  PlanCapacity c;
  c.max_reqs = max_reqs;
  c.max_tokens = max_tokens;
  c.max_items = cfg.num_slots + tiles;
  c.max_partial_rows = packed + int64_t{cfg.max_tile_q()} * cfg.num_slots;
  return c;
}

PlanBuffers::PlanBuffers(const PlanConfig& cfg, const PlanCapacity& cap) : config(cfg), capacity(cap) {
  cfg.validate(kWhere);
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  ATTNKIT_REQUIRE(cap.max_reqs >= 0, kWhere, "capacity.max_reqs", cap.max_reqs, "must be >= 0");
  ATTNKIT_REQUIRE(cap.max_tokens >= 0, kWhere, "capacity.max_tokens", cap.max_tokens, "must be >= 0");
  ATTNKIT_REQUIRE(cap.max_items >= 0 && cap.max_items <= kMax, kWhere, "capacity.max_items",
                  cap.max_items, "must be in [0, 2^31) (item ids are int32)");
  ATTNKIT_REQUIRE(cap.max_partial_rows >= 0 && cap.max_partial_rows <= kMax, kWhere,
                  "capacity.max_partial_rows", cap.max_partial_rows,
                  "must be in [0, 2^31) (partial rows are int32)");
  const int64_t packed = int64_t{cap.max_tokens} * cfg.group_size;
  ATTNKIT_REQUIRE(packed < kMax, kWhere, "capacity.max_tokens * group_size", packed,
                  "must be < 2^31 (packed rows are int32)");
  items.resize(static_cast<size_t>(cap.max_items));
  slot_indptr.assign(static_cast<size_t>(cfg.num_slots) + 1, 0);
  slot_items.assign(static_cast<size_t>(cap.max_items), 0);
  merge_indptr.assign(static_cast<size_t>(packed) + 1, 0);
}

size_t PlanBuffers::workspace_bytes_for(const PlanConfig& config, const PlanCapacity& capacity) {
  return static_cast<size_t>(capacity.max_partial_rows) * config.num_kv_heads *
         (static_cast<size_t>(config.head_size) + 1) * sizeof(float);
}

int64_t PlanBuffers::balance_slack() const {
  return config.min_chunk_tokens() + int64_t{kTileRowCost} * tile_q;
}

void plan_batch(const PlanBatch& batch, PlanBuffers& plan) {
  const PlanConfig& cfg = plan.config;
  validate_batch(batch, plan);
  const int group = cfg.group_size;
  const int tile_q = choose_tile_q(batch, cfg);
  const std::vector<Tile> tiles = make_tiles(batch, group, tile_q);
  const int64_t chunk = tiles.empty() ? cfg.min_chunk_tokens() : choose_chunk(tiles, cfg);

  // Count before writing, so an overflow leaves the previous plan intact.
  const Divisor by_chunk = chunk_divisor(chunk);
  int64_t num_items = 0, num_partials = 0;
  for (const Tile& t : tiles) {
    const int64_t n = chunks_of(t, by_chunk);
    num_items += n;
    if (n > 1) num_partials += n * t.rows;
  }
  ATTNKIT_REQUIRE(num_items <= plan.capacity.max_items, kWhere, "work items", num_items,
                  "must be <= the plan's capacity max_items = " +
                      std::to_string(plan.capacity.max_items));
  ATTNKIT_REQUIRE(num_partials <= plan.capacity.max_partial_rows, kWhere, "partial rows",
                  num_partials,
                  "must be <= the plan's capacity max_partial_rows = " +
                      std::to_string(plan.capacity.max_partial_rows));

  const int num_reqs = static_cast<int>(batch.kv_lens.size());
  plan.num_reqs = num_reqs;
  plan.num_tokens = batch.qo_indptr[num_reqs];
  plan.tile_q = tile_q;
  plan.kv_chunk_tokens = chunk;
  plan.num_items = static_cast<int>(num_items);
  plan.num_partial_rows = static_cast<int>(num_partials);
  plan.split_kv = num_partials > 0;

  std::vector<int64_t> cost(static_cast<size_t>(num_items));
  int32_t item = 0, partial = 0;
  plan.merge_indptr[0] = 0;
  for (const Tile& t : tiles) {
    const int32_t n = chunks_of(t, by_chunk);
    const int32_t base = n > 1 ? partial : -1;
    for (int32_t j = 0; j < n; ++j) {
      const int64_t b = std::min<int64_t>(t.hi, t.lo + j * chunk), e = std::min<int64_t>(t.hi, t.lo + (j + 1) * chunk);
      plan.items[item] = WorkItem{t.request, t.q_tile, static_cast<int32_t>(b),
                                  static_cast<int32_t>(e), j, n, base};
      cost[item] = item_cost(e - b, t.rows);
      ++item;
    }
    // Packed rows of this tile, in order: request r's rows start at qo_indptr[r] * group.
    const int64_t row0 = int64_t{batch.qo_indptr[t.request]} * group + int64_t{t.q_tile} * tile_q;
    for (int32_t k = 0; k < t.rows; ++k)
      plan.merge_indptr[row0 + k + 1] = plan.merge_indptr[row0 + k] + (n > 1 ? n : 0);
    if (n > 1) partial += n * t.rows;
  }
  assign_slots(plan, cost);
}

}  // namespace attnkit::flashinfer
