// Invariants of the FlashInfer-style plan over random batches: exact KV coverage per query
// tile, chunk sizes, capacities, the balance bound, the merge map; and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/error.h"
#include "flashinfer/plan.h"
#include "test_util.h"

namespace attnkit::flashinfer {
namespace {

enum class Kind { Decode, Prefill, Mixed };
const char* kind_name(Kind k) {
  return k == Kind::Decode ? "decode" : k == Kind::Prefill ? "prefill" : "mixed";
}

struct Batch {
  std::vector<int32_t> qo_indptr{0};
  std::vector<int32_t> kv_lens;
  bool causal = true;
  int window_left = -1, window_right = -1;
  PlanBatch view() const {
    PlanBatch b;
    b.qo_indptr = qo_indptr;
    b.kv_lens = kv_lens;
    b.causal = causal;
    b.window_left = window_left;
    b.window_right = window_right;
    return b;
  }
  void add(int32_t qo, int32_t kv) {
    qo_indptr.push_back(qo_indptr.back() + qo);
    kv_lens.push_back(kv);
  }
  int num_tokens() const { return qo_indptr.back(); }
};

// KV lengths spread over 1..100k on a log scale, so short and very long requests both occur.
int32_t random_kv(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> e(0.0, 5.0);
  return std::max<int32_t>(1, static_cast<int32_t>(std::pow(10.0, e(rng))));
}

Batch random_batch(Kind kind, std::mt19937_64& rng, int max_reqs, int max_prefill_len) {
  Batch b;
  const int n = std::uniform_int_distribution<int>(1, max_reqs)(rng);
  for (int r = 0; r < n; ++r) {
    const int32_t kv = random_kv(rng);
    const bool decode = kind == Kind::Decode || (kind == Kind::Mixed && rng() % 2 == 0);
    int32_t qo;
    if (decode) {
      qo = rng() % 16 == 0 ? 0 : 1;  // a few empty (padding) requests
    } else {
      qo = std::uniform_int_distribution<int32_t>(1, std::min(kv, max_prefill_len))(rng);
    }
    b.add(qo, kv);
  }
  return b;
}

// The keys visible to query i of a request (docs/architecture.md section 4), as [lo, hi).
std::pair<int64_t, int64_t> visible_keys(const Batch& b, int64_t qo, int64_t kv, int64_t i) {
  const int64_t p = kv - qo + i;
  int64_t lo = 0, hi = kv;
  if (b.window_left >= 0) lo = std::max<int64_t>(0, p - b.window_left);
  if (b.causal) hi = std::min(hi, p + 1);
  else if (b.window_right >= 0) hi = std::min(hi, p + b.window_right + 1);
  return {lo, hi};
}

struct TileKey {
  int32_t request, tile;
  bool operator<(const TileKey& o) const { return std::tie(request, tile) < std::tie(o.request, o.tile); }
};

// Checks every invariant of `plan` for batch `b`; returns the ratio max load / ideal.
double check_plan(const Batch& b, const PlanBuffers& plan) {
  const PlanConfig& cfg = plan.config;
  const int g = cfg.group_size, tq = plan.tile_q;
  const int n = static_cast<int>(b.kv_lens.size());
  EXPECT_EQ(plan.num_reqs, n);
  EXPECT_EQ(plan.num_tokens, b.num_tokens());
  EXPECT_LE(plan.num_items, plan.capacity.max_items);
  EXPECT_LE(plan.num_partial_rows, plan.capacity.max_partial_rows);
  EXPECT_EQ(plan.split_kv, plan.num_partial_rows > 0);
  EXPECT_EQ(plan.kv_chunk_tokens % cfg.page_size, 0) << "chunks are whole pages";

  // Items grouped by tile.
  std::map<TileKey, std::vector<const WorkItem*>> by_tile;
  for (int i = 0; i < plan.num_items; ++i) {
    const WorkItem& it = plan.items[i];
    EXPECT_TRUE(it.request >= 0 && it.request < n) << "item " << i;
    if (it.request < 0 || it.request >= n) return 0;
    by_tile[{it.request, it.q_tile}].push_back(&it);
  }
  bool any_split = false;
  size_t expected_tiles = 0;
  std::vector<int64_t> tile_rows_of_item(plan.num_items);
  for (int r = 0; r < n; ++r) {
    const int64_t qo = b.qo_indptr[r + 1] - b.qo_indptr[r], kv = b.kv_lens[r];
    const int64_t packed = qo * g;
    const int64_t tiles = (packed + tq - 1) / tq;
    expected_tiles += tiles;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t row0 = t * tq, row1 = std::min(packed, row0 + tq);
      // Brute-force union of the tile's rows' visible keys (one interval: rows are monotone).
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int64_t row = row0; row < row1; ++row) {
        auto [l, h] = visible_keys(b, qo, kv, row / g);
        if (l < h) lo = std::min(lo, l), hi = std::max(hi, h);
      }
      auto found = by_tile.find({r, static_cast<int32_t>(t)});
      if (found == by_tile.end()) {
        ADD_FAILURE() << "request " << r << " tile " << t << " has no work item";
        continue;
      }
      auto items = found->second;
      std::sort(items.begin(), items.end(),
                [](const WorkItem* a, const WorkItem* c) { return a->kv_begin < c->kv_begin; });
      const int32_t nc = static_cast<int32_t>(items.size());
      // Exactly-once coverage: the chunks tile [lo, hi) with no gap and no overlap.
      EXPECT_EQ(items.front()->kv_begin, lo) << "request " << r << " tile " << t;
      EXPECT_EQ(items.back()->kv_end, hi) << "request " << r << " tile " << t;
      for (int32_t j = 0; j < nc; ++j) {
        const WorkItem& it = *items[j];
        if (j > 0) {
          EXPECT_EQ(it.kv_begin, items[j - 1]->kv_end) << "request " << r << " tile " << t << " chunk " << j;
        }
        EXPECT_LT(it.kv_begin, it.kv_end) << "empty chunk, request " << r << " tile " << t;
        EXPECT_LE(it.kv_end - it.kv_begin, plan.kv_chunk_tokens) << "chunk over the chunk size";
        EXPECT_EQ(it.chunk, j);
        EXPECT_EQ(it.num_chunks, nc);
        EXPECT_EQ(it.partial_base == -1, nc == 1);
        tile_rows_of_item[&it - plan.items.data()] = row1 - row0;
      }
      if (nc > 1) any_split = true;
      // Merge map: each packed row of a split tile owns its nc partials, contiguous.
      const int64_t global_row0 = int64_t{b.qo_indptr[r]} * g + row0;
      for (int64_t k = 0; k < row1 - row0; ++k) {
        const int64_t row = global_row0 + k;
        const int32_t m0 = plan.merge_indptr[row], m1 = plan.merge_indptr[row + 1];
        if (nc == 1) {
          EXPECT_EQ(m0, m1) << "unsplit row " << row << " must be written directly";
        } else {
          EXPECT_EQ(m1 - m0, nc) << "row " << row;
          EXPECT_EQ(m0, items[0]->partial_base + k * nc) << "row " << row;
        }
      }
    }
  }
  EXPECT_EQ(by_tile.size(), expected_tiles) << "items for tiles that do not exist";
  EXPECT_EQ(any_split, plan.split_kv);
  // The merge map is a CSR over all packed rows, ending at the partial row count.
  const int64_t rows = int64_t{b.num_tokens()} * g;
  EXPECT_EQ(plan.merge_indptr[0], 0);
  EXPECT_EQ(plan.merge_indptr[rows], plan.num_partial_rows);
  for (int64_t row = 0; row < rows; ++row)
    if (plan.merge_indptr[row] > plan.merge_indptr[row + 1]) {
      ADD_FAILURE() << "merge_indptr decreases at row " << row;
      break;
    }
  // Partials of a request form one contiguous block.
  for (int r = 0; r < n; ++r) {
    const int64_t a = int64_t{b.qo_indptr[r]} * g, e = int64_t{b.qo_indptr[r + 1]} * g;
    int64_t sum = 0;
    for (int64_t row = a; row < e; ++row) sum += plan.merge_indptr[row + 1] - plan.merge_indptr[row];
    EXPECT_EQ(plan.merge_indptr[e] - plan.merge_indptr[a], sum) << "request " << r;
  }

