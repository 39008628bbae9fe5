#include "cli/serving_sim.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"

namespace attnkit::cli {

namespace {
constexpr const char* kWhere = "ServingSim";

const SimConfig& validated(const SimConfig& c) {
  ATTNKIT_REQUIRE(c.block_size > 0 && c.block_size % 16 == 0, kWhere, "block_size",
                  c.block_size, "must be a positive multiple of 16");
  ATTNKIT_REQUIRE(c.max_batch_tokens > 0, kWhere, "max_batch_tokens", c.max_batch_tokens,
                  "must be > 0");
  ATTNKIT_REQUIRE(c.prefill_chunk > 0, kWhere, "prefill_chunk", c.prefill_chunk, "must be > 0");
  ATTNKIT_REQUIRE(c.max_running > 0, kWhere, "max_running", c.max_running, "must be > 0");
  ATTNKIT_REQUIRE(c.min_prompt > 0 && c.min_prompt <= c.max_prompt, kWhere, "min_prompt",
                  c.min_prompt, "must be in [1, max_prompt]");
  ATTNKIT_REQUIRE(c.min_output > 0 && c.min_output <= c.max_output, kWhere, "min_output",
                  c.min_output, "must be in [1, max_output]");
  // The longest request must fit in the cache alone, or admission would wait forever.
  const int64_t need = (c.max_prompt + c.max_output - 1 + c.block_size - 1) / c.block_size;
  ATTNKIT_REQUIRE(c.num_blocks >= need, kWhere, "num_blocks", c.num_blocks,
                  "must hold the longest request: >= " + std::to_string(need) + " blocks");
  return c;
}
}  // namespace

BlockAllocator::BlockAllocator(int num_blocks, uint64_t seed) : num_blocks_(num_blocks) {
  ATTNKIT_REQUIRE(num_blocks > 0, "BlockAllocator", "num_blocks", num_blocks, "must be > 0");
  free_.resize(num_blocks);
  std::iota(free_.begin(), free_.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(free_.begin(), free_.end(), rng);
}

int32_t BlockAllocator::allocate() {
  ATTNKIT_REQUIRE(!free_.empty(), "BlockAllocator::allocate", "free blocks", 0,
                  "the cache is full (admission should have prevented this)");
  const int32_t id = free_.back();
  free_.pop_back();
  return id;
}

void BlockAllocator::release(std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    ATTNKIT_REQUIRE(id >= 0 && id < num_blocks_, "BlockAllocator::release", "block id", id,
                    "must be in [0, " + std::to_string(num_blocks_) + ")");
    free_.push_back(id);
  }
  ATTNKIT_REQUIRE(num_free() <= num_blocks_, "BlockAllocator::release", "free blocks",
                  num_free(), "a block was released twice");
  ids.clear();
}

ServingSim::ServingSim(const SimConfig& cfg)
    : cfg_(validated(cfg)), rng_(cfg.seed), alloc_(cfg.num_blocks, cfg.seed ^ 0x5eed) {
  for (int i = 0; i < cfg_.initial_requests; ++i) arrive();
}

void ServingSim::arrive() {
  SimRequest r;
  r.id = next_id_++;
  r.prompt_len = std::uniform_int_distribution<int>(cfg_.min_prompt, cfg_.max_prompt)(rng_);
  r.output_len = std::uniform_int_distribution<int>(cfg_.min_output, cfg_.max_output)(rng_);
  waiting_.push_back(std::move(r));
}

// FIFO admission: a request joins only when the free blocks cover its whole lifetime on top
// of what the running requests will still claim, so a running request never runs short.
void ServingSim::admit() {
  int owed = 0;
  for (const SimRequest& r : running_)
    owed += blocks_for(r.max_kv_len()) - static_cast<int>(r.blocks.size());
  while (!waiting_.empty() && static_cast<int>(running_.size()) < cfg_.max_running) {
    const int need = blocks_for(waiting_.front().max_kv_len());
    if (alloc_.num_free() - owed < need) break;
    owed += need;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

SimRequest& ServingSim::find(int id) {
  for (SimRequest& r : running_)
    if (r.id == id) return r;
  fail(kWhere, "request id", id, "is not running");
}

StepPlan ServingSim::plan_step() {
  if (step_ > 0 && std::bernoulli_distribution(cfg_.arrival_prob)(rng_)) arrive();
  admit();

  StepPlan plan;
  plan.step = step_;
  int budget = cfg_.max_batch_tokens;
  for (const SimRequest& r : running_) {  // decodes first: one token each
    if (!r.prefill_done() || budget == 0) continue;
    plan.requests.push_back({r.id, 1, r.num_computed});
    --budget;
  }
  for (const SimRequest& r : running_) {  // then prompt chunks in admission order
    if (r.prefill_done() || budget == 0) continue;
    const int chunk = std::min({cfg_.prefill_chunk, r.prompt_len - r.num_computed, budget});
    plan.requests.push_back({r.id, chunk, r.num_computed});
    budget -= chunk;
  }
  // A one-token prompt chunk is a decode to the backends: it goes with the decodes.
  std::stable_partition(plan.requests.begin(), plan.requests.end(),
                        [](const ScheduledRequest& s) { return s.query_len <= kDecodeThreshold; });

  CommonAttentionMetadata& md = plan.metadata;
  md.causal = true;
  md.query_start_loc.assign(1, 0);
  int max_blocks = 1;
  for (const ScheduledRequest& s : plan.requests)
    max_blocks = std::max(max_blocks, blocks_for(s.context_len + s.query_len));
  md.max_blocks_per_req = max_blocks;
  for (const ScheduledRequest& s : plan.requests) {
    SimRequest& r = find(s.request_id);
    const int seq_len = s.context_len + s.query_len;
    while (static_cast<int>(r.blocks.size()) < blocks_for(seq_len))
      r.blocks.push_back(alloc_.allocate());
    md.query_start_loc.push_back(md.query_start_loc.back() + s.query_len);
    md.seq_lens.push_back(seq_len);
    std::vector<int32_t> row(max_blocks, 0);
    std::copy(r.blocks.begin(), r.blocks.end(), row.begin());
    md.block_table.insert(md.block_table.end(), row.begin(), row.end());
    for (int pos = s.context_len; pos < seq_len; ++pos)
      md.slot_mapping.push_back(slot_of(r.blocks.data(), cfg_.block_size, pos));
    (s.query_len <= kDecodeThreshold ? plan.num_decodes : plan.num_prefills) += 1;
    plan.num_tokens += s.query_len;
    plan.kv_tokens_read += seq_len;
  }
  md.finalize();
  plan.running = static_cast<int>(running_.size());
  plan.waiting = static_cast<int>(waiting_.size());
  plan.free_blocks = alloc_.num_free();
  return plan;
}

void ServingSim::finish_step(const StepPlan& plan) {
  ATTNKIT_REQUIRE(plan.step == step_, kWhere, "plan.step", plan.step,
                  "must be the step just planned (" + std::to_string(step_) + ")");
  for (const ScheduledRequest& s : plan.requests) {
    SimRequest& r = find(s.request_id);
    r.num_computed += s.query_len;
    if (r.prefill_done()) ++r.num_generated;  // a decode, or the prompt's last chunk
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->num_generated >= it->output_len) {
      alloc_.release(it->blocks);
      ++finished_;
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  ++step_;
}

}  // namespace attnkit::cli
