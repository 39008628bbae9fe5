// Decode context parallelism (DCP): a request's KV tokens spread over N ranks in chunks of I
// (token t on rank (t / I) % N, docs/architecture.md section 5). Every rank attends all query
// heads over its shard with the masks of the global positions; the partials (output, LSE) are
// then combined by the merge rule, the sink joining once. This header: the shard rule, the
// per-rank lengths a rank's builder needs, the CPU reference of one rank's sharded attention and
// the combine (the oracle of the NCCL combine paths; ranks simulated in one process).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"

namespace attnkit {

struct DcpShard {
  int world_size = 1;  // N >= 1
  int rank = 0;        // [0, N)
  int interleave = 1;  // I >= 1: tokens per chunk
  // Error naming the value when N < 1, rank outside [0, N) or I < 1.
  void validate(std::string_view where) const;
};

// The rank that holds global token t (t >= 0).
int dcp_rank_of(int64_t token, int world_size, int interleave);
// How many of the first `seq_len` global tokens the shard's rank holds (vLLM's
// get_dcp_local_seq_lens): base = (L / I / N) * I, local = base + clamp(L - base * N - rank * I, 0, I).
int64_t dcp_local_len(int64_t seq_len, const DcpShard& shard);
// The global index of the rank's local token j (j >= 0).
int64_t dcp_global_token(int64_t local, const DcpShard& shard);
// The local lengths of a batch's requests on the shard's rank.
std::vector<int32_t> dcp_local_seq_lens(std::span<const int32_t> seq_lens, const DcpShard& shard);

// One rank's sharded attention (CPU, double accumulation): every query token of `local_batch`
// (its query_start_loc, its seq_lens = the rank's local lengths dcp_local_seq_lens, its block
// table over `local_cache`, whose local token j of a request is the rank's j-th token of it)
// attends the visible keys of its global position (from `global_seq_lens`: query i of request r
// sits at global_seq_lens[r] - query_len + i) that this rank holds. params: as for
// reference_attention, without sinks (the combine adds them); ALiBi distances are global.
// out / lse: the partial (lse natural log, f32 [num_heads, num_tokens], required: the combine
// needs it). Error on bad input (shard, lengths that disagree with the rule, sinks given).
void reference_attention_dcp_shard(const TensorView& q, const PagedKV& local_cache, const BatchView& local_batch,
                                   std::span<const int32_t> global_seq_lens, const AttentionParams& params,
                                   const DcpShard& shard, const TensorView& out, const TensorView& lse);

// The combine (CPU): the N ranks' partials of the same rows, outs[r] [tokens, heads, head_size]
// and lses[r] f32 [heads, tokens] (natural log), into out (same shape, f32/f16/bf16) and, if
// defined, out_lse [heads, tokens]; sinks (f32 [heads], optional) join once. The merge rule of
// docs/architecture.md section 5: empty shards (-inf, +inf or NaN LSE) contribute nothing, no
// visible key anywhere gives 0 and -inf (or the sink's logit).
void dcp_combine_reference(std::span<const TensorView> outs, std::span<const TensorView> lses, const TensorView& sinks,
                           const TensorView& out, const TensorView& out_lse);

// ---- the combine on GPUs, over NCCL ------------------------------------------------------------
// Each rank holds its partial of every query head (out [T, H, D], LSE [H, T], natural log) and
// gets the merged output of its head slice, heads [rank * H / N, (rank + 1) * H / N), by one of
// vLLM's two paths: all-gather the LSEs and reduce-scatter the weighted outputs by head
// (cp_lse_ag_out_rs), or exchange the head slices' partials and LSEs all-to-all and merge them
// (dcp_a2a_lse_reduce). Both merge by the rule of dcp_combine_reference (empty shards, sinks).
// The communicator and stream are the caller's; the workspace too.
enum class DcpCombinePath : int { all_gather_reduce_scatter = 0, all_to_all = 1 };

struct DcpCombineArgs {
  TensorView partial_out;  // [T, H, D] this rank's partial, f16 / bf16 / f32, CUDA, last dim contiguous
  TensorView partial_lse;  // f32 [H, T] contiguous, CUDA
  TensorView out;          // [T, H / N, D] this rank's head slice, f16 / bf16 / f32, CUDA
  TensorView out_lse;      // optional f32 [H / N, T] contiguous, CUDA
  TensorView sinks;        // optional f32 [H] (joins once), CUDA
  DcpShard shard;          // N ranks, this rank (the interleave plays no part here)
  DcpCombinePath path = DcpCombinePath::all_gather_reduce_scatter;
  void* nccl_comm = nullptr;  // ncclComm_t of the N ranks, this rank = shard.rank
  void* workspace = nullptr;  // device, 16-byte aligned, >= dcp_combine_workspace_bytes
  size_t workspace_bytes = 0;
  void* stream = nullptr;     // cudaStream_t
};

// Device workspace of a combine of T tokens, H heads of size D over N ranks on `path`.
size_t dcp_combine_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int world_size,
                                   DcpCombinePath path);
// Whether this build has the combine (CUDA and NCCL found by CMake).
bool dcp_combine_available();
// Error naming the value for bad arguments (shapes, dtypes, devices, H not a multiple of N, a
// small workspace, a communicator whose size or rank is not the shard's) before any launch or
// collective; Error in a build without CUDA or NCCL.
void dcp_combine(const DcpCombineArgs& args);

}  // namespace attnkit
