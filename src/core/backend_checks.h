// Checks every backend's builder and impl share: batch metadata as a builder sees it, the
// cache tensor as an impl sees it, and per-call parameters against the declared features.
#pragma once
#include <string_view>

#include "attnkit/backend.h"

namespace attnkit {

// Full metadata validation for a builder, which does not know the cache's block count yet:
// every block id only has to be a valid int32; the impl later checks max_block_id_read
// against the cache it is given.
void validate_for_builder(const CommonAttentionMetadata& md, int block_size, std::string_view where);
// The largest block id any request reads (blocks 0 .. ceil(keys/block_size)-1 of its row, keys
// = key_seq_lens: the rank's with DCP); -1 when no request reads any.
int max_block_id_read(const CommonAttentionMetadata& md, int block_size);
// Error unless the batch is unsharded (dcp_world_size 1): `why` says why the backend cannot
// take a DCP shard.
void require_no_dcp(const CommonAttentionMetadata& md, std::string_view where, std::string_view why);

// The KV cache spec of a cache tensor made for `cfg`: num_blocks from a physically shaped
// (5-D) or flat (1-D) tensor; Error when the tensor fits neither.
KVCacheSpec cache_spec_of(const TensorView& cache, const AttentionConfig& cfg, std::string_view where);

// Throws unless every feature `params` uses was declared in `declared` (the configuration the
// impl was made for, which decided the kernel generation).
void require_declared_features(const AttentionParams& params, const Features& declared,
                               std::string_view where);

// Throws unless `t` (named `name` in the message) is on CUDA device `device_index` (q's).
void require_same_gpu(const TensorView& t, std::string_view name, int device_index,
                      std::string_view where);

// q: [>= num_tokens, num_heads, head_size] of cfg.dtype on `device`, last dim contiguous; out
// the same shape, of q's dtype when out_same_dtype, else any of f32/f16/bf16; lse (when
// defined) f32 [num_heads, num_tokens];
// k / v (when defined): [>= num_tokens, num_kv_heads, head_size]. Returns views cut to the
// first num_tokens rows of q and out (engines pad those buffers for CUDA graphs).
struct ForwardViews {
  TensorView q, out, lse;
};
ForwardViews check_forward_tensors(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& lse,
                                   const AttentionConfig& cfg, int64_t num_tokens, Device device,
                                   bool out_same_dtype, std::string_view where);

}  // namespace attnkit
