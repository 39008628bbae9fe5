#include "attention_setup.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "bench_util.h"

#include "cuda/cuda_check.h"
#include "cuda/device_props.h"
#include "flash_attn/split_kv.h"

namespace attnkit::bench {

UniformBatch make_uniform_batch(int num_reqs, int q_len, int kv_len, int block_size,
                                int64_t first_block, uint64_t seed, cudaStream_t stream) {
  UniformBatch b;
  b.num_reqs = num_reqs;
  b.q_len = q_len;
  b.kv_len = kv_len;
  b.blocks_per_req = (kv_len + block_size - 1) / block_size;
  const int64_t total = int64_t{num_reqs} * b.blocks_per_req;
  std::vector<int32_t> table(total);
  std::iota(table.begin(), table.end(), static_cast<int32_t>(first_block));
  std::shuffle(table.begin(), table.end(), std::mt19937_64(seed));
  std::vector<int32_t> cu(num_reqs + 1), used(num_reqs, kv_len);
  for (int i = 0; i <= num_reqs; ++i) cu[i] = i * q_len;
  b.cu_seqlens_q.resize(cu.size() * 4);
  b.seqused_k.resize(used.size() * 4);
  b.block_table.resize(table.size() * 4);
  // Synchronous copies: the host vectors die at return.
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(b.cu_seqlens_q.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(b.seqused_k.get(), used.data(), used.size() * 4, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(b.block_table.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  return b;
}

PagedKV pool_view(const KVCacheSpec& spec, void* storage) {
  const int64_t elems = spec.total_bytes() / static_cast<int64_t>(dtype_size(spec.storage_dtype()));
  return spec.view(TensorView(storage, spec.storage_dtype(), {elems}, Device::CUDA));
}

cuda::DeviceBuffer split_workspace(size_t bytes, cudaStream_t stream) {
  cuda::DeviceBuffer ws(std::max<size_t>(bytes, 16));
  flash_attn::varlen_workspace_init(ws.get(), ws.bytes(), stream);
  return ws;
}

flash_attn::VarlenArgs varlen_args(const UniformBatch& b, const PagedKV& cache, void* q, void* out,
                                   int num_heads, int head_size, bool causal, cudaStream_t stream) {
  flash_attn::VarlenArgs a;
  const int64_t tokens = int64_t{b.num_reqs} * b.q_len;
  a.q = TensorView(q, DType::bf16, {tokens, num_heads, head_size}, Device::CUDA);
  a.out = TensorView(out, DType::bf16, {tokens, num_heads, head_size}, Device::CUDA);
  a.cache = cache;
  a.cu_seqlens_q = b.cu_seqlens_q.as<const int32_t>();
  a.seqused_k = b.seqused_k.as<const int32_t>();
  a.block_table = b.block_table.as<const int32_t>();
  a.max_blocks_per_req = b.blocks_per_req;
  a.num_reqs = b.num_reqs;
  a.max_query_len = b.q_len;
  a.max_seq_len = b.kv_len;
  a.num_heads = num_heads;
  a.params.scale = 1.f / std::sqrt(static_cast<float>(head_size));
  a.params.causal = causal;
  a.stream = stream;
  return a;
}

namespace {

// Call i's tuning: tunings[i % size], or the defaults when there are none.
const flash_attn::LaunchTuning& tuning_of(const std::vector<flash_attn::LaunchTuning>& tunings, int i) {
  static const flash_attn::LaunchTuning kDefault;
  return tunings.empty() ? kDefault : tunings[i % tunings.size()];
}

// `calls` launches rotating over `args`, run once eagerly (module load, first-launch setup) and
// then captured as one CUDA graph; throws when the capture fails.
cudaGraphExec_t capture_rotating(const std::vector<flash_attn::VarlenArgs>& args, int calls, cudaStream_t stream,
                                 const std::vector<flash_attn::LaunchTuning>& tunings,
                                 const std::function<void(int)>& call = {}) {
  auto enqueue = [&] {
    for (int i = 0; i < calls; ++i)
      if (call) call(i);
      else flash_attn::run_varlen_attention(args[i % args.size()], tuning_of(tunings, i));
  };
  enqueue();
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  ATTNKIT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ATTNKIT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ATTNKIT_CUDA_CHECK(inst);
  return exec;
}

}  // namespace

GraphTiming time_rotating(const std::vector<flash_attn::VarlenArgs>& args, int calls, cudaStream_t stream,
                          const std::vector<flash_attn::LaunchTuning>& tunings) {
  GraphTiming t;
  cudaGraphExec_t exec = nullptr;
  try {
    exec = capture_rotating(args, calls, stream, tunings);
  } catch (const std::exception& e) {
    std::printf("decode: graph capture failed (%s); timing eager back-to-back launches\n", e.what());
    cudaGetLastError();
  }
  if (exec) {
    t.ms_per_call = time_ms([&] { ATTNKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, stream, 1, 5) / calls;
    cudaGraphExecDestroy(exec);
  } else {
    t.graph = false;
    t.ms_per_call = time_ms([&] {
      for (int i = 0; i < calls; ++i) flash_attn::run_varlen_attention(args[i % args.size()], tuning_of(tunings, i));
    }, stream, 0, 5) / calls;
  }
  return t;
}

std::vector<double> time_interleaved(const std::vector<TimedLaunch>& launches, cudaStream_t stream, int reps) {
  const size_t n = launches.size();
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  cudaEvent_t a = nullptr, b = nullptr;
  auto release = [&] {
    for (cudaGraphExec_t e : execs)
      if (e) cudaGraphExecDestroy(e);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
  };
  std::vector<std::vector<float>> samples(n);
  try {
    for (size_t c = 0; c < n; ++c) {
      execs[c] = capture_rotating(launches[c].args, launches[c].calls, stream, {launches[c].tuning}, launches[c].call);
      ATTNKIT_CUDA_CHECK(cudaGraphLaunch(execs[c], stream));  // one warm replay
    }
    ATTNKIT_CUDA_CHECK(cudaEventCreate(&a));
    ATTNKIT_CUDA_CHECK(cudaEventCreate(&b));
    for (int r = 0; r < reps; ++r)
      for (size_t k = 0; k < n; ++k) {
        const size_t c = (k + static_cast<size_t>(r)) % n;
        ATTNKIT_CUDA_CHECK(cudaEventRecord(a, stream));
        ATTNKIT_CUDA_CHECK(cudaGraphLaunch(execs[c], stream));
        ATTNKIT_CUDA_CHECK(cudaEventRecord(b, stream));
        ATTNKIT_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        ATTNKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        samples[c].push_back(ms / launches[c].calls);
      }
  } catch (...) {
    release();
    throw;
  }
  release();
  std::vector<double> med(n);
  for (size_t c = 0; c < n; ++c) {
    std::sort(samples[c].begin(), samples[c].end());
    med[c] = samples[c][samples[c].size() / 2];
  }
  return med;
}

DecodeBuffers make_decode_buffers(int64_t max_pool, int64_t keep_free, int max_batch, int num_heads, int head_size,
                                  cudaStream_t stream) {
  DecodeBuffers b;
  size_t free_bytes = 0, total_bytes = 0;
  ATTNKIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  b.pool_bytes = std::min<int64_t>(max_pool, static_cast<int64_t>(free_bytes) - keep_free);
  if (b.pool_bytes <= 0) return b;
  b.pool.resize(b.pool_bytes);
  const int64_t qo_bytes = int64_t{max_batch} * num_heads * head_size * 2;
  b.q.resize(qo_bytes);
  b.out.resize(qo_bytes);
  b.scale.resize(4);
  fill_random(b.q.get(), qo_bytes / 2, DType::bf16, 31, stream);
  const float kv_scale = 1.f / 16;
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(b.scale.get(), &kv_scale, 4, cudaMemcpyHostToDevice, stream));
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // (kv_scale is a host local)
  return b;
}

KVCacheSpec decode_pool_spec(DType cache_dtype, int64_t pool_bytes, int block_size, int num_kv_heads,
                             int head_size) {
  KVCacheSpec spec;
  spec.block_size = block_size;
  spec.num_kv_heads = num_kv_heads;
  spec.head_size = head_size;
  spec.cache_dtype = cache_dtype;
  spec.num_blocks = 1;
  const int64_t row_bytes = spec.row_elems() * static_cast<int64_t>(dtype_size(spec.storage_dtype()));
  spec.num_blocks = pool_bytes / (2 * int64_t{block_size} * num_kv_heads * row_bytes);
  return spec;
}

DecodeShape make_decode_shape(int batch, int kv_len, const KVCacheSpec& spec, const PagedKV& cache,
                              void* q, void* out, const float* fp8_scale, int num_heads, size_t l2_bytes,
                              cudaStream_t stream) {
  DecodeShape d;
  const int block = spec.block_size;
  const int64_t blocks_per_inst = int64_t{batch} * ((kv_len + block - 1) / block);
  // (a row's bytes in the cache: nvfp4 rows are head_size / 2 packed bytes + head_size / 16 scales)
  const double row_bytes = double(spec.row_elems()) * dtype_size(spec.storage_dtype());
  d.kv_bytes = double(batch) * kv_len * spec.num_kv_heads * 2 * row_bytes;
  d.bytes = d.kv_bytes + 2.0 * batch * num_heads * spec.head_size * 2;
  const int64_t fit = spec.num_blocks / blocks_per_inst;
  if (fit < 1) throw std::runtime_error("pool too small for one instance");
  const int64_t rot = std::min<int64_t>(fit, std::max<int64_t>(1, std::llround(std::ceil(8.0 * l2_bytes / d.kv_bytes))));
  const double est_ms = d.bytes / 4.0e9 + 0.005;
  d.calls = static_cast<int>(std::clamp<int64_t>(std::max<int64_t>(rot, std::llround(std::ceil(4.0 / est_ms))), 3, 512));
  for (int64_t r = 0; r < std::min<int64_t>(rot, d.calls); ++r) {
    d.instances.push_back(std::make_unique<UniformBatch>(
        make_uniform_batch(batch, 1, kv_len, block, r * blocks_per_inst, 1000 + r, stream)));
    flash_attn::VarlenArgs a = varlen_args(*d.instances.back(), cache, q, out, num_heads, spec.head_size, true, stream);
    if (fp8_scale) {
      a.params.k_scale = TensorView(const_cast<float*>(fp8_scale), DType::f32, {1}, Device::CUDA);
      a.params.v_scale = TensorView(const_cast<float*>(fp8_scale), DType::f32, {1}, Device::CUDA);
    }
    d.args.push_back(a);
  }
  return d;
}

int builder_num_splits(int num_reqs, int q_len, int kv_len, int num_heads, int num_kv_heads,
                       DType cache_dtype, int sm_count, int head_size) {
  flash_attn::SplitKVInput in;
  in.num_heads = num_heads;
  in.num_kv_heads = num_kv_heads;
  in.num_sms = sm_count;
  in.cache_dtype = cache_dtype;
  in.head_size = head_size;
  in.cc_major = cuda::current_device_props().cc_major;
  in.hopper_kernels = flash_attn::hopper_kernels_available();
  return flash_attn::decide_num_splits_uniform(num_reqs, q_len, kv_len, in).num_splits;
}

flashinfer::PlanConfig planned_config(int num_kv_heads, int group_size, int head_size, int page_size) {
  flashinfer::PlanConfig cfg;
  cfg.kernel = flashinfer::PlanKernel::TensorCore;
  cfg.num_kv_heads = num_kv_heads;
  cfg.group_size = group_size;
  cfg.head_size = head_size;
  cfg.page_size = page_size;
  cfg.num_slots = flashinfer::num_slots_for(cuda::current_device_props().sm_count, num_kv_heads);
  return cfg;
}

namespace {

std::vector<int32_t> download_i32(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<int32_t> h(n);
  ATTNKIT_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

std::unique_ptr<PlannedPart> plan_part(const UniformBatch& b, const flash_attn::VarlenArgs& a, int page, bool ragged,
                                       const cuda::DeviceBuffer& workspace, cudaStream_t stream) {
  auto p = std::make_unique<PlannedPart>();
  const int n = b.num_reqs;
  ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // (the arrays' uploads and overwrites are done)
  p->qo = download_i32(b.cu_seqlens_q, n + 1);
  p->kv = download_i32(b.seqused_k, n);
  if (ragged) {
    std::vector<int32_t> kv_indptr{0};
    for (int32_t l : p->kv) kv_indptr.push_back(kv_indptr.back() + l);
    const flashinfer::RaggedPages rp = flashinfer::ragged_pages(kv_indptr);
    p->pages = flashinfer::PageTable(n, std::max<int64_t>(1, static_cast<int64_t>(rp.indices.size())));
    p->pages.assign(rp.indptr, rp.indices, rp.last_page_len, flashinfer::kRaggedPageRows);
    page = flashinfer::kRaggedPageRows;
  } else {
    const std::vector<int32_t> table = download_i32(b.block_table, static_cast<size_t>(n) * b.blocks_per_req);
    p->pages = flashinfer::PageTable(n, static_cast<int64_t>(table.size()));
    p->pages.fill(BatchView{p->qo, p->kv, table, b.blocks_per_req}, 0, n, page);
  }
  const int kv_heads = a.cache.num_kv_heads;
  const flashinfer::PlanConfig cfg = planned_config(kv_heads, a.num_heads / kv_heads, static_cast<int>(a.q.size(2)), page);
  p->plan = flashinfer::PlanBuffers(cfg, flashinfer::PlanCapacity::for_limits(cfg, n, p->qo.back()));
  p->batch.qo_indptr = p->qo;
  p->batch.kv_lens = p->kv;
  p->batch.causal = a.params.causal;
  flashinfer::plan_batch(p->batch, p->plan);
  const size_t plan_bytes = flashinfer::DevicePlanLayout(p->plan.capacity, cfg.group_size, p->pages.num_pages).bytes();
  p->plan_copy = cuda::DeviceBuffer(plan_bytes);
  p->dev = std::make_unique<flashinfer::DevicePlan>(p->plan.capacity, cfg.group_size, p->pages.num_pages,
                                                    p->plan_copy.get(), plan_bytes);
  p->dev->upload(p->plan, p->pages, p->batch, stream);
  p->args.q = a.q;
  p->args.out = a.out;
  p->args.cache = a.cache;
  p->args.params = a.params;
  p->args.workspace = workspace.get();
  p->args.workspace_bytes = workspace.bytes();
  p->args.stream = stream;
  return p;
}

std::vector<double> eager_in_turns(const std::vector<std::function<void(int)>>& calls_of, int calls,
                                   cudaStream_t stream, int reps) {
  cudaEvent_t a, b;
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&a));
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<std::vector<double>> ms(calls_of.size());
  for (const auto& f : calls_of) f(0);  // (warm-up)
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < calls_of.size(); ++k) {
      const size_t c = (k + static_cast<size_t>(r)) % calls_of.size();
      ATTNKIT_CUDA_CHECK(cudaEventRecord(a, stream));
      for (int i = 0; i < calls; ++i) calls_of[c](i);
      ATTNKIT_CUDA_CHECK(cudaEventRecord(b, stream));
      ATTNKIT_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      ATTNKIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms[c].push_back(t / calls);
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<double> med;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

}  // namespace attnkit::bench
