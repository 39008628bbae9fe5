#include "attnkit/dcp.h"

#include <algorithm>
#include <string>

#include "attnkit/error.h"

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
