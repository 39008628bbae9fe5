#include "attention_case.h"

#include "flash_attn/hopper_traits.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include "attnkit/reference.h"
#include "cuda/cuda_check.h"
#include "device_fill.h"
#include "flash_attn/varlen_launch.h"
#include "test_util.h"

namespace attnkit::test {

// ---- Case ----------------------------------------------------------------------------------

int64_t Case::num_tokens() const {
  int64_t t = 0;
  for (int q : q_lens) t += q;
  return t;
}
int Case::max_query_len() const { return q_lens.empty() ? 0 : *std::max_element(q_lens.begin(), q_lens.end()); }
int Case::max_seq_len() const { return seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end()); }

std::string Case::describe() const {
  std::ostringstream os;
  os << "seed " << seed << ": " << dtype_name(dtype) << " q, " << dtype_name(cache_dtype) << " cache "
     << layout_name(layout) << ", head_size " << head_size << ", kv_heads " << num_kv_heads << " x group "
     << group << ", block " << block_size << ", " << (causal ? "causal" : "non-causal") << ", window ("
     << window_left << ", " << window_right << "), softcap " << softcap << (alibi ? ", alibi" : "")
     << (alibi && alibi_per_seq ? " per sequence" : "") << (sinks ? ", sinks" : "") << (per_head_kv_scale ? ", per-head kv scale" : "") << ", scale " << scale
     << ", q_amp " << q_amp << ", splits " << num_splits << (want_lse ? "" : ", no lse")
     << ", " << flash_attn::generation_name(generation) << " preferred"
     << (tuning.max_ctas ? ", " + std::to_string(tuning.max_ctas) + " persistent CTAs" : "")
     << (tuning.q_buffers ? ", " + std::to_string(tuning.q_buffers) + " Q buffers" : "")
     << (tuning.consumer_groups ? ", " + std::to_string(tuning.consumer_groups) + " consumer warpgroups" : "")
     << (tuning.cp_async_fill ? ", cp.async K/V" : "")
     << (tuning.transposed_stages == 0 ? "" : ", transposed tile with " + std::to_string(tuning.transposed_stages) + " stages")
     << (tuning.kv_evict_first ? "" : ", no L2 policy on K/V") << (tuning.cluster_merge ? "" : ", workspace merge")
     << (pad_tokens ? ", " + std::to_string(pad_tokens) + " padding tokens" : "")
     << (v_other_layout ? ", V with the other layout's strides" : "")
     << (contiguous_kv ? ", contiguous K/V (cu_seqlens_k)" : "")
     << "; requests (q_len/seq_len):";
  for (size_t r = 0; r < q_lens.size(); ++r) {
    if (r == 12 && q_lens.size() > 14) {
      os << " ... (" << q_lens.size() << " total)";
      break;
    }
    os << ' ' << q_lens[r] << '/' << seq_lens[r];
  }
  return os.str();
}

// ---- Problem -------------------------------------------------------------------------------

namespace {

void upload(cuda::DeviceBuffer& dst, const void* src, size_t bytes) {
  dst.resize(std::max<size_t>(bytes, 16));
  if (bytes) ATTNKIT_CUDA_CHECK(cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice));
}

}  // namespace