  // Slots: a permutation of the items, and balanced.
  const int S = cfg.num_slots;
  EXPECT_EQ(plan.slot_indptr[0], 0);
  EXPECT_EQ(plan.slot_indptr[S], plan.num_items);
  std::vector<int> seen(plan.num_items, 0);
  std::vector<int64_t> load(S, 0);
  int64_t total = 0, max_item = 0;
  for (int s = 0; s < S; ++s) {
    EXPECT_LE(plan.slot_indptr[s], plan.slot_indptr[s + 1]);
    for (int32_t k = plan.slot_indptr[s]; k < plan.slot_indptr[s + 1]; ++k) {
      const int32_t i = plan.slot_items[k];
      if (i < 0 || i >= plan.num_items) {
        ADD_FAILURE() << "slot " << s << " names item " << i;
        continue;
      }
      ++seen[i];
      const WorkItem& it = plan.items[i];
      const int64_t c = item_cost(it.kv_end - it.kv_begin, tile_rows_of_item[i]);
      load[s] += c;
      total += c;
      max_item = std::max(max_item, c);
    }
  }
  for (int i = 0; i < plan.num_items; ++i) EXPECT_EQ(seen[i], 1) << "item " << i << " run " << seen[i] << " times";
  if (total == 0) return 1.0;
  const double ideal = static_cast<double>(total) / S;
  const int64_t max_load = *std::max_element(load.begin(), load.end());
  EXPECT_LE(max_load, ideal + max_item + 1e-9) << "greedy list-scheduling bound";
  EXPECT_LE(max_load, 2 * ideal + plan.balance_slack() + 1e-9)
      << "balance bound: ideal " << ideal << ", slack " << plan.balance_slack() << ", chunk "
      << plan.kv_chunk_tokens << ", items " << plan.num_items << ", slots " << S;
  return max_load / ideal;
}

