// The C++ half of the FlashInfer-style wrappers (attnkit.flashinfer): a wrapper's plan() fills a
// flashinfer::PageTable (which validates FlashInfer's CSR page table) and plans the batch with
// plan_batch into fixed-capacity PlanBuffers; run() executes that plan on the backend's CPU path
// (run_plan_on_cpu: the reference's row math, item by item through the page table), run_cuda()
// on the GPU (gpu_planned.h's planned kernels, decode and prefill plans: the plan's device copy
// is refreshed by every plan() once it exists, so a captured run stays valid across re-plans).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "convert.h"
#include "flashinfer/cpu_forward.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/gpu_planned.h"
#include "flashinfer/page_table.h"
#include "flashinfer/plan.h"

namespace attnkit::py {

namespace {

using flashinfer::PageTable;
using flashinfer::PlanBatch;
using flashinfer::PlanBuffers;
using flashinfer::PlanCapacity;
using flashinfer::PlanConfig;
using flashinfer::PlanKernel;

// The SM count the plan budgets CTA slots for: the GPU the kernels target (sm90, H100 / H200).
int plan_sms() { return DeviceSpec::Cuda(9, 0).sms_or_default(); }

// Errors name the wrapper's call, then the part of the library that raised them.
template <class F>
void as_call(const std::string& where, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    throw Error(where + " (" + e.where() + ")", e.value(), e.rule());
  }
}

std::vector<int32_t> host_vec(const InArray& a, std::string_view where, std::string_view name) {
  const TensorView t = to_view(a, where, name);
  t.require_ndim(where, name, 1);
  return host_int32(t, where, name);
}

bool same_config(const PlanConfig& a, const PlanConfig& b) {
  return a.kernel == b.kernel && a.num_kv_heads == b.num_kv_heads && a.group_size == b.group_size &&
         a.head_size == b.head_size && a.page_size == b.page_size && a.num_slots == b.num_slots &&
         a.fixed_tile_q == b.fixed_tile_q;
}

class FlashInferPlan {
 public:
  // fixed (CUDA-graph mode): the capacity is max_reqs / max_pages (0: the first plan's) and the
  // first plan's token count, and never grows; otherwise the buffers grow to fit a batch.
  FlashInferPlan(int max_reqs, int64_t max_pages, bool fixed)
      : max_reqs_(max_reqs), max_pages_(max_pages), fixed_(fixed) {}

  // Paged K/V; qo_indptr None = decode (one query token per request).
  void plan_paged(const std::string& where, const OptIn& qo_indptr, const InArray& indptr,
                  const InArray& indices, const InArray& last_page_len, int num_qo_heads,
                  int num_kv_heads, int head_dim, int page_size, bool causal, int window_left,
                  bool tensor_cores, int q_len_per_req, bool nvfp4) {
    as_call(where, [&] {
      planned_ = ragged_ = false;
      std::vector<int32_t> ptr = host_vec(indptr, where, "indptr");
      std::vector<int32_t> qo(ptr.size());
      ATTNKIT_REQUIRE(q_len_per_req >= 1 && (!qo_indptr || q_len_per_req == 1), where, "q_len_per_req", q_len_per_req,
                      "must be >= 1 (and 1 with a qo_indptr)");
      q_len_per_req_ = q_len_per_req;
      if (qo_indptr) {
        qo = host_vec(*qo_indptr, where, "qo_indptr");
        ATTNKIT_REQUIRE(qo.size() == ptr.size(), where, "qo_indptr.shape",
                        "[" + std::to_string(qo.size()) + "]",
                        "must be [batch_size + 1 = " + std::to_string(ptr.size()) + "]");
      } else {
        for (size_t r = 0; r < qo.size(); ++r) qo[r] = static_cast<int32_t>(r) * q_len_per_req;
      }
      plan(qo, ptr, host_vec(indices, where, "indices"), host_vec(last_page_len, where, "last_page_len"),
           num_qo_heads, num_kv_heads, head_dim, page_size, causal, window_left,
           /*decode=*/!qo_indptr, tensor_cores, nvfp4);
    });
  }