std::vector<float> download_as_float(const void* src, DType dtype, int64_t n) {
  std::vector<uint8_t> raw(static_cast<size_t>(n) * dtype_size(dtype));
  if (n) ATTNKIT_CUDA_CHECK(cudaMemcpy(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = load_as_float(raw.data(), dtype, i);
  return out;
}

namespace {

// Dequantised K/V values stay within ~[-1.5, 1.5]: fp8 codes of [-48, 48) times scales in
// [1/48, 1/32]; 16-bit caches hold values in [-1, 1).
constexpr float kFp8CodeAmp = 48.f;

}  // namespace

Problem::Problem(const Case& c) : c_(c) {
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 17);
  const int n = static_cast<int>(c.q_lens.size());
  cu_.assign(1, 0);
  for (int q : c.q_lens) cu_.push_back(cu_.back() + q);
  seq_ = std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end());

  // Block table: every request's blocks drawn from a shuffled pool; entries past a request's
  // blocks are invalid ids (a kernel that reads them faults).
  std::vector<int> need(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    need[r] = (seq_[r] + c.block_size - 1) / c.block_size;
    total += need[r];
  }
  max_blocks_ = std::max(1, (n ? *std::max_element(need.begin(), need.end()) : 0) + static_cast<int>(rng() % 3));
  const int64_t num_blocks = total + 1 + static_cast<int64_t>(rng() % 4);
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  table_.assign(static_cast<size_t>(n) * max_blocks_, 0);
  int64_t next = 0;
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < max_blocks_; ++b)
      table_[static_cast<size_t>(r) * max_blocks_ + b] = b < need[r] ? pool[next++] : (b % 2 ? -1 : INT32_MAX);

  spec_.num_blocks = num_blocks;
  spec_.block_size = c.block_size;
  spec_.num_kv_heads = c.num_kv_heads;
  spec_.head_size = c.head_size;
  spec_.cache_dtype = c.cache_dtype;
  spec_.layout = c.layout;
  const DType storage = spec_.storage_dtype();
  const int64_t cache_elems = spec_.total_bytes() / static_cast<int64_t>(dtype_size(storage));
  d_cache_.resize(spec_.total_bytes());
  // (nvfp4, u8 storage: random fp8 codes are random e2m1 pairs; fill_nvfp4_scales sets the scales)
  const DType fill = storage == DType::u8 ? DType::fp8_e4m3 : storage;
  fill_random_device(d_cache_.get(), fill, cache_elems, c.seed ^ 0xcac4e, is_fp8(fill) ? kFp8CodeAmp : 1.f);
  d_kv_ = cache_view(d_cache_.get(), Device::CUDA);
  if (c.cache_dtype == DType::nvfp4) fill_nvfp4_scales(need, rng);
  // The slots past each request's seq_len in its last block hold NaN (0xff bytes in every
  // cache dtype): a kernel that reads whole pages must mask them and keep them out of P V.
  if (storage != DType::u8) {
    const int64_t eb = static_cast<int64_t>(dtype_size(storage));
    for (int r = 0; r < n; ++r) {
      const int used = seq_[r] % c.block_size;
      if (used == 0) continue;
      const int32_t blk = table_[static_cast<size_t>(r) * max_blocks_ + need[r] - 1];
      for (const PagedKVSide* side : {&d_kv_.k, &d_kv_.v}) {
        char* block = static_cast<char*>(side->base) + blk * side->stride_block * eb;
        for (int h = 0; h < c.num_kv_heads; ++h)
          for (int slot = used; slot < c.block_size; ++slot)
            if (side->stride_slot == c.head_size) {  // (HND: the head's tail slots are contiguous)
              poison_device(block + (h * side->stride_head + slot * side->stride_slot) * eb,
                            (c.block_size - slot) * c.head_size * eb, nullptr);
              break;
            } else {
              poison_device(block + (h * side->stride_head + slot * side->stride_slot) * eb, c.head_size * eb, nullptr);
            }
      }
    }
  }

  const int64_t q_elems = (c.num_tokens() + c.pad_tokens) * c.num_heads() * c.head_size;
  d_q_.resize(std::max<int64_t>(q_elems * 2, 16));
  // With an fp8 cache the queries lie on the e4m3 grid: the hopper kernel's S = Q K^T quantises
  // Q to e4m3 (times a power of two: exact on these values), every other kernel reads Q as it
  // is, so one reference serves all (the rounding itself is the documented loss:
  // docs/architecture.md section 9).
  fill_random_device(d_q_.get(), c.dtype, q_elems, c.seed ^ 0x9, c.q_amp, is_fp8(c.cache_dtype));

  const int H = c.num_heads();
  scale_count_ = c.per_head_kv_scale && c.cache_dtype != DType::nvfp4 ? c.num_kv_heads : 1;  // (nvfp4: one global scale)
  const int reqs = static_cast<int>(c.q_lens.size());
  h_params_.resize(2 * H + 2 * scale_count_ + static_cast<size_t>(reqs) * H);
  std::uniform_real_distribution<float> slope(0.005f, 0.25f), sink(-1.f, 3.f), kv_scale(1.f / 48, 1.f / 32);
  for (int h = 0; h < H; ++h) h_params_[h] = slope(rng);
  for (int h = 0; h < H; ++h) h_params_[H + h] = (rng() % 8 == 0) ? -INFINITY : sink(rng);
  std::uniform_real_distribution<float> global_scale(0.25f, 0.5f);  // (nvfp4: codes x block scales are <= 11)
  for (int i = 0; i < 2 * scale_count_; ++i)
    h_params_[2 * H + i] = c.cache_dtype == DType::nvfp4 ? global_scale(rng) : kv_scale(rng);
  for (int i = 0; i < reqs * H; ++i) h_params_[2 * H + 2 * scale_count_ + i] = slope(rng);  // per request
  upload(d_params_, h_params_.data(), h_params_.size() * 4);
  upload(d_cu_, cu_.data(), cu_.size() * 4);
  upload(d_seq_, seq_.data(), seq_.size() * 4);
  upload(d_table_, table_.data(), table_.size() * 4);
  ATTNKIT_CUDA_CHECK(cudaDeviceSynchronize());  // fills done before any other stream reads them
  if (c.contiguous_kv) {  // the requests' keys gathered into rows [total_k, kv_heads, head_size]
    if (c.cache_dtype == DType::nvfp4 || c.v_other_layout)
      throw std::invalid_argument("contiguous_kv: not for nvfp4 caches or v_other_layout");
    std::vector<uint8_t> host(spec_.total_bytes());
    ATTNKIT_CUDA_CHECK(cudaMemcpy(host.data(), d_cache_.get(), host.size(), cudaMemcpyDeviceToHost));
    const PagedKV hv = cache_view(host.data(), Device::CPU);
    const int64_t eb = static_cast<int64_t>(dtype_size(storage)), row = int64_t{c.head_size} * eb;
    std::vector<int32_t> cu_k(1, 0);
    for (int r = 0; r < n; ++r) cu_k.push_back(cu_k.back() + seq_[r]);
    total_k_ = cu_k.back();
    std::vector<uint8_t> rows[2];
    for (int s = 0; s < 2; ++s) {
      const PagedKVSide& side = s == 0 ? hv.k : hv.v;
      rows[s].resize(static_cast<size_t>(std::max<int64_t>(total_k_, 1)) * c.num_kv_heads * row);
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < seq_[r]; ++j) {
          const int64_t blk = table_[static_cast<size_t>(r) * max_blocks_ + j / c.block_size], slot = j % c.block_size;
          for (int h = 0; h < c.num_kv_heads; ++h)
            std::memcpy(rows[s].data() + ((cu_k[r] + j) * c.num_kv_heads + h) * row,
                        static_cast<const uint8_t*>(side.base) +
                            (blk * side.stride_block + slot * side.stride_slot + h * side.stride_head) * eb,
                        row);
        }
    }
    upload(d_k_rows_, rows[0].data(), rows[0].size());
    upload(d_v_rows_, rows[1].data(), rows[1].size());
    upload(d_cu_k_, cu_k.data(), cu_k.size() * 4);
  }
}