// ---- random batches ---------------------------------------------------------------------

struct GridCase {
  Kind kind;
  int page_size;
  int group;
  int head_size;
};

class PlanRandomTest : public ::testing::TestWithParam<GridCase> {};

TEST_P(PlanRandomTest, EveryInvariantHoldsOverSeeds) {
  const GridCase gc = GetParam();
  for (const int num_kv_heads : {1, 8, 32}) {
    for (const bool graph : {false, true}) {
      PlanConfig cfg;
      cfg.group_size = gc.group;
      cfg.num_kv_heads = num_kv_heads;
      cfg.head_size = gc.head_size;
      cfg.page_size = gc.page_size;
      cfg.num_slots = num_slots_for(132, num_kv_heads);
      cfg.kernel = gc.kind == Kind::Decode && gc.group == 1 ? PlanKernel::CudaCoreDecode
                                                            : PlanKernel::TensorCore;
      if (graph && cfg.kernel == PlanKernel::TensorCore) cfg.fixed_tile_q = cfg.max_tile_q();
      const int max_reqs = 48, max_prefill = 3000;
      PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, max_reqs, max_reqs * max_prefill));
      for (uint64_t seed = 0; seed < 12; ++seed) {
        std::mt19937_64 rng(seed * 7919 + gc.page_size + gc.group * 13 + num_kv_heads);
        Batch b = random_batch(gc.kind, rng, max_reqs, max_prefill);
        if (gc.kind != Kind::Decode && seed % 3 == 1) b.window_left = static_cast<int>(rng() % 5000);
        if (gc.kind == Kind::Prefill && seed % 3 == 2) {
          b.causal = false;
          if (seed % 2) b.window_right = static_cast<int>(rng() % 300);
        }
        SCOPED_TRACE(std::string(kind_name(gc.kind)) + " page " + std::to_string(gc.page_size) +
                     " group " + std::to_string(gc.group) + " kv_heads " +
                     std::to_string(num_kv_heads) + (graph ? " graph" : "") + " seed " +
                     std::to_string(seed) + " reqs " + std::to_string(b.kv_lens.size()));
        ASSERT_NO_THROW(plan_batch(b.view(), plan));
        check_plan(b, plan);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

std::vector<GridCase> grid() {
  std::vector<GridCase> g;
  for (Kind k : {Kind::Decode, Kind::Prefill, Kind::Mixed})
    for (int page : {16, 32, 64, 128, 256, 512, 1024})
      for (int group : {1, 4, 8}) g.push_back({k, page, group, page == 64 ? 256 : 128});
  return g;
}

INSTANTIATE_TEST_SUITE_P(Grid, PlanRandomTest, ::testing::ValuesIn(grid()),
                         [](const auto& info) {
                           return std::string(kind_name(info.param.kind)) + "_page" +
                                  std::to_string(info.param.page_size) + "_group" +
                                  std::to_string(info.param.group) + "_head" +
                                  std::to_string(info.param.head_size);
                         });

// ---- the chunk-size rule ----------------------------------------------------------------

PlanConfig tensor_core_config(int page, int slots, int group = 8, int head = 128) {
  PlanConfig cfg;
  cfg.group_size = group;
  cfg.num_kv_heads = 8;
  cfg.head_size = head;
  cfg.page_size = page;
  cfg.num_slots = slots;
  return cfg;
}

int64_t items_for_chunk(const PlanBuffers& plan, const Batch& b, int64_t chunk) {
  // Re-derive the item count for a chunk size: tiles times ceil(visible / chunk).
  int64_t items = 0;
  const int g = plan.config.group_size, tq = plan.tile_q;
  for (size_t r = 0; r < b.kv_lens.size(); ++r) {
    const int64_t qo = b.qo_indptr[r + 1] - b.qo_indptr[r], kv = b.kv_lens[r];
    for (int64_t row0 = 0; row0 < qo * g; row0 += tq) {
      const int64_t row1 = std::min(qo * g, row0 + tq);
      const int64_t lo = visible_keys(b, qo, kv, row0 / g).first;
      const int64_t hi = visible_keys(b, qo, kv, (row1 - 1) / g).second;
      items += std::max<int64_t>(1, (hi - lo + chunk - 1) / chunk);
    }
  }
  return items;
}

TEST(PlanChunk, SmallestChunkThatFitsOneWaveOrTheBalanceChunk) {
  for (int page : {16, 64, 256, 1024}) {
    for (int slots : {8, 33, 264}) {
      PlanConfig cfg = tensor_core_config(page, slots);
      PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 64, 64 * 2000));
      for (uint64_t seed = 0; seed < 20; ++seed) {
        std::mt19937_64 rng(seed + page * 31 + slots);
        const Batch b = random_batch(seed % 2 ? Kind::Decode : Kind::Mixed, rng, 64, 2000);
        plan_batch(b.view(), plan);
        SCOPED_TRACE("page " + std::to_string(page) + " slots " + std::to_string(slots) +
                     " seed " + std::to_string(seed));
        const int64_t c = plan.kv_chunk_tokens, cmin = cfg.min_chunk_tokens();
        EXPECT_EQ(items_for_chunk(plan, b, c), plan.num_items);
        if (plan.num_items <= slots) {
          // One wave: no smaller chunk (>= the minimum) would still fit.
          if (c > cmin && plan.split_kv) {
            EXPECT_GT(items_for_chunk(plan, b, c - page), slots) << "chunk " << c << " not minimal";
          }
        } else if (plan.split_kv) {
          // More items than slots: the balance chunk, ceil(W / slots) in whole pages.
          int64_t w = 0;
          for (int i = 0; i < plan.num_items; ++i) w += plan.items[i].kv_end - plan.items[i].kv_begin;
          const int64_t pages = std::max<int64_t>(cmin / page, (w + int64_t{slots} * page - 1) / (int64_t{slots} * page));
          EXPECT_EQ(c, pages * page);
        }
      }
    }
  }
}