  // Ragged (contiguous) K/V: request r's keys are rows kv_indptr[r] .. kv_indptr[r+1] of k / v,
  // read as pages of the contiguous view (convert.h identity_paged_kv; flashinfer::ragged_pages),
  // so the same table, plan and kernels serve, on the CPU and the GPU.
  void plan_ragged(const std::string& where, const InArray& qo_indptr, const InArray& kv_indptr,
                   int num_qo_heads, int num_kv_heads, int head_dim, bool causal, int window_left) {
    as_call(where, [&] {
      planned_ = false;
      ragged_ = true;
      q_len_per_req_ = 1;
      const std::vector<int32_t> qo = host_vec(qo_indptr, where, "qo_indptr");
      const std::vector<int32_t> kv = host_vec(kv_indptr, where, "kv_indptr");
      ATTNKIT_REQUIRE(kv.size() == qo.size(), where, "kv_indptr.shape",
                      "[" + std::to_string(kv.size()) + "]",
                      "must equal qo_indptr.shape = [" + std::to_string(qo.size()) + "]");
      const flashinfer::RaggedPages rp = flashinfer::ragged_pages(kv);
      kv_rows_ = kv.back();
      plan(qo, rp.indptr, rp.indices, rp.last_page_len, num_qo_heads, num_kv_heads, head_dim,
           flashinfer::kRaggedPageRows, causal, window_left, /*decode=*/false, /*tensor_cores=*/true,
           /*nvfp4=*/false);
    });
  }

  // The paged cache of a run: k / v as cache_dtype names them, or (k_sf / v_sf given) NVFP4:
  // k / v the packed codes (uint8 [..., D / 2]) and k_sf / v_sf the block scales (e4m3 bytes).
  static PagedKV paged_cache(const InArray& k, const InArray& v, const OptIn& k_sf, const OptIn& v_sf,
                             const std::string& cache_dtype, std::string_view where) {
    ATTNKIT_REQUIRE(k_sf.has_value() == v_sf.has_value(), where, "kv_cache_sf", "one side",
                    "must give the block scales of both K and V");
    if (k_sf)
      return paged_kv_nvfp4_from_views(to_view(k, where, "k_cache"), to_view(v, where, "v_cache"),
                                       to_view(k_sf, where, "k_cache_sf"), to_view(v_sf, where, "v_cache_sf"));
    ATTNKIT_REQUIRE(cache_dtype != "nvfp4", where, "kv_data_type", "nvfp4",
                    "an NVFP4 cache needs its block scales (run(..., kv_cache_sf=(k_sf, v_sf)))");
    return paged_kv_from_views(as_cache_view(to_view(k, where, "k_cache"), cache_dtype, where, "k_cache"),
                               as_cache_view(to_view(v, where, "v_cache"), cache_dtype, where, "v_cache"));
  }

  // Ragged k / v [kv_tokens, H, D] as the contiguous view the ragged plan's pages address.
  PagedKV ragged_cache(const InArray& k, const InArray& v, const OptIn& k_sf, const std::string& cache_dtype,
                       std::string_view where) const {
    ATTNKIT_REQUIRE(!k_sf, where, "kv_cache_sf", "given", "is for paged NVFP4 caches (not the ragged wrapper)");
    const TensorView kt = as_cache_view(to_view(k, where, "k_cache"), cache_dtype, where, "k_cache");
    const TensorView vt = as_cache_view(to_view(v, where, "v_cache"), cache_dtype, where, "v_cache");
    kt.require_ndim(where, "k", 3);
    ATTNKIT_REQUIRE(kv_rows_ <= kt.shape[0], where, "kv_indptr[batch_size]", kv_rows_,
                    "must be <= k.shape[0] = " + std::to_string(kt.shape[0]));
    return identity_paged_kv(kt, vt, where);
  }

