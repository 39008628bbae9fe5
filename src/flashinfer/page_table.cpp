#include "flashinfer/page_table.h"

#include <algorithm>
#include <string>

#include "attnkit/error.h"
#include "core/id_scan.h"

namespace attnkit::flashinfer {

namespace {
constexpr std::string_view kWhere = "flashinfer page table";
}

PageTable::PageTable(int max_reqs, int64_t max_pages) {
  ATTNKIT_REQUIRE(max_reqs >= 0, kWhere, "max_reqs", max_reqs, "must be >= 0");
  ATTNKIT_REQUIRE(max_pages >= 0 && max_pages <= INT32_MAX, kWhere, "max_pages", max_pages,
                  "must be in [0, 2^31) (page indices are int32)");
  indptr.assign(static_cast<size_t>(max_reqs) + 1, 0);
  indices.assign(static_cast<size_t>(max_pages), 0);
  last_page_len.assign(static_cast<size_t>(max_reqs), 0);
}

void PageTable::fill(const BatchView& batch, int begin, int end, int page) {
  ATTNKIT_REQUIRE(page > 0, kWhere, "page_size", page, "must be > 0");
  ATTNKIT_REQUIRE(0 <= begin && begin <= end && end <= batch.num_reqs(), kWhere, "request range",
                  "[" + std::to_string(begin) + ", " + std::to_string(end) + ")",
                  "must lie within [0, num_reqs = " + std::to_string(batch.num_reqs()) + ")");
  ATTNKIT_REQUIRE(end - begin <= max_reqs(), kWhere, "requests", end - begin,
                  "must be <= the table's capacity max_reqs = " + std::to_string(max_reqs()));
  ATTNKIT_REQUIRE(batch.max_blocks_per_req >= 0 &&
                      static_cast<int64_t>(batch.block_table.size()) >=
                          static_cast<int64_t>(batch.num_reqs()) * batch.max_blocks_per_req,
                  kWhere, "block_table.size()", batch.block_table.size(),
                  "must be >= num_reqs * max_blocks_per_req");
  // First pass: every check, so a rejected batch leaves the table as it was.
  int64_t total = 0;
  int32_t max_id = -1;
  for (int r = begin; r < end; ++r) {
    const int64_t seq = batch.seq_lens[r];
    ATTNKIT_REQUIRE(seq >= 0, kWhere, "seq_lens[" + std::to_string(r) + "]", seq, "must be >= 0");
    const int64_t pages = (seq + page - 1) / page;
    ATTNKIT_REQUIRE(pages <= batch.max_blocks_per_req, kWhere,
                    "seq_lens[" + std::to_string(r) + "]", seq,
                    "needs " + std::to_string(pages) + " pages of " + std::to_string(page) +
                        " tokens but the block table row has max_blocks_per_req = " +
                        std::to_string(batch.max_blocks_per_req));
    const int32_t* row = batch.block_row(r);
    const IdRange ids = id_range(row, pages);
    if (ids.min < 0) {
      const int64_t b = first_outside(row, pages, 0, int64_t{1} << 31);
      fail(kWhere, "block_table[" + std::to_string(r) + "][" + std::to_string(b) + "]", row[b],
           "must be >= 0 for every block a request reads");
    }
    if (pages > 0) max_id = std::max(max_id, ids.max);
    total += pages;
  }
  ATTNKIT_REQUIRE(total <= max_pages(), kWhere, "pages in the batch part", total,
                  "must be <= the table's capacity max_pages = " + std::to_string(max_pages()));
  page_size = page;
  num_reqs = end - begin;
  num_pages = total;
  int64_t cursor = 0;
  indptr[0] = 0;
  max_page_id = max_id;
  for (int r = begin; r < end; ++r) {
    const int i = r - begin;
    const int64_t seq = batch.seq_lens[r];
    const int64_t pages = (seq + page - 1) / page;
    const int32_t* row = batch.block_row(r);
    std::copy(row, row + pages, indices.begin() + cursor);
    cursor += pages;
    indptr[i + 1] = static_cast<int32_t>(cursor);
    // A full last page holds page_size tokens, not 0; a request with no pages has length 0.
    last_page_len[i] = seq == 0 ? 0 : static_cast<int32_t>(seq - (pages - 1) * page);
  }
}

void PageTable::assign(std::span<const int32_t> ptr, std::span<const int32_t> ids,
                       std::span<const int32_t> last, int page) {
  ATTNKIT_REQUIRE(page > 0, kWhere, "page_size", page, "must be > 0");
  ATTNKIT_REQUIRE(!ptr.empty(), kWhere, "indptr.size()", ptr.size(), "must be batch_size + 1 >= 1");
  const int64_t n = static_cast<int64_t>(ptr.size()) - 1;
  ATTNKIT_REQUIRE(n <= max_reqs(), kWhere, "batch_size", n,
                  "must be <= the table's capacity max_reqs = " + std::to_string(max_reqs()));
  ATTNKIT_REQUIRE(ptr[0] == 0, kWhere, "indptr[0]", ptr[0], "must be 0");
  for (int64_t r = 0; r < n; ++r)
    ATTNKIT_REQUIRE(ptr[r + 1] >= ptr[r], kWhere, "indptr[" + std::to_string(r + 1) + "]",
                    ptr[r + 1],
                    "must be >= indptr[" + std::to_string(r) + "] = " + std::to_string(ptr[r]) +
                        " (request r owns pages indices[indptr[r] .. indptr[r+1]))");
  const int64_t total = ptr[n];
  ATTNKIT_REQUIRE(static_cast<int64_t>(ids.size()) >= total, kWhere, "indices.size()", ids.size(),
                  "must hold indptr[" + std::to_string(n) + "] = " + std::to_string(total) +
                      " page ids");
  ATTNKIT_REQUIRE(total <= max_pages(), kWhere, "pages indptr[" + std::to_string(n) + "]", total,
                  "must be <= the table's capacity max_pages = " + std::to_string(max_pages()));
  ATTNKIT_REQUIRE(static_cast<int64_t>(last.size()) == n, kWhere, "last_page_len.size()",
                  last.size(), "must be batch_size = " + std::to_string(n));
  const int64_t bad = first_outside(ids.data(), total, 0, int64_t{1} << 31);
  ATTNKIT_REQUIRE(bad == total, kWhere, "indices[" + std::to_string(bad) + "]", ids[bad], "must be >= 0 (a page id)");
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pages = ptr[r + 1] - ptr[r];
    if (pages == 0) continue;
    ATTNKIT_REQUIRE(last[r] >= 1 && last[r] <= page, kWhere,
                    "last_page_len[" + std::to_string(r) + "]", last[r],
                    "must be in [1, page_size = " + std::to_string(page) +
                        "]: the tokens held by the last of the request's " +
                        std::to_string(pages) + " page(s)");
    const int64_t len = (pages - 1) * page + last[r];
    ATTNKIT_REQUIRE(len <= INT32_MAX, kWhere, "kv_len of request " + std::to_string(r), len,
                    "must be < 2^31");
  }
  page_size = page;
  num_reqs = static_cast<int>(n);
  num_pages = total;
  std::copy(ptr.begin(), ptr.end(), indptr.begin());
  std::copy(ids.begin(), ids.begin() + total, indices.begin());
  max_page_id = total ? *std::max_element(ids.begin(), ids.begin() + total) : -1;
  for (int64_t r = 0; r < n; ++r) last_page_len[r] = ptr[r + 1] > ptr[r] ? last[r] : 0;
}