TEST(PlanChunk, OneLongDecodeIsSplitToFillTheSlots) {
  for (int page : {16, 128, 1024}) {
    PlanConfig cfg = tensor_core_config(page, 264);
    PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 4, 4));
    Batch b;
    b.add(1, 100000);
    plan_batch(b.view(), plan);
    check_plan(b, plan);
    EXPECT_TRUE(plan.split_kv);
    EXPECT_LE(plan.num_items, 264);
    // Smallest chunk fitting 264 slots: ceil(100000 / c) <= 264 -> c >= 379 tokens, in pages.
    const int64_t want = std::max<int64_t>(cfg.min_chunk_tokens(), (379 + page - 1) / page * page);
    EXPECT_EQ(plan.kv_chunk_tokens, want) << "page " << page;
  }
}

// Key counts at int32's limit (the plan's tiles and divisions are 32-bit): a decode and a
// prefill request of 2^31 - 1 keys each, a padding request, on 264 slots and on one (where the
// chunk that fits is whole ranges rounded up to pages, past 2^31 - 1 tokens).
TEST(PlanChunk, KeyCountsAtTheInt32Limit) {
  constexpr int32_t kMaxKeys = std::numeric_limits<int32_t>::max();
  for (int slots : {264, 1}) {
    for (int page : {16, 1024}) {
      PlanConfig cfg = tensor_core_config(page, slots);
      PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 4, 4096));
      Batch b;
      b.add(1, kMaxKeys);
      b.add(2048, kMaxKeys);
      b.add(0, kMaxKeys);
      plan_batch(b.view(), plan);
      check_plan(b, plan);
      EXPECT_EQ(plan.split_kv, slots > 1) << "slots " << slots << ", page " << page;
      if (slots == 1) {
        EXPECT_GT(plan.kv_chunk_tokens, int64_t{kMaxKeys}) << "page " << page;
      }
    }
  }
}