  // q [tokens, num_qo_heads, head_dim]; k / v the paged views [num_pages, page_size, H, D]
  // (ragged: [kv_tokens, H, D]); out like q; lse f32 [num_qo_heads, tokens] (natural log).
  void run(const std::string& where, const InArray& q, const InArray& k, const InArray& v,
           const std::string& cache_dtype, float scale, float softcap, const OptIn& sinks,
           const OutArray& out, const OptOut& lse, const OptIn& k_sf, const OptIn& v_sf) {
    as_call(where, [&] {
      ATTNKIT_REQUIRE(planned_, where, "plan", "None", "call plan(...) before run(...)");
      const PagedKV cache =
          ragged_ ? ragged_cache(k, v, k_sf, cache_dtype, where) : paged_cache(k, v, k_sf, v_sf, cache_dtype, where);
      AttentionParams p;
      p.scale = scale;
      p.causal = batch_.causal;
      p.window_left = batch_.window_left;
      p.window_right = batch_.window_right;
      p.softcap = softcap;
      p.sinks = to_view(sinks, where, "sinks");
      p.lse = to_view(lse, where, "lse");
      flashinfer::run_plan_on_cpu(to_view(q, where, "q"), cache, pages_, plan_, batch_, p,
                                  to_view(out, where, "out"));
    });
  }

  // The plan on the GPU (the planned kernels: gpu_planned.h): q [tokens, H, D], the paged views
  // (ragged: k / v [kv_tokens, H, D]), out; workspace: the caller's float workspace (needed
  // when the plan splits). The first CUDA run creates the plan's device copy (one allocation, the wrapper's)
  // and uploads it; later plan() calls refresh it.
  void run_cuda(const std::string& where, const InArray& q, const InArray& k, const InArray& v,
                const std::string& cache_dtype, float scale, float softcap, const OptIn& sinks,
                const OutArray& out, const OptOut& lse, const OptOut& workspace, uintptr_t stream,
                const OptIn& k_sf, const OptIn& v_sf) {
    as_call(where, [&] {
      ATTNKIT_REQUIRE(planned_, where, "plan", "None", "call plan(...) before run(...)");
      flashinfer::PlannedPartArgs a;
      a.cache = ragged_ ? ragged_cache(k, v, k_sf, cache_dtype, where) : paged_cache(k, v, k_sf, v_sf, cache_dtype, where);
      a.q = to_view(q, where, "q");
      a.out = to_view(out, where, "out");
      a.params.scale = scale;
      a.params.causal = batch_.causal;
      a.params.window_left = batch_.window_left;
      a.params.window_right = batch_.window_right;
      a.params.softcap = softcap;
      a.params.sinks = to_view(sinks, where, "sinks");
      a.params.lse = to_view(lse, where, "lse");
      const TensorView ws = to_view(workspace, where, "float_workspace_buffer");
      if (ws.defined()) {
        ws.require_device(where, "float_workspace_buffer", Device::CUDA);
        a.workspace = ws.data;
        a.workspace_bytes = static_cast<size_t>(ws.numel()) * dtype_size(ws.dtype);
      }
      a.stream = stream_ptr(stream);
      a.graph_safe = fixed_;  // (CUDA-graph mode: a captured run replays every plan of the capacity)
      if (!dev_) {
        const size_t bytes =
            flashinfer::DevicePlanLayout(plan_.capacity, plan_.config.group_size, pages_.max_pages()).bytes();
        dev_mem_ = CudaMemory(bytes);  // (the wrapper's, as FlashInfer's wrappers hold their int workspace)
        dev_ = std::make_unique<flashinfer::DevicePlan>(plan_.capacity, plan_.config.group_size, pages_.max_pages(),
                                                        dev_mem_.get(), bytes);
        dev_max_pages_ = pages_.max_pages();
        dev_->upload(plan_, pages_, batch_, a.stream);
      }
      flashinfer::run_planned_part(*dev_, plan_, pages_, batch_, a);
    });
  }

  int num_reqs() const { return planned_ ? plan_.num_reqs : 0; }

