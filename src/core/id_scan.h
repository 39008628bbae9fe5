// Checks of id arrays on the engine's step path (a batch's block-table rows: every block a
// request reads, 64k ids for 256 requests of 4k keys in blocks of 16): one pass of minimum and
// maximum, which the compiler vectorises, and a search for the first offending id only where
// the range check fails, instead of a compare and a branch to the error per id.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

namespace attnkit {

struct IdRange {
  int32_t min = std::numeric_limits<int32_t>::max(), max = std::numeric_limits<int32_t>::min();
};

// The smallest and largest of ids[0, n) (the defaults when n is 0).
inline IdRange id_range(const int32_t* ids, int64_t n) {
  IdRange r;
  for (int64_t i = 0; i < n; ++i) {
    r.min = std::min(r.min, ids[i]);
    r.max = std::max(r.max, ids[i]);
  }
  return r;
}

// The index of the first of ids[0, n) outside [lo, hi), or n when all are inside.
inline int64_t first_outside(const int32_t* ids, int64_t n, int64_t lo, int64_t hi) {
  const IdRange r = id_range(ids, n);
  if (n == 0 || (r.min >= lo && r.max < hi)) return n;
  int64_t i = 0;
  while (ids[i] >= lo && ids[i] < hi) ++i;
  return i;
}

}  // namespace attnkit
