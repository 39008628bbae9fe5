// Decode context parallelism on two GPUs, one process per GPU (issue 23's two-GPU test and
// benchmark; the machine: nvidia-h200-x2, NVLink multicast left off). DcpTwoGpus spawns this
// binary twice (DcpTwoGpusRank, rank and NCCL id in the environment); each rank holds every
// request's keys on it (interleave 16 = the block size: whole blocks, global block b on rank
// b % 2), runs the FlashAttention-style decode over them (its partial and LSE), combines both
// ways over NCCL and checks its head slice against the unsharded decode of the whole cache on
// its own GPU. Then it times each combine path (batch 64, 32 heads, head size 128) and the sharded
// decode of 1 x 128k against the unsharded one, and prints them ("[ dcp-bench ]" lines).
// Skipped with fewer than two GPUs or without NCCL in the build.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attention_case.h"
#include "attnkit/dcp.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "device_fill.h"
#include "cuda/device_props.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_launch.h"

#if defined(ATTNKIT_TEST_NCCL)
#include <nccl.h>
#endif

extern char** environ;

namespace attnkit::test {
namespace {

constexpr int kBlock = 16, kHkv = 8, kH = 32, kD = 128;

#if defined(ATTNKIT_TEST_NCCL)
void nccl_ok(ncclResult_t r) { ASSERT_EQ(r, ncclSuccess) << ncclGetErrorString(r); }

// One decode batch (b requests of `ctx` keys) on this rank: the full cache and the rank's blocks.
struct Decode {
  int b = 0, ctx = 0, blocks_per_req = 0;
  cuda::DeviceBuffer q, full, local, cu, seq_full, seq_local, table_full, table_local, out, lse;
  int64_t local_blocks = 0;
};

Decode make_decode(int b, int ctx, int rank, uint64_t seed) {
  Decode d;
  d.b = b;
  d.ctx = ctx;
  d.blocks_per_req = (ctx + kBlock - 1) / kBlock;
  const int64_t block_bytes = int64_t{2} * kBlock * kHkv * kD * 2;  // [2][16][Hkv][D] bf16
  const int64_t blocks = int64_t{b} * d.blocks_per_req;
  d.q.resize(int64_t{b} * kH * kD * 2);
  fill_random_device(d.q.get(), DType::bf16, int64_t{b} * kH * kD, seed, 1.f);
  d.full.resize(blocks * block_bytes);
  fill_random_device(d.full.get(), DType::bf16, blocks * block_bytes / 2, seed + 1, 1.f);
  // Request r's global block j is full block r * blocks_per_req + j; it lives on rank j % 2 as
  // that rank's local block j / 2 of the request.
  const int local_per_req = (d.blocks_per_req + 1 - rank) / 2;
  d.local_blocks = std::max<int64_t>(int64_t{b} * local_per_req, 1);
  d.local.resize(d.local_blocks * block_bytes);
  std::vector<int32_t> cu(b + 1), sf(b), sl(b), tf(blocks), tl(int64_t{b} * std::max(local_per_req, 1), 0);
  for (int r = 0; r <= b; ++r) cu[r] = r;
  for (int r = 0; r < b; ++r) {
    sf[r] = ctx;
    sl[r] = static_cast<int32_t>(dcp_local_len(ctx, DcpShard{2, rank, kBlock}));
    for (int j = 0; j < d.blocks_per_req; ++j) tf[int64_t{r} * d.blocks_per_req + j] = r * d.blocks_per_req + j;
    for (int j = rank, i = 0; j < d.blocks_per_req; j += 2, ++i) {
      const int64_t dst = int64_t{r} * local_per_req + i;
      tl[int64_t{r} * std::max(local_per_req, 1) + i] = static_cast<int32_t>(dst);
      ATTNKIT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(d.local.get()) + dst * block_bytes,
                                    static_cast<char*>(d.full.get()) + (int64_t{r} * d.blocks_per_req + j) * block_bytes,
                                    block_bytes, cudaMemcpyDeviceToDevice));
    }
  }
  auto up = [](cuda::DeviceBuffer& buf, const std::vector<int32_t>& v) {
    buf.resize(std::max<size_t>(v.size() * 4, 16));
    ATTNKIT_CUDA_CHECK(cudaMemcpy(buf.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  };
  up(d.cu, cu);
  up(d.seq_full, sf);
  up(d.seq_local, sl);
  up(d.table_full, tf);
  up(d.table_local, tl);
  d.out.resize(int64_t{b} * kH * kD * 2);
  d.lse.resize(int64_t{b} * kH * 4);
  return d;
}

// The decode over the full cache (sharded = false) or the rank's blocks, out / lse of d.
void run_decode(Decode& d, bool sharded, int rank, cudaStream_t stream, cuda::DeviceBuffer& ws) {
  const int local_per_req = (d.blocks_per_req + 1 - rank) / 2;
  flash_attn::VarlenArgs a;
  a.q = TensorView(d.q.get(), DType::bf16, {d.b, kH, kD}, Device::CUDA);
  KVCacheSpec spec;
  spec.num_blocks = sharded ? d.local_blocks : int64_t{d.b} * d.blocks_per_req;
  spec.block_size = kBlock;
  spec.num_kv_heads = kHkv;
  spec.head_size = kD;
  spec.cache_dtype = DType::bf16;
  a.cache = spec.view(TensorView(sharded ? d.local.get() : d.full.get(), DType::bf16,
                                 {spec.num_blocks, 2, kBlock, kHkv, kD}, Device::CUDA));
  a.out = TensorView(d.out.get(), DType::bf16, {d.b, kH, kD}, Device::CUDA);
  a.cu_seqlens_q = d.cu.as<int32_t>();
  a.seqused_k = (sharded ? d.seq_local : d.seq_full).as<int32_t>();
  a.block_table = (sharded ? d.table_local : d.table_full).as<int32_t>();
  a.max_blocks_per_req = sharded ? std::max(local_per_req, 1) : d.blocks_per_req;
  a.num_reqs = d.b;
  a.max_query_len = 1;
  a.max_seq_len = sharded ? static_cast<int>(dcp_local_len(d.ctx, DcpShard{2, rank, kBlock})) : d.ctx;
  a.num_heads = kH;
  a.params.lse = TensorView(d.lse.get(), DType::f32, {kH, d.b}, Device::CUDA);
  // The builder's split rule for this batch (uniform lengths), its workspace zeroed once.
  flash_attn::SplitKVInput in;
  in.num_heads = kH;
  in.num_kv_heads = kHkv;
  in.num_sms = cuda::current_device_props().sm_count;
  in.head_size = kD;
  in.cc_major = 9;
  in.hopper_kernels = flash_attn::hopper_kernels_available();
  a.num_splits = flash_attn::decide_num_splits_uniform(d.b, 1, a.max_seq_len, in).num_splits;
  const size_t need = flash_attn::varlen_workspace_bytes(d.b, kH, kD, a.num_splits);
  if (ws.bytes() < need) {
    ws.resize(need);
    flash_attn::varlen_workspace_init(ws.get(), ws.bytes(), stream);
  }
  a.workspace = need > 0 ? ws.get() : nullptr;
  a.workspace_bytes = need > 0 ? ws.bytes() : 0;
  a.stream = stream;
  flash_attn::run_varlen_attention(a);
}

void rank_main(int rank, const ncclUniqueId& id) {
  ATTNKIT_CUDA_CHECK(cudaSetDevice(rank));
  ncclComm_t comm;
  nccl_ok(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t stream;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::DeviceBuffer ws(16);
  for (const auto& [b, ctx] : std::vector<std::pair<int, int>>{{1, 8192}, {8, 32768}, {64, 8192}, {1, 131072}}) {
    for (DcpCombinePath path : {DcpCombinePath::all_gather_reduce_scatter, DcpCombinePath::all_to_all}) {
      SCOPED_TRACE("rank " + std::to_string(rank) + ", batch " + std::to_string(b) + " x " + std::to_string(ctx) +
                   (path == DcpCombinePath::all_to_all ? ", all-to-all" : ", all-gather + reduce-scatter"));
      Decode d = make_decode(b, ctx, rank, 1234 + b);
      run_decode(d, false, rank, stream, ws);  // the unsharded result
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> full = download_as_float(d.out.get(), DType::bf16, int64_t{b} * kH * kD);
      run_decode(d, true, rank, stream, ws);  // the rank's partial
      cuda::DeviceBuffer out(int64_t{b} * (kH / 2) * kD * 2), combine_ws(dcp_combine_workspace_bytes(b, kH, kD, 2, path) + 16);
      DcpCombineArgs c;
      c.partial_out = TensorView(d.out.get(), DType::bf16, {b, kH, kD}, Device::CUDA);
      c.partial_lse = TensorView(d.lse.get(), DType::f32, {kH, b}, Device::CUDA);
      c.out = TensorView(out.get(), DType::bf16, {b, kH / 2, kD}, Device::CUDA);
      c.shard = {2, rank, kBlock};
      c.path = path;
      c.nccl_comm = comm;
      c.workspace = combine_ws.get();
      c.workspace_bytes = combine_ws.bytes();
      c.stream = stream;
      dcp_combine(c);
      ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> got = download_as_float(out.get(), DType::bf16, int64_t{b} * (kH / 2) * kD);
      std::vector<float> exp(got.size());
      for (int t = 0; t < b; ++t)
        for (int hh = 0; hh < kH / 2; ++hh)
          for (int e = 0; e < kD; ++e)
            exp[(int64_t{t} * (kH / 2) + hh) * kD + e] = full[(int64_t{t} * kH + rank * (kH / 2) + hh) * kD + e];
      EXPECT_TRUE(outputs_match(DType::bf16, got, exp, {b, kH / 2, kD}));
      // Timing: the combine alone, and (the last shape) the sharded decode + combine against
      // the unsharded decode on one GPU.
      cudaEvent_t e0, e1;
      ATTNKIT_CUDA_CHECK(cudaEventCreate(&e0));
      ATTNKIT_CUDA_CHECK(cudaEventCreate(&e1));
      auto time_us = [&](auto&& fn) {
        for (int i = 0; i < 3; ++i) fn();
        ATTNKIT_CUDA_CHECK(cudaEventRecord(e0, stream));
        for (int i = 0; i < 20; ++i) fn();
        ATTNKIT_CUDA_CHECK(cudaEventRecord(e1, stream));
        ATTNKIT_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.f;
        ATTNKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return 1000.0 * ms / 20;
      };
      const double combine_us = time_us([&] { dcp_combine(c); });
      const double sharded_us = time_us([&] {
        run_decode(d, true, rank, stream, ws);
        dcp_combine(c);
      });
      const double one_gpu_us = time_us([&] { run_decode(d, false, rank, stream, ws); });
      if (rank == 0)
        std::printf("[ dcp-bench ] batch %d x %d, %s: combine %.1f us; sharded decode + combine %.1f us; one GPU %.1f us "
                    "(%.2fx)\n",
                    b, ctx, path == DcpCombinePath::all_to_all ? "all-to-all" : "all-gather + reduce-scatter", combine_us,
                    sharded_us, one_gpu_us, one_gpu_us / sharded_us);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
}
#endif

TEST(DcpTwoGpusRank, Run) {
  const char* r = std::getenv("ATTNKIT_DCP_RANK");
  if (r == nullptr) GTEST_SKIP() << "(a rank process of DcpTwoGpus)";
#if defined(ATTNKIT_TEST_NCCL)
  ncclUniqueId id;
  const std::string hex = std::getenv("ATTNKIT_DCP_NCCL_ID");
  ASSERT_EQ(hex.size(), 2 * sizeof id.internal);
  for (size_t i = 0; i < sizeof id.internal; ++i) id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  rank_main(std::atoi(r), id);
#endif
}

TEST(DcpTwoGpus, BothCombinePathsMatchOneGpu) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs two GPUs (nvidia-h200-x2)";
#if !defined(ATTNKIT_TEST_NCCL)
  GTEST_SKIP() << "this build has no NCCL";
#else
  ncclUniqueId id;
  nccl_ok(ncclGetUniqueId(&id));
  std::string hex;
  for (char ch : id.internal) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(ch));
    hex += buf;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env_s = {"ATTNKIT_DCP_RANK=" + std::to_string(rank), "ATTNKIT_DCP_NCCL_ID=" + hex,
                                      "NCCL_NVLS_ENABLE=0"};
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    std::vector<char*> env;
    for (auto& s : env_s) env.push_back(s.data());
    env.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=DcpTwoGpusRank.Run";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank process " << pid << " status " << status;
  }
#endif
}

}  // namespace
}  // namespace attnkit::test