  // What the plan decided (and the capacity it was planned into).
  nb::dict info() const {
    nb::dict d;
    if (!planned_) return d;
    const PlanBuffers& b = plan_;
    int split_tiles = 0, merged_rows = 0;
    for (int i = 0; i < b.num_items; ++i) split_tiles += b.items[i].num_chunks > 1 && b.items[i].chunk == 0;
    for (int64_t g = 0; g < int64_t{b.num_tokens} * b.config.group_size; ++g)
      merged_rows += b.merge_indptr[g + 1] > b.merge_indptr[g];
    d["kernel"] = b.config.kernel == PlanKernel::CudaCoreDecode ? "cuda_core_decode" : "tensor_core";
    d["num_reqs"] = b.num_reqs;
    d["num_tokens"] = b.num_tokens;
    d["page_size"] = b.config.page_size;
    d["group_size"] = b.config.group_size;
    d["num_slots"] = b.config.num_slots;
    d["tile_q"] = b.tile_q;
    d["kv_chunk_tokens"] = b.kv_chunk_tokens;
    d["num_items"] = b.num_items;
    d["split_kv"] = b.split_kv;
    d["num_split_tiles"] = split_tiles;
    d["num_partial_rows"] = b.num_partial_rows;
    d["num_merged_rows"] = merged_rows;  // packed rows (token, head in group) merged from partials
    nb::dict cap;
    cap["max_reqs"] = b.capacity.max_reqs;
    cap["max_tokens"] = b.capacity.max_tokens;
    cap["max_pages"] = pages_.max_pages();
    cap["max_items"] = b.capacity.max_items;
    cap["max_partial_rows"] = b.capacity.max_partial_rows;
    d["capacity"] = cap;
    return d;
  }

 private:
  void plan(const std::vector<int32_t>& qo, const std::vector<int32_t>& ptr,
            const std::vector<int32_t>& ids, const std::vector<int32_t>& last, int num_qo_heads,
            int num_kv_heads, int head_dim, int page_size, bool causal, int window_left,
            bool decode, bool tensor_cores, bool nvfp4) {
    constexpr std::string_view kWhere = "flashinfer plan";
    ATTNKIT_REQUIRE(num_kv_heads > 0 && num_qo_heads > 0 && num_qo_heads % num_kv_heads == 0, kWhere,
                    "num_qo_heads", num_qo_heads,
                    "must be a positive multiple of num_kv_heads = " + std::to_string(num_kv_heads));
    PlanConfig cfg;
    cfg.num_kv_heads = num_kv_heads;
    cfg.group_size = num_qo_heads / num_kv_heads;
    cfg.head_size = head_dim;
    cfg.page_size = page_size;
    cfg.num_slots = flashinfer::num_slots_for(plan_sms(), num_kv_heads);
    cfg.kernel = decode && q_len_per_req_ == 1 && !tensor_cores && !flashinfer::decode_uses_tensor_cores(cfg.group_size)
                     ? PlanKernel::CudaCoreDecode
                     : PlanKernel::TensorCore;
    // CUDA-graph mode fixes the tile as the builder does (metadata_builder.cpp), and so does an
    // NVFP4 cache: its prefills take 16-row tiles (the decode tile is the one that reads NVFP4).
    if ((fixed_ || nvfp4) && cfg.kernel == PlanKernel::TensorCore)
      cfg.fixed_tile_q = decode  ? flashinfer::cta_tile_q(cfg.group_size * q_len_per_req_, head_dim)
                         : nvfp4 ? flashinfer::kTileQSmall
                                 : cfg.max_tile_q();
    cfg.validate(kWhere);

    // Capacity: grown to fit (bounded by what the arrays can hold, so a bad indptr is reported
    // rather than allocated), or fixed at the first plan in CUDA-graph mode.
    auto fit = [&](auto& cap, int64_t need) {
      if (!fixed_ || cap == 0) cap = std::max<int64_t>(cap, need);
    };
    fit(max_reqs_, static_cast<int64_t>(ptr.size()) - 1);
    fit(max_pages_, std::clamp<int64_t>(ptr.empty() ? 0 : ptr.back(), 0, static_cast<int64_t>(ids.size())));
    if (pages_.max_reqs() != max_reqs_ || pages_.max_pages() != max_pages_)
      pages_ = PageTable(max_reqs_, max_pages_);
    pages_.assign(ptr, ids, last, page_size);

    kv_lens_.resize(pages_.num_reqs);
    int64_t keys = 0;
    for (int r = 0; r < pages_.num_reqs; ++r) keys += kv_lens_[r] = static_cast<int32_t>(pages_.kv_len(r));
    fit(max_tokens_, decode ? int64_t{max_reqs_} * q_len_per_req_ : std::clamp<int64_t>(qo.back(), 0, keys));
    if (!same_config(plan_.config, cfg) || plan_.capacity.max_reqs != max_reqs_ ||
        plan_.capacity.max_tokens != max_tokens_) {
      plan_ = PlanBuffers(cfg, PlanCapacity::for_limits(cfg, max_reqs_, max_tokens_));
      dev_.reset();  // (a new capacity: the next CUDA run makes a device copy of it)
    }
    if (dev_ && pages_.max_pages() > dev_max_pages_) dev_.reset();
    qo_ = qo;
    batch_ = PlanBatch{qo_, kv_lens_, causal, window_left, -1};
    flashinfer::plan_batch(batch_, plan_);
    planned_ = true;
    decode_ = decode;
    // The device copy, once a CUDA run made it, follows every plan (on the legacy default
    // stream, as FlashInfer's plan() copies on the current one), outside any graph capture.
    if (dev_) dev_->upload(plan_, pages_, batch_, nullptr);
  }