TEST(PlanChunk, SkewedBatchSplitsTheLongRequestInsteadOfOneSlotDoingItAlone) {
  // 263 one-token decodes fill all but one slot; FlashInfer's one-wave rule would leave the
  // 100k request whole on one CTA. The balance chunk splits it.
  PlanConfig cfg = tensor_core_config(16, 264);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 264, 264));
  Batch b;
  for (int r = 0; r < 263; ++r) b.add(1, 1);
  b.add(1, 100000);
  plan_batch(b.view(), plan);
  const double ratio = check_plan(b, plan);
  EXPECT_TRUE(plan.split_kv);
  EXPECT_LT(ratio, 2.0);
}

TEST(PlanChunk, ShortRequestsAreNeverSplitBelowTheMinimumChunk) {
  for (int page : {16, 32, 64, 128, 256}) {
    PlanConfig cfg = tensor_core_config(page, 264);
    PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 8, 8));
    Batch b;
    b.add(1, 200);
    plan_batch(b.view(), plan);
    check_plan(b, plan);
    EXPECT_GE(plan.kv_chunk_tokens, std::min<int64_t>(cfg.min_chunk_tokens(), 200))
        << "page " << page;
    EXPECT_EQ(plan.kv_chunk_tokens % page, 0);
  }
}

// ---- the query tile ---------------------------------------------------------------------

TEST(PlanTile, CtaTileFollowsAveragePackedLengthAndHeadSize) {
  struct Row { double avg; int head; int tile; };
  const Row rows[] = {{0, 128, 16},    {1, 128, 16},    {16, 128, 16},  {16.5, 128, 64},
                      {64, 128, 64},   {64.5, 128, 128}, {4096, 128, 128}, {64.5, 256, 64},
                      {4096, 256, 64}, {8, 256, 16},     {100, 64, 128}};
  for (const Row& r : rows)
    EXPECT_EQ(cta_tile_q(r.avg, r.head), r.tile) << "avg " << r.avg << " head " << r.head;
}