int64_t PageTable::kv_len(int r) const {
  const int64_t pages = indptr[r + 1] - indptr[r];
  return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[r];
}

RaggedPages ragged_pages(std::span<const int32_t> kv) {
  constexpr std::string_view where = "flashinfer ragged K/V";
  ATTNKIT_REQUIRE(!kv.empty() && kv[0] >= 0, where, "kv_indptr[0]", kv.empty() ? -1 : kv[0],
                  "must exist and be >= 0");
  RaggedPages rp;
  rp.indptr.push_back(0);
  for (size_t r = 0; r + 1 < kv.size(); ++r) {
    ATTNKIT_REQUIRE(kv[r + 1] >= kv[r], where, "kv_indptr[" + std::to_string(r + 1) + "]", kv[r + 1],
                    "must be >= kv_indptr[" + std::to_string(r) + "] = " + std::to_string(kv[r]));
    const int32_t len = kv[r + 1] - kv[r], pages = (len + kRaggedPageRows - 1) / kRaggedPageRows;
    for (int32_t j = 0; j < pages; ++j) rp.indices.push_back(kv[r] + j * kRaggedPageRows);
    rp.indptr.push_back(static_cast<int32_t>(rp.indices.size()));
    rp.last_page_len.push_back(pages ? len - (pages - 1) * kRaggedPageRows : 0);
  }
  return rp;
}

}  // namespace attnkit::flashinfer