// NVFP4 caches: random codes (the fill above) with block scales in [0.125, 1.875] (e4m3 codes
// 0x20..0x3f; now and then a subnormal one), and NaN scales (0xff) on the slots past each request's seq_len in its last block:
// a kernel that reads whole pages must mask them and keep them out of P V.
void Problem::fill_nvfp4_scales(const std::vector<int>& need, std::mt19937_64& rng) {
  std::vector<uint8_t> host(spec_.total_bytes());
  ATTNKIT_CUDA_CHECK(cudaMemcpy(host.data(), d_cache_.get(), host.size(), cudaMemcpyDeviceToHost));
  const PagedKV hv = cache_view(host.data(), Device::CPU);
  const int rows = c_.head_size / 16;
  for (const PagedKVSide* side : {&hv.k, &hv.v})
    for (int64_t b = 0; b < spec_.num_blocks; ++b)
      for (int slot = 0; slot < c_.block_size; ++slot)
        for (int h = 0; h < c_.num_kv_heads; ++h) {
          uint8_t* row = static_cast<uint8_t*>(side->scale_base) + b * side->scale_stride_block +
                         slot * side->scale_stride_slot + h * side->scale_stride_head;
          for (int i = 0; i < rows; ++i)  // (1 in 64: a subnormal e4m3 scale, 2^-9 .. 7 x 2^-9)
            row[i] = static_cast<uint8_t>(rng() % 64 == 0 ? 1 + rng() % 7 : 0x20 + rng() % 32);
        }
  const int n = static_cast<int>(seq_.size());
  for (int r = 0; r < n; ++r) {
    const int used = seq_[r] % c_.block_size;
    if (used == 0) continue;
    const int32_t blk = table_[static_cast<size_t>(r) * max_blocks_ + need[r] - 1];
    for (const PagedKVSide* side : {&hv.k, &hv.v})
      for (int slot = used; slot < c_.block_size; ++slot)
        for (int h = 0; h < c_.num_kv_heads; ++h)
          std::memset(static_cast<uint8_t*>(side->scale_base) + blk * side->scale_stride_block +
                          slot * side->scale_stride_slot + h * side->scale_stride_head,
                      0xff, rows);
  }
  upload(d_cache_, host.data(), host.size());
}