  int max_reqs_ = 0, max_tokens_ = 0;
  int64_t max_pages_ = 0;
  bool fixed_ = false, planned_ = false, ragged_ = false, decode_ = false;
  int q_len_per_req_ = 1;
  CudaMemory dev_mem_;  // the device copy's memory (before dev_: freed after it)
  std::unique_ptr<flashinfer::DevicePlan> dev_;
  int64_t dev_max_pages_ = 0;
  int64_t kv_rows_ = 0;  // ragged: rows of k / v the plan reads
  PageTable pages_;
  PlanBuffers plan_;
  std::vector<int32_t> qo_, kv_lens_;
  PlanBatch batch_;
};

}  // namespace

void register_flashinfer(nb::module_& m) {
  nb::class_<FlashInferPlan>(m, "FlashInferPlan",
                             "A FlashInfer-style wrapper's page table and plan (use the wrappers).")
      .def(nb::init<int, int64_t, bool>(), nb::arg("max_reqs"), nb::arg("max_pages"), nb::arg("fixed"))
      .def("plan_paged", &FlashInferPlan::plan_paged, nb::arg("where"), nb::arg("qo_indptr").none(),
           nb::arg("indptr"), nb::arg("indices"), nb::arg("last_page_len"), nb::arg("num_qo_heads"),
           nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("page_size"), nb::arg("causal"),
           nb::arg("window_left"), nb::arg("tensor_cores"), nb::arg("q_len_per_req") = 1, nb::arg("nvfp4") = false)
      .def("plan_ragged", &FlashInferPlan::plan_ragged, nb::arg("where"), nb::arg("qo_indptr"),
           nb::arg("kv_indptr"), nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
           nb::arg("causal"), nb::arg("window_left"))
      .def("run", &FlashInferPlan::run, nb::arg("where"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
           nb::arg("cache_dtype"), nb::arg("scale"), nb::arg("softcap"), nb::arg("sinks").none(),
           nb::arg("out"), nb::arg("lse").none(), nb::arg("k_sf").none() = nb::none(),
           nb::arg("v_sf").none() = nb::none())
      .def("run_cuda", &FlashInferPlan::run_cuda, nb::arg("where"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
           nb::arg("cache_dtype"), nb::arg("scale"), nb::arg("softcap"), nb::arg("sinks").none(),
           nb::arg("out"), nb::arg("lse").none(), nb::arg("workspace").none(), nb::arg("stream"),
           nb::arg("k_sf").none() = nb::none(), nb::arg("v_sf").none() = nb::none())
      .def_prop_ro("num_reqs", &FlashInferPlan::num_reqs)
      .def("info", &FlashInferPlan::info);
}

}  // namespace attnkit::py
