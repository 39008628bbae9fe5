#include "attnkit/dcp.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnkit/error.h"
#include "core/dcp_combine_check.h"

namespace attnkit {

void DcpShard::validate(std::string_view where) const {
  ATTNKIT_REQUIRE(world_size >= 1, where, "dcp world_size", world_size, "must be >= 1");
  ATTNKIT_REQUIRE(rank >= 0 && rank < world_size, where, "dcp rank", rank,
                  "must be in [0, world_size = " + std::to_string(world_size) + ")");
  ATTNKIT_REQUIRE(interleave >= 1, where, "dcp interleave", interleave, "must be >= 1");
}

int dcp_rank_of(int64_t token, int world_size, int interleave) {
  return static_cast<int>((token / interleave) % world_size);
}

int64_t dcp_local_len(int64_t seq_len, const DcpShard& s) {
  const int64_t I = s.interleave, N = s.world_size;
  const int64_t base = seq_len / I / N * I;
  return base + std::clamp<int64_t>(seq_len - base * N - int64_t{s.rank} * I, 0, I);
}

int64_t dcp_global_token(int64_t local, const DcpShard& s) {
  const int64_t I = s.interleave, N = s.world_size;
  return ((local / I) * N + s.rank) * I + local % I;
}

std::vector<int32_t> dcp_local_seq_lens(std::span<const int32_t> seq_lens, const DcpShard& shard) {
  shard.validate("dcp_local_seq_lens");
  std::vector<int32_t> out(seq_lens.size());
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    ATTNKIT_REQUIRE(seq_lens[r] >= 0, "dcp_local_seq_lens", "seq_lens[" + std::to_string(r) + "]", seq_lens[r],
                    "must be >= 0");
    out[r] = static_cast<int32_t>(dcp_local_len(seq_lens[r], shard));
  }
  return out;
}

}  // namespace attnkit

// ---- the combine's checks and workspace (src/core/dcp_combine_check.h) -------------------------

namespace attnkit {

namespace {
constexpr std::string_view kCombine = "dcp_combine";
size_t align256(size_t n) { return (n + 255) & ~size_t{255}; }
}  // namespace

DcpCombineLayout dcp_combine_layout(int64_t T, int H, int D, int N, DcpCombinePath path) {
  ATTNKIT_REQUIRE(T >= 0, kCombine, "num_tokens", T, "must be >= 0");
  ATTNKIT_REQUIRE(H > 0 && D > 0, kCombine, "num_heads x head_size", std::to_string(H) + " x " + std::to_string(D),
                  "must be > 0");
  ATTNKIT_REQUIRE(N >= 1 && H % N == 0, kCombine, "num_heads", H,
                  "must be a multiple of the world size " + std::to_string(N) + " (each rank gets num_heads / N heads)");
  ATTNKIT_REQUIRE(path == DcpCombinePath::all_gather_reduce_scatter || path == DcpCombinePath::all_to_all, kCombine,
                  "path", static_cast<int>(path), "must be all_gather_reduce_scatter (0) or all_to_all (1)");
  DcpCombineLayout l;
  l.tokens = T;
  l.heads = H;
  l.head_size = D;
  const size_t f = sizeof(float), rows = static_cast<size_t>(T) * H * D, lse = static_cast<size_t>(T) * H;
  const size_t parts[4] = {
      path == DcpCombinePath::all_gather_reduce_scatter ? f * lse * N : f * rows,
      path == DcpCombinePath::all_gather_reduce_scatter ? f * rows : f * lse,
      path == DcpCombinePath::all_gather_reduce_scatter ? f * rows / N : f * rows,
      path == DcpCombinePath::all_gather_reduce_scatter ? 0 : f * lse,
  };
  size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    l.offsets[i] = at;
    at += align256(parts[i]);
  }
  l.bytes = at;
  return l;
}

size_t dcp_combine_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int world_size,
                                   DcpCombinePath path) {
  return dcp_combine_layout(num_tokens, num_heads, head_size, world_size, path).bytes;
}

DcpCombineLayout dcp_combine_check(const DcpCombineArgs& a) {
  a.shard.validate(kCombine);
  const int N = a.shard.world_size;
  const TensorView& po = a.partial_out;
  po.require_device(kCombine, "partial_out", Device::CUDA);
  po.require_ndim(kCombine, "partial_out", 3);
  ATTNKIT_REQUIRE(po.dtype == DType::f32 || po.dtype == DType::f16 || po.dtype == DType::bf16, kCombine,
                  "partial_out.dtype", dtype_name(po.dtype), "must be f32, f16 or bf16");
  ATTNKIT_REQUIRE(po.stride(2) == 1, kCombine, "partial_out.stride(2)", po.stride(2), "must be 1");
  const int64_t T = po.size(0), H = po.size(1), D = po.size(2);
  const DcpCombineLayout l = dcp_combine_layout(T, static_cast<int>(H), static_cast<int>(D), N, a.path);
  const int64_t Hs = H / N;
  a.partial_lse.require_device(kCombine, "partial_lse", Device::CUDA);
  a.partial_lse.require_dtype(kCombine, "partial_lse", DType::f32);
  a.partial_lse.require_shape(kCombine, "partial_lse", {H, T});
  a.partial_lse.require_contiguous(kCombine, "partial_lse");
  a.out.require_device(kCombine, "out", Device::CUDA);
  a.out.require_shape(kCombine, "out", {T, Hs, D});
  ATTNKIT_REQUIRE(a.out.dtype == DType::f32 || a.out.dtype == DType::f16 || a.out.dtype == DType::bf16, kCombine,
                  "out.dtype", dtype_name(a.out.dtype), "must be f32, f16 or bf16");
  ATTNKIT_REQUIRE(a.out.stride(2) == 1, kCombine, "out.stride(2)", a.out.stride(2), "must be 1");
  if (a.out_lse.defined()) {
    a.out_lse.require_device(kCombine, "out_lse", Device::CUDA);
    a.out_lse.require_dtype(kCombine, "out_lse", DType::f32);
    a.out_lse.require_shape(kCombine, "out_lse", {Hs, T});
    a.out_lse.require_contiguous(kCombine, "out_lse");
  }
  if (a.sinks.defined()) {
    a.sinks.require_device(kCombine, "sinks", Device::CUDA);
    a.sinks.require_dtype(kCombine, "sinks", DType::f32);
    a.sinks.require_shape(kCombine, "sinks", {H});
    a.sinks.require_contiguous(kCombine, "sinks");
  }
  for (const TensorView* t : {&a.partial_lse, &a.out, &a.out_lse, &a.sinks})
    ATTNKIT_REQUIRE(!t->defined() || t->device_index == po.device_index, kCombine, "device index", t->device_index,
                    "must be partial_out's (" + std::to_string(po.device_index) + ")");
  ATTNKIT_REQUIRE(a.nccl_comm != nullptr, kCombine, "nccl_comm", "null", "must be the ranks' ncclComm_t");
  ATTNKIT_REQUIRE(a.workspace_bytes >= l.bytes, kCombine, "workspace_bytes", a.workspace_bytes,
                  "must be >= dcp_combine_workspace_bytes = " + std::to_string(l.bytes));
  ATTNKIT_REQUIRE(l.bytes == 0 || (a.workspace != nullptr && reinterpret_cast<uintptr_t>(a.workspace) % 16 == 0),
                  kCombine, "workspace", a.workspace == nullptr ? "null" : "unaligned", "must be a 16-byte aligned device buffer");
  return l;
}

}  // namespace attnkit
