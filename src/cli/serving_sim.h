// A tiny continuous-batching engine for the demo (and later the GPU backends): requests arrive,
// are admitted while KV blocks last, prefill in chunks under a per-step token budget, decode one
// token per step and free their blocks when done. Each step is planned as the batch metadata
// an engine would hand to an attention backend. No attention runs here.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "attnkit/metadata.h"

namespace attnkit::cli {

// Hands out KV-cache block ids and takes them back. The free list starts shuffled so block
// tables are non-contiguous, as they are in an engine after some churn.
class BlockAllocator {
 public:
  BlockAllocator(int num_blocks, uint64_t seed);
  int num_blocks() const { return num_blocks_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int32_t allocate();                      // Error when none is free
  void release(std::vector<int32_t>& ids);  // returns every id and clears `ids`

 private:
  int num_blocks_;
  std::vector<int32_t> free_;
};

struct SimConfig {
  int block_size = 16;
  int num_blocks = 128;
  int max_batch_tokens = 128;  // token budget per step (decodes first, then prefill chunks)
  int prefill_chunk = 64;      // most prompt tokens of one request per step
  int max_running = 12;
  int min_prompt = 32, max_prompt = 256;
  int min_output = 2, max_output = 24;  // generated tokens per request
  int initial_requests = 4;
  double arrival_prob = 0.7;  // chance that one new request arrives per step
  uint64_t seed = 0;
};

struct SimRequest {
  int id = 0;
  int prompt_len = 0, output_len = 0;
  int num_computed = 0;   // tokens whose K/V are in the cache
  int num_generated = 0;  // output tokens produced so far
  std::vector<int32_t> blocks;
  bool prefill_done() const { return num_computed >= prompt_len; }
  int max_kv_len() const { return prompt_len + output_len - 1; }  // the last token is never fed
};

struct ScheduledRequest {
  int request_id = 0;
  int query_len = 0;    // new tokens this step
  int context_len = 0;  // tokens already cached
};

// A step's request counts the way engines count them (docs/architecture.md section 3): a decode is a
// request with query_len <= this, even the one-token last chunk of a prompt.
inline constexpr int kDecodeThreshold = 1;

struct StepPlan {
  int step = 0;
  std::vector<ScheduledRequest> requests;  // decodes first (stable), then prefills
  CommonAttentionMetadata metadata;        // host arrays, finalized (causal)
  int num_decodes = 0, num_prefills = 0;
  int num_tokens = 0;
  int64_t kv_tokens_read = 0;  // sum of seq_lens: the keys the step's attention reads
  int running = 0, waiting = 0, free_blocks = 0;
};

class ServingSim {
 public:
  explicit ServingSim(const SimConfig& cfg);
  const SimConfig& config() const { return cfg_; }
  // Admits arrivals, schedules the step and allocates the blocks its new tokens need.
  StepPlan plan_step();
  // Advances every scheduled request by its tokens and frees the blocks of finished ones.
  void finish_step(const StepPlan& plan);
  int finished() const { return finished_; }

 private:
  int blocks_for(int tokens) const { return (tokens + cfg_.block_size - 1) / cfg_.block_size; }
  void arrive();
  void admit();
  SimRequest& find(int id);

  SimConfig cfg_;
  std::mt19937_64 rng_;
  BlockAllocator alloc_;
  std::deque<SimRequest> waiting_;
  std::vector<SimRequest> running_;  // in admission order
  int next_id_ = 0, step_ = 0, finished_ = 0;
};

}  // namespace attnkit::cli