PagedKV Problem::cache_view(void* data, Device device) const {
  const DType storage = spec_.storage_dtype();
  const int64_t cache_elems = spec_.total_bytes() / static_cast<int64_t>(dtype_size(storage));
  PagedKV kv = spec_.view(TensorView(data, storage, {cache_elems}, device));
  if (c_.v_other_layout) {
    if (c_.cache_dtype == DType::nvfp4) throw std::invalid_argument("v_other_layout: not for nvfp4 caches");
    const int64_t nhd_slot = int64_t{c_.num_kv_heads} * c_.head_size, hnd_head = int64_t{c_.block_size} * c_.head_size;
    const bool nhd = c_.layout == KVLayout::NHD;
    kv.v.stride_slot = nhd ? c_.head_size : nhd_slot;
    kv.v.stride_head = nhd ? hnd_head : c_.head_size;
  }
  return kv;
}

AttentionParams Problem::params_on(bool device) const {
  const int H = c_.num_heads();
  float* base = device ? d_params_.as<float>() : const_cast<float*>(h_params_.data());
  const Device dev = device ? Device::CUDA : Device::CPU;
  AttentionParams p;
  p.scale = c_.scale;
  p.causal = c_.causal;
  p.window_left = c_.window_left;
  p.window_right = c_.window_right;
  p.softcap = c_.softcap;
  if (c_.alibi && c_.alibi_per_seq)
    p.alibi_slopes = TensorView(base + 2 * H + 2 * scale_count_, DType::f32,
                                {static_cast<int64_t>(c_.q_lens.size()), H}, dev);
  else if (c_.alibi)
    p.alibi_slopes = TensorView(base, DType::f32, {H}, dev);
  if (c_.sinks) p.sinks = TensorView(base + H, DType::f32, {H}, dev);
  if (is_fp8(c_.cache_dtype) || c_.cache_dtype == DType::nvfp4) {
    p.k_scale = TensorView(base + 2 * H, DType::f32, {scale_count_}, dev);
    p.v_scale = TensorView(base + 2 * H + scale_count_, DType::f32, {scale_count_}, dev);
  }
  return p;
}

flash_attn::VarlenArgs Problem::make_args(void* out, void* lse, void* workspace, size_t workspace_bytes,
                                          int num_splits) const {
  const int64_t T = c_.num_tokens() + c_.pad_tokens;
  const int H = c_.num_heads(), D = c_.head_size;
  flash_attn::VarlenArgs a;
  a.q = TensorView(d_q_.get(), c_.dtype, {T, H, D}, Device::CUDA);
  a.cache = d_kv_;
  a.out = TensorView(out, c_.dtype, {T, H, D}, Device::CUDA);
  a.cu_seqlens_q = d_cu_.as<int32_t>();
  a.seqused_k = d_seq_.as<int32_t>();
  a.block_table = d_table_.as<int32_t>();
  a.max_blocks_per_req = max_blocks_;
  if (c_.contiguous_kv) {
    const int64_t rows = std::max<int64_t>(total_k_, 1);
    a.cache = flash_attn::contiguous_kv_view(
        TensorView(d_k_rows_.get(), c_.cache_dtype, {rows, c_.num_kv_heads, c_.head_size}, Device::CUDA),
        TensorView(d_v_rows_.get(), c_.cache_dtype, {rows, c_.num_kv_heads, c_.head_size}, Device::CUDA));
    a.cu_seqlens_k = d_cu_k_.as<int32_t>();
    a.block_table = nullptr;
    a.max_blocks_per_req = 0;
  }
  a.num_reqs = static_cast<int>(c_.q_lens.size());
  a.max_query_len = c_.max_query_len();
  a.max_seq_len = c_.max_seq_len();
  a.num_heads = H;
  a.params = params_on(true);
  if (lse) a.params.lse = TensorView(lse, DType::f32, {H, T}, Device::CUDA);
  a.num_splits = num_splits;
  a.generation = c_.generation;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  return a;
}