TEST(PlanTile, PaddingRequestsDoNotShrinkTheTileAndGraphModeFixesIt) {
  PlanConfig cfg = tensor_core_config(16, 132, /*group=*/1);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 8, 4096));
  Batch b;
  b.add(100, 1000);
  for (int r = 0; r < 6; ++r) b.add(0, 0);
  plan_batch(b.view(), plan);
  EXPECT_EQ(plan.tile_q, 128);
  check_plan(b, plan);
  cfg.fixed_tile_q = 128;
  PlanBuffers fixed(cfg, PlanCapacity::for_limits(cfg, 8, 4096));
  Batch d;
  d.add(1, 50);
  plan_batch(d.view(), fixed);
  EXPECT_EQ(fixed.tile_q, 128);
  check_plan(d, fixed);
}

// ---- fixed capacity ---------------------------------------------------------------------

TEST(PlanCapacityTest, ReplanningNeverReallocates) {
  PlanConfig cfg = tensor_core_config(16, 33, 4);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 32, 32 * 1000));
  const auto* items = plan.items.data();
  const auto* slots = plan.slot_items.data();
  const auto* merge = plan.merge_indptr.data();
  const size_t sizes[] = {plan.items.size(), plan.slot_items.size(), plan.merge_indptr.size(),
                          plan.slot_indptr.size()};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 30; ++i) {
    const Batch b = random_batch(static_cast<Kind>(i % 3), rng, 32, 1000);
    plan_batch(b.view(), plan);
    check_plan(b, plan);
  }
  EXPECT_EQ(plan.items.data(), items);
  EXPECT_EQ(plan.slot_items.data(), slots);
  EXPECT_EQ(plan.merge_indptr.data(), merge);
  const size_t after[] = {plan.items.size(), plan.slot_items.size(), plan.merge_indptr.size(),
                          plan.slot_indptr.size()};
  EXPECT_TRUE(std::equal(std::begin(sizes), std::end(sizes), std::begin(after)));
  EXPECT_EQ(plan.workspace_bytes(), static_cast<size_t>(plan.capacity.max_partial_rows) * 8 * 129 * 4);
}

TEST(PlanCapacityTest, OverflowIsAnErrorAndKeepsThePreviousPlan) {
  PlanConfig cfg = tensor_core_config(16, 33, 4);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 4, 64));
  Batch ok;
  ok.add(1, 5000);
  ok.add(3, 10);
  plan_batch(ok.view(), plan);
  const int items = plan.num_items;
  const int64_t chunk = plan.kv_chunk_tokens;

  Batch too_many;
  for (int r = 0; r < 5; ++r) too_many.add(1, 10);
  EXPECT_TRUE(test::throws_error_with([&] { plan_batch(too_many.view(), plan); }, {"max_reqs = 4"}));
  Batch too_long;
  too_long.add(65, 100);
  EXPECT_TRUE(test::throws_error_with([&] { plan_batch(too_long.view(), plan); }, {"max_tokens = 64"}));
  EXPECT_EQ(plan.num_items, items);
  EXPECT_EQ(plan.kv_chunk_tokens, chunk);
  check_plan(ok, plan);

  PlanCapacity small = PlanCapacity::for_limits(cfg, 4, 64);
  small.max_items = 3;
  PlanBuffers few(cfg, small);
  EXPECT_TRUE(test::throws_error_with([&] { plan_batch(ok.view(), few); }, {"max_items = 3"}));
  small = PlanCapacity::for_limits(cfg, 4, 64);
  small.max_partial_rows = 2;
  PlanBuffers narrow(cfg, small);
  EXPECT_TRUE(test::throws_error_with([&] { plan_batch(ok.view(), narrow); }, {"max_partial_rows = 2"}));
}

