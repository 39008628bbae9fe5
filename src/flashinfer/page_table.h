// The page-table form the FlashInfer-style kernels read (a CSR matrix over pages, study 1.1):
// request r owns pages indices[indptr[r] .. indptr[r+1]) in sequence order, and its last page
// holds last_page_len[r] valid tokens, so kv_len = (pages - 1) * page_size + last_page_len.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/metadata.h"

namespace attnkit::flashinfer {

struct PageTable {
  // Fixed-capacity buffers, sized once at creation (CUDA-graph replays reuse them); only the
  // first num_reqs + 1 / num_pages / num_reqs entries are meaningful after fill().
  std::vector<int32_t> indptr;         // capacity max_reqs + 1
  std::vector<int32_t> indices;        // capacity max_pages
  std::vector<int32_t> last_page_len;  // capacity max_reqs; 0 for an empty request
  int num_reqs = 0;
  int64_t num_pages = 0;
  int page_size = 0;
  int32_t max_page_id = -1;  // the largest of the table's page ids (-1: none); a cache needs more blocks

  PageTable() = default;
  PageTable(int max_reqs, int64_t max_pages);
  int max_reqs() const { return static_cast<int>(last_page_len.size()); }
  int64_t max_pages() const { return static_cast<int64_t>(indices.size()); }

  // Rewrites the table for requests [begin, end) of `batch` (part-local request i is batch
  // request begin + i) with pages of `page_size` tokens. Never reallocates: more requests or
  // pages than the capacity is an Error, as are a bad range, a negative seq_len, a row too short
  // for ceil(seq_len / page_size) blocks or a negative block id.
  void fill(const BatchView& batch, int begin, int end, int page_size);

  // Copies a table given in this form (FlashInfer's plan() arguments: indptr [num_reqs + 1],
  // indices, last_page_len [num_reqs]) with pages of `page_size` tokens. Checks it first, so a
  // rejected table leaves the previous one as it was: indptr from 0 and non-decreasing, indices
  // holding indptr[num_reqs] page ids >= 0, last_page_len in [1, page_size] for every request
  // with pages (0 is stored for one without), kv_len < 2^31, and the capacity (never
  // reallocates). Page ids are checked against a cache where one is read (it is not known here).
  void assign(std::span<const int32_t> indptr, std::span<const int32_t> indices,
              std::span<const int32_t> last_page_len, int page_size);

  // Tokens of part-local request r: (pages - 1) * page_size + last_page_len, 0 with no pages.
  int64_t kv_len(int r) const;
};

// Ragged (contiguous) K/V [kv_tokens, num_kv_heads, head_size], request r's keys the rows
// kv_indptr[r] .. kv_indptr[r + 1], as a page table over the contiguous view (flash_attn/
// varlen_launch.h contiguous_kv_view: a "block" of kRaggedPageRows rows starts at every row):
// request r's pages are the rows kv_indptr[r], + 16, + 32, ..., so the paged plan and kernels
// read ragged K/V with no copy. Error when kv_indptr is empty, starts below 0 or decreases.
inline constexpr int kRaggedPageRows = 16;
struct RaggedPages {
  std::vector<int32_t> indptr, indices, last_page_len;  // PageTable::assign's arguments
};
RaggedPages ragged_pages(std::span<const int32_t> kv_indptr);

}  // namespace attnkit::flashinfer