flash_attn::LaunchPlan Problem::launch_plan(int num_splits, const flash_attn::LaunchTuning& tuning) const {
  // (The facts read no buffer contents: placeholders of the right alignment and size serve.)
  const int64_t T = c_.num_tokens() + c_.pad_tokens;
  const size_t ws_bytes = flash_attn::varlen_workspace_bytes(T, c_.num_heads(), c_.head_size, num_splits);
  void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const flash_attn::VarlenArgs a = make_args(fake, c_.want_lse ? fake : nullptr, ws_bytes ? fake : nullptr, ws_bytes,
                                             num_splits);
  return flash_attn::choose_launch(flash_attn::varlen_launch_facts(a), tuning);
}

bool Problem::hopper_serves() const {
  return launch_plan(1, {}).generation == flash_attn::Generation::hopper;
}

std::vector<Problem::Variant> Problem::launch_variants(int num_splits) const {
  std::vector<Variant> v{{"the case's tuning", c_.tuning}};
  const flash_attn::LaunchPlan plan = launch_plan(num_splits, c_.tuning);
  if (plan.config.fill == flash_attn::KvFill::tma) {
    v.push_back({"cp.async K/V instead of the " + std::string(plan.config.name) + " tile's TMA", c_.tuning});
    v.back().tuning.cp_async_fill = true;
  }
  if (plan.kv_evict_first) {
    v.push_back({"K/V without the evict-first L2 policy", c_.tuning});
    v.back().tuning.kv_evict_first = false;
  }
  if (plan.cluster_merge) {
    v.push_back({"split merge through the workspace instead of the cluster", c_.tuning});
    v.back().tuning.cluster_merge = false;
  }
  return v;
}