TEST(PlanCapacityTest, CapacitiesDerivedFromLimitsHoldForExtremeBatches) {
  // The worst cases of the derivation in plan.cpp: every request a one-token decode with a
  // long KV (items), and long prefills over long KV (partial rows), at every slot count.
  for (int slots : {1, 7, 264}) {
    for (int group : {1, 8}) {
      PlanConfig cfg = tensor_core_config(16, slots, group);
      const int reqs = 64, tokens = 64 * 512;
      PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, reqs, tokens));
      Batch decodes, prefills, mixed;
      for (int r = 0; r < reqs; ++r) decodes.add(1, 100000);
      for (int r = 0; r < reqs; ++r) prefills.add(512, 100000);
      for (int r = 0; r < reqs; ++r) mixed.add(r % 2 ? 1 : 1023, r % 2 ? 99999 : 1023);
      for (const Batch* b : {&decodes, &prefills, &mixed}) {
        if (b->num_tokens() > tokens) continue;
        ASSERT_NO_THROW(plan_batch(b->view(), plan)) << "slots " << slots << " group " << group;
        check_plan(*b, plan);
      }
    }
  }
}

// ---- bad input --------------------------------------------------------------------------

TEST(PlanErrors, BadBatchesNameTheValue) {
  PlanConfig cfg = tensor_core_config(16, 33, 1);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 8, 256));
  struct Case { std::vector<int32_t> qo, kv; int wl; const char* needle; };
  const Case cases[] = {
      {{0, 1}, {5, 5}, -1, "qo_indptr.size()"},
      {{1, 2}, {5}, -1, "qo_indptr[0]"},
      {{0, 3, 2}, {5, 5}, -1, "qo_indptr[2]"},
      {{0, 4}, {3}, -1, "kv_lens[0] = 3"},
      {{0, 1}, {-1}, -1, "kv_lens[0] = -1"},
      {{0, 1}, {4}, -2, "window_left = -2"},
  };
  for (const Case& c : cases) {
    PlanBatch b;
    b.qo_indptr = c.qo;
    b.kv_lens = c.kv;
    b.window_left = c.wl;
    EXPECT_TRUE(test::throws_error_with([&] { plan_batch(b, plan); }, {c.needle}));
  }
  PlanConfig dc = cfg;
  dc.kernel = PlanKernel::CudaCoreDecode;
  PlanBuffers decode(dc, PlanCapacity::for_limits(dc, 8, 8));
  Batch two;
  two.add(2, 10);
  EXPECT_TRUE(test::throws_error_with([&] { plan_batch(two.view(), decode); }, {"CUDA-core decode"}));
  PlanConfig bad = cfg;
  bad.num_slots = 0;
  EXPECT_TRUE(test::throws_error_with([&] { PlanBuffers p(bad, PlanCapacity{}); }, {"num_slots = 0"}));
  bad = cfg;
  bad.page_size = 0;
  EXPECT_TRUE(test::throws_error_with([&] { PlanCapacity::for_limits(bad, 1, 1); }, {"page_size = 0"}));
  EXPECT_TRUE(test::throws_error_with([&] { num_slots_for(0, 8); }, {"num_sms = 0"}));
}

TEST(PlanErrors, EmptyBatchPlansNothing) {
  PlanConfig cfg = tensor_core_config(16, 33);
  PlanBuffers plan(cfg, PlanCapacity::for_limits(cfg, 4, 16));
  Batch empty;
  plan_batch(empty.view(), plan);
  EXPECT_EQ(plan.num_items, 0);
  EXPECT_EQ(plan.num_partial_rows, 0);
  EXPECT_EQ(plan.slot_indptr[cfg.num_slots], 0);
  Batch padding;
  padding.add(0, 0);
  padding.add(0, 7);
  plan_batch(padding.view(), plan);
  EXPECT_EQ(plan.num_items, 0);
  check_plan(padding, plan);
}

}  // namespace
}  // namespace attnkit::flashinfer
