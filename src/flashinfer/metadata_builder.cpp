#include "flashinfer/metadata_builder.h"

#include <algorithm>
#include <string>
#include <utility>

#include "attnkit/error.h"
#include "core/backend_checks.h"
#include "flash_attn/tile_set.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/gpu_planned.h"

namespace attnkit::flashinfer {

namespace {

constexpr std::string_view kWhere = "flashinfer builder";

PlanConfig part_config(const AttentionConfig& cfg, int num_sms, bool decode, bool cuda_graph) {
  PlanConfig p;
  p.num_kv_heads = cfg.num_kv_heads;
  p.group_size = group_size(cfg);
  p.head_size = cfg.head_size;
  p.page_size = cfg.block_size;
  p.num_slots = num_slots_for(num_sms, cfg.num_kv_heads);
  p.kernel = decode && !decode_uses_tensor_cores(p.group_size) ? PlanKernel::CudaCoreDecode
                                                                : PlanKernel::TensorCore;
  // One tile per part whatever the batch, for decodes always (a forward captured in a CUDA
  // graph replays the builder's later plans: the tile is a launch parameter), for prefills in
  // CUDA-graph mode or over an NVFP4 cache. Decodes pack one token's group, which is what every
  // decode batch picks anyway; prefills take the largest tile (a long prompt must fit, as
  // FlashInfer sizes its graph tile for the worst single request), NVFP4 prefills the smallest
  // (the decode tile is the one that reads NVFP4: flash_attn/tile_set.h).
  const bool nvfp4 = cfg.cache_dtype == DType::nvfp4;
  if (p.kernel == PlanKernel::TensorCore && (decode || cuda_graph || nvfp4))
    p.fixed_tile_q = decode ? cta_tile_q(p.group_size, p.head_size) : nvfp4 ? kTileQSmall : p.max_tile_q();
  return p;
}

}  // namespace

int decode_query_len(const AttentionConfig& cfg) {
  const int g = group_size(cfg);
  return g > 0 && decode_uses_tensor_cores(g) ? std::max(1, flash_attn::kDecodeTileRows / g) : 1;
}

// A part's plan configuration and capacity under `limits` (the decode part: at most
// decode_query_len tokens per request).
static std::pair<PlanConfig, PlanCapacity> part_shape(const AttentionConfig& cfg, const BuilderLimits& limits, bool decode) {
  const int sms = limits.num_sms > 0 ? limits.num_sms : cfg.device.sms_or_default();
  const PlanConfig pc = part_config(cfg, sms, decode, limits.cuda_graph);
  const int tokens = decode ? static_cast<int>(std::min<int64_t>(int64_t{limits.max_reqs} * decode_query_len(cfg),
                                                                 limits.max_tokens))
                            : limits.max_tokens;
  return {pc, PlanCapacity::for_limits(pc, limits.max_reqs, tokens)};
}

namespace {
// A part's device copy (a multiple of 16 bytes: the decode part's, first, leaves the prefill
// part's 16-byte aligned).
size_t device_part_bytes(const PlanBuffers& plan, const PageTable& pages) {
  return DevicePlanLayout(plan.capacity, plan.config.group_size, pages.max_pages()).bytes();
}
}  // namespace

void PlanState::stage_device_copies() const {
  if (device) device->stage(decode_plan, decode_pages, decode_batch());
  if (prefill_device) prefill_device->stage(prefill_plan, prefill_pages, prefill_batch());
}

size_t FlashInferMetadataBuilder::device_buffer_bytes() const {
  const PlanState& s = *state_;
  return device_part_bytes(s.decode_plan, s.decode_pages) + device_part_bytes(s.prefill_plan, s.prefill_pages);
}

void FlashInferMetadataBuilder::set_device_buffer(void* device_ptr, size_t bytes) {
  constexpr std::string_view where = "flashinfer set_device_buffer";
  const size_t need = device_buffer_bytes();
  ATTNKIT_REQUIRE(device_ptr != nullptr, where, "device_ptr", "null",
                  "must be a device buffer of device_buffer_bytes() = " + std::to_string(need) + " bytes");
  ATTNKIT_REQUIRE(reinterpret_cast<uintptr_t>(device_ptr) % 16 == 0, where, "device_ptr",
                  reinterpret_cast<uintptr_t>(device_ptr), "must be 16-byte aligned");
  ATTNKIT_REQUIRE(bytes >= need, where, "bytes", bytes,
                  "must be >= device_buffer_bytes() = " + std::to_string(need) + " (the plans' device copies)");
  PlanState& s = *state_;
  const size_t decode_bytes = device_part_bytes(s.decode_plan, s.decode_pages);
  s.device = std::make_unique<DevicePlan>(s.decode_plan.capacity, s.decode_plan.config.group_size,
                                          s.decode_pages.max_pages(), device_ptr, decode_bytes);
  s.prefill_device = std::make_unique<DevicePlan>(s.prefill_plan.capacity, s.prefill_plan.config.group_size,
                                                  s.prefill_pages.max_pages(),
                                                  static_cast<char*>(device_ptr) + decode_bytes, bytes - decode_bytes);
  if (s.generation > 0) s.stage_device_copies();  // (the current metadata's plans: its next forward copies them)
}

size_t plan_workspace_bytes(const AttentionConfig& cfg, const BuilderLimits& limits, int64_t max_tokens) {
  ATTNKIT_REQUIRE(max_tokens >= 0, "flashinfer workspace_bytes", "max_tokens", max_tokens, "must be >= 0");
  BuilderLimits l = limits;
  l.max_tokens = static_cast<int>(std::min<int64_t>(max_tokens, limits.max_tokens));
  if (l.max_tokens == 0) return 0;
  size_t bytes = 0;
  for (bool decode : {true, false}) {
    const auto [pc, cap] = part_shape(cfg, l, decode);
    bytes = std::max(bytes, PlanBuffers::workspace_bytes_for(pc, cap));
  }
  return bytes;
}

FlashInferMetadataBuilder::FlashInferMetadataBuilder(const AttentionConfig& cfg,
                                                     const BuilderLimits& limits)
    : cfg_(cfg), limits_(limits), decode_len_(decode_query_len(cfg)), state_(std::make_shared<PlanState>()) {
  ATTNKIT_REQUIRE(group_size(cfg) > 0, kWhere, "num_heads / num_kv_heads",
                  std::to_string(cfg.num_heads) + " / " + std::to_string(cfg.num_kv_heads),
                  "both must be > 0 and num_heads a multiple of num_kv_heads");
  const auto sizes = block_sizes_for(cfg);
  if (std::find(sizes.begin(), sizes.end(), cfg.block_size) == sizes.end()) {
    std::string list;
    for (int s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
    fail(kWhere, "block_size", cfg.block_size,
         "must be one of " + list + " for this configuration (see flashinfer check())");
  }
  ATTNKIT_REQUIRE(limits.max_reqs > 0, kWhere, "limits.max_reqs", limits.max_reqs, "must be > 0");
  ATTNKIT_REQUIRE(limits.max_tokens > 0, kWhere, "limits.max_tokens", limits.max_tokens, "must be > 0");
  ATTNKIT_REQUIRE(limits.max_seq_len > 0, kWhere, "limits.max_seq_len", limits.max_seq_len, "must be > 0");
  ATTNKIT_REQUIRE(limits.num_sms >= 0, kWhere, "limits.num_sms", limits.num_sms, "must be >= 0 (0 = the device's)");
  ATTNKIT_REQUIRE(limits.window_left >= -1, kWhere, "limits.window_left", limits.window_left, "must be >= -1");
  ATTNKIT_REQUIRE(limits.window_right >= -1, kWhere, "limits.window_right", limits.window_right, "must be >= -1");
  const int64_t pages = int64_t{limits.max_reqs} *
                        ((int64_t{limits.max_seq_len} + cfg.block_size - 1) / cfg.block_size);
  PlanState& s = *state_;
  s.decode_pages = PageTable(limits.max_reqs, pages);
  s.prefill_pages = PageTable(limits.max_reqs, pages);
  const auto [dc, dcap] = part_shape(cfg, limits, /*decode=*/true);
  const auto [pc, pcap] = part_shape(cfg, limits, /*decode=*/false);
  s.decode_plan = PlanBuffers(dc, dcap);
  s.prefill_plan = PlanBuffers(pc, pcap);
  s.prefill_qo_indptr.assign(static_cast<size_t>(limits.max_reqs) + 1, 0);
  s.decode_qo_indptr.assign(static_cast<size_t>(limits.max_reqs) + 1, 0);
  s.decode_kv_lens.assign(static_cast<size_t>(limits.max_reqs), 0);
  s.prefill_kv_lens.assign(static_cast<size_t>(limits.max_reqs), 0);
  s.decode_window_left = limits.window_left;
  s.decode_window_right = limits.window_right;
}

std::unique_ptr<BackendMetadata> FlashInferMetadataBuilder::build(const CommonAttentionMetadata& common) {
  // Block ids are checked against the cache by the impl (the builder does not know its size).
  validate_for_builder(common, cfg_.block_size, kWhere);
  require_no_dcp(common, kWhere,
                 "the FlashInfer-style plans need every request's keys to cover its queries, which a rank's "
                 "shard may not (the reference backend runs any shard; flash_attn the ones whose queries see "
                 "all of the rank's keys)");
  ATTNKIT_REQUIRE(common.num_reqs <= limits_.max_reqs, kWhere, "num_reqs", common.num_reqs,
                  "must be <= the builder's max_reqs = " + std::to_string(limits_.max_reqs));
  ATTNKIT_REQUIRE(common.num_actual_tokens <= limits_.max_tokens, kWhere, "num_actual_tokens",
                  common.num_actual_tokens,
                  "must be <= the builder's max_tokens = " + std::to_string(limits_.max_tokens));
  ATTNKIT_REQUIRE(common.max_seq_len <= limits_.max_seq_len, kWhere, "max_seq_len",
                  common.max_seq_len,
                  "must be <= the builder's max_seq_len = " + std::to_string(limits_.max_seq_len) +
                      " (its page tables are sized for it)");
  DecodePrefillSplit split;
  if (common.causal) {
    split = split_decodes_and_prefills(common, reorder_batch_threshold());
  } else {
    split.num_prefills = common.num_reqs;
    split.num_prefill_tokens = common.num_actual_tokens;
  }
  const int nd = split.num_decodes, n = common.num_reqs;
  const BatchView batch = common.batch();
  PlanState& s = *state_;
  // Nothing is kept from a build that throws half way: the generation still moves on, so
  // metadata of the previous build cannot be used with partly rewritten buffers.
  ++s.generation;
  s.decode_pages.fill(batch, 0, nd, cfg_.block_size);
  s.prefill_pages.fill(batch, nd, n, cfg_.block_size);

  std::copy(common.query_start_loc.begin(), common.query_start_loc.begin() + nd + 1, s.decode_qo_indptr.begin());
  std::copy(common.seq_lens.begin(), common.seq_lens.begin() + nd, s.decode_kv_lens.begin());
  PlanBatch decode;
  decode.qo_indptr = std::span<const int32_t>(s.decode_qo_indptr.data(), nd + 1);
  decode.kv_lens = std::span<const int32_t>(s.decode_kv_lens.data(), nd);
  decode.causal = true;
  decode.window_left = limits_.window_left;
  decode.window_right = limits_.window_right;
  plan_batch(decode, s.decode_plan);

  const int32_t base = common.query_start_loc[nd];
  for (int r = nd; r <= n; ++r) s.prefill_qo_indptr[r - nd] = common.query_start_loc[r] - base;
  std::copy(common.seq_lens.begin() + nd, common.seq_lens.begin() + n, s.prefill_kv_lens.begin());
  s.prefill_causal = common.causal;
  PlanBatch prefill = decode;
  prefill.qo_indptr = std::span<const int32_t>(s.prefill_qo_indptr.data(), n - nd + 1);
  prefill.kv_lens = std::span<const int32_t>(s.prefill_kv_lens.data(), n - nd);
  prefill.causal = common.causal;
  plan_batch(prefill, s.prefill_plan);
  s.stage_device_copies();  // (GPU: DevicePlan::stage, host only)

  auto md = std::make_unique<FlashInferMetadata>();
  md->num_reqs = n;
  md->num_actual_tokens = common.num_actual_tokens;
  md->num_decodes = nd;
  md->num_prefills = split.num_prefills;
  md->num_decode_tokens = split.num_decode_tokens;
  md->num_prefill_tokens = split.num_prefill_tokens;
  md->causal = common.causal;
  md->window_left = limits_.window_left;
  md->window_right = limits_.window_right;
  md->state = state_;
  md->generation = s.generation;
  return md;
}

}  // namespace attnkit::flashinfer