void Problem::overwrite_device_metadata(const std::vector<int32_t>& cu, const std::vector<int32_t>& seq,
                                        const std::vector<int32_t>& table) const {
  if (cu.size() != cu_.size() || seq.size() != seq_.size() || table.size() != table_.size())
    throw std::invalid_argument("overwrite_device_metadata: the sizes must stay");
  ATTNKIT_CUDA_CHECK(cudaMemcpy(d_cu_.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(d_seq_.get(), seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
  if (!table.empty()) ATTNKIT_CUDA_CHECK(cudaMemcpy(d_table_.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
}

Result Problem::run_kernel(int num_splits) const {
  const int64_t real = c_.num_tokens(), T = real + c_.pad_tokens;
  const int H = c_.num_heads(), D = c_.head_size;
  cuda::DeviceBuffer out(std::max<int64_t>(T * H * D * 2, 16)), lse(std::max<int64_t>(T * H * 4, 16));
  const size_t ws_bytes = flash_attn::varlen_workspace_bytes(T, H, D, num_splits);
  cuda::DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
  flash_attn::VarlenArgs a =
      make_args(out.get(), c_.want_lse ? lse.get() : nullptr, ws_bytes ? ws.get() : nullptr, ws_bytes, num_splits);
  cudaStream_t stream;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  a.stream = stream;
  try {
    poison_device(out.get(), T * H * D * 2, stream);
    poison_device(lse.get(), T * H * 4, stream);
    poison_device(ws.get(), static_cast<int64_t>(ws_bytes), stream);
    // Only the counters must start at 0: the partials stay poisoned (the kernel needs no more).
    flash_attn::varlen_workspace_init(a.workspace, a.workspace_bytes, stream);
    flash_attn::run_varlen_attention(a, c_.tuning);
    ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  ATTNKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  Result r;
  std::vector<float> all_out = download_as_float(out.get(), c_.dtype, T * H * D);
  r.out.assign(all_out.begin(), all_out.begin() + real * H * D);
  const auto poisoned = [](float x) { return std::isnan(x); };  // 0xff bytes read as NaN
  r.padding_untouched = std::all_of(all_out.begin() + real * H * D, all_out.end(), poisoned);
  if (c_.want_lse) {
    const std::vector<float> all_lse = download_as_float(lse.get(), DType::f32, T * H);
    for (int h = 0; h < H; ++h) {
      r.lse.insert(r.lse.end(), all_lse.begin() + h * T, all_lse.begin() + h * T + real);
      r.padding_untouched = r.padding_untouched && std::all_of(all_lse.begin() + h * T + real,
                                                               all_lse.begin() + (h + 1) * T, poisoned);
    }
  }
  return r;
}

Result Problem::run_cpu_reference() const {
  const int64_t T = c_.num_tokens();
  const int H = c_.num_heads(), D = c_.head_size;
  if (h_cache_.empty()) {
    h_cache_.resize(spec_.total_bytes());
    ATTNKIT_CUDA_CHECK(cudaMemcpy(h_cache_.data(), d_cache_.get(), h_cache_.size(), cudaMemcpyDeviceToHost));
    h_q_.resize(T * H * D * 2);
    if (!h_q_.empty()) ATTNKIT_CUDA_CHECK(cudaMemcpy(h_q_.data(), d_q_.get(), h_q_.size(), cudaMemcpyDeviceToHost));
  }
  const PagedKV kv = cache_view(h_cache_.data(), Device::CPU);
  BatchView batch;
  batch.query_start_loc = cu_;
  batch.seq_lens = seq_;
  batch.block_table = table_;
  batch.max_blocks_per_req = max_blocks_;
  Result r;
  r.out.assign(T * H * D, 0.f);
  r.lse.assign(T * H, 0.f);
  AttentionParams p = params_on(false);
  p.lse = TensorView(r.lse.data(), DType::f32, {H, T});
  reference_attention(TensorView(h_q_.data(), c_.dtype, {T, H, D}), kv, batch, p,
                      TensorView(r.out.data(), DType::f32, {T, H, D}), true);
  return r;
}

void Problem::run_gpu_reference(const std::vector<RefRow>& rows, std::vector<float>& out,
                                std::vector<float>& lse) const {
  const int64_t T = c_.num_tokens();
  GpuBatch b{d_cu_.as<int32_t>(), d_seq_.as<int32_t>(), d_table_.as<int32_t>(), max_blocks_};
  gpu_reference_rows(TensorView(d_q_.get(), c_.dtype, {T, c_.num_heads(), c_.head_size}, Device::CUDA), d_kv_, b,
                     params_on(true), rows, std::max(1, c_.max_seq_len()), out, lse);
}

void Problem::gather_rows(const Result& r, const std::vector<RefRow>& rows, std::vector<float>& out,
                          std::vector<float>& lse) const {
  const int H = c_.num_heads(), D = c_.head_size;
  const int64_t T = c_.num_tokens();
  out.assign(rows.size() * D, 0.f);
  lse.assign(r.lse.empty() ? 0 : rows.size(), 0.f);
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t base = (static_cast<int64_t>(rows[k].token) * H + rows[k].head) * D;
    std::copy(r.out.begin() + base, r.out.begin() + base + D, out.begin() + static_cast<int64_t>(k) * D);
    if (!r.lse.empty()) lse[k] = r.lse[static_cast<int64_t>(rows[k].head) * T + rows[k].token];
  }
}

std::vector<RefRow> Problem::sample_rows(int random_tokens, uint64_t seed) const {
  std::mt19937_64 rng(seed);
  std::vector<RefRow> rows;
  for (int r = 0; r + 1 < static_cast<int>(cu_.size()); ++r) {
    const int q_len = cu_[r + 1] - cu_[r];
    if (q_len == 0) continue;
    std::set<int> tokens{cu_[r], cu_[r + 1] - 1};
    for (int i = 0; i < random_tokens; ++i) tokens.insert(cu_[r] + static_cast<int>(rng() % q_len));
    for (int t : tokens)
      for (int h = 0; h < c_.num_heads(); ++h) rows.push_back({t, h, r});
  }
  return rows;
}

// ---- comparisons ---------------------------------------------------------------------------

bool fp8_wgmma(const flash_attn::LaunchPlan& plan, DType cache) {
  return plan.generation == flash_attn::Generation::hopper && is_fp8(cache);
}

::testing::AssertionResult outputs_match(DType dtype, const std::vector<float>& actual,
                                         const std::vector<float>& expected,
                                         const std::vector<int64_t>& shape, bool fp8) {
  // bf16 keeps 8 significant bits: P (rounded to bf16 before P V) and the output each add
  // ~2^-9 relative error; f16 keeps 11. fp8 GEMMs: P rounded to e4m3 (fp8_wgmma).
  if (fp8) return all_close(actual, expected, shape, 2e-2, 5e-2);
  const double tol = dtype == DType::bf16 ? 1e-2 : 2e-3;
  return all_close(actual, expected, shape, tol, tol);
}

::testing::AssertionResult lse_match(const std::vector<float>& actual, const std::vector<float>& expected,
                                     const std::vector<int64_t>& shape, bool fp8) {
  return all_close(actual, expected, shape, fp8 ? 1e-3 : 1e-4, 2e-3);
}

}  // namespace attnkit::test
