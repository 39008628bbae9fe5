"""attnkit.AttentionLayer: the engine path (selector -> builder -> impl) on the CPU: write a
mixed batch's K/V into a physically shaped cache, build metadata, run forward, compare with the
plain-Python oracle."""

import numpy as np
import pytest

import attnkit
import pyref
from helpers import assert_close


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_forward(layout, heads, dtype):
    H, Hkv, D, bs = heads[0], heads[1], 32, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, np.dtype(dtype).name, block_size=bs, layout=layout, lse=True)
    assert layer.backend == "reference" and layer.variant
    rng = np.random.default_rng(H + Hkv)
    kv_lens, q_lens = [9, 33, 20], [1, 1, 20]  # two decodes, one fresh prefill
    cache = np.zeros(layer.kv_cache_physical_shape(10), dtype)
    table = np.array([[7, 0, 0], [2, 5, 9], [4, 1, 0]], np.int32)
    # Write every request's keys (the earlier tokens too, like an engine's previous steps).
    keys = [rng.standard_normal((n, Hkv, D)).astype(dtype) for n in kv_lens]
    vals = [rng.standard_normal((n, Hkv, D)).astype(dtype) for n in kv_lens]
    for r, n in enumerate(kv_lens):
        slots = np.array([table[r, p // bs] * bs + p % bs for p in range(n)], np.int64)
        attnkit.write_kv(keys[r], vals[r], cache, slots, layout=layout)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    new_slots = np.concatenate([[table[r, p // bs] * bs + p % bs for p in range(n - q, n)]
                                for r, (q, n) in enumerate(zip(q_lens, kv_lens))]).astype(np.int64)
    md = layer.build_metadata(qsl, np.array(kv_lens, np.int32), table, new_slots)
    assert (md.num_reqs, md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (3, 22, 20, 33)
    q = rng.standard_normal((22, H, D)).astype(dtype)
    out, lse = layer.forward(q, None, None, cache, md, return_lse=True)
    exp_out, exp_lse = pyref.attention(q.astype(np.float64).tolist(), [k.astype(np.float64).tolist() for k in keys],
                                       [v.astype(np.float64).tolist() for v in vals], qsl.tolist(), kv_lens, Hkv)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    assert_close(out, exp_out, tol, tol, "layer out")
    assert_close(lse, exp_lse, 1e-5, 1e-5, "layer lse")


def test_layer_refusals():
    with pytest.raises(attnkit.AttnkitError, match="flash_attn"):
        attnkit.AttentionLayer(8, 2, 64, "float16", backend="flash_attn")  # CPU device
    layer = attnkit.AttentionLayer(4, 2, 32, "float32")
    cache = np.zeros(layer.kv_cache_physical_shape(2), np.float32)
    md = layer.build_metadata(np.array([0, 1], np.int32), np.array([5], np.int32), np.array([[1]], np.int32),
                              np.array([4], np.int64))
    with pytest.raises(attnkit.AttnkitError, match=r"q\.dtype"):
        # the layer was made for float32 queries
        layer.forward(np.zeros((1, 4, 32), np.float16), None, None, cache, md)
    with pytest.raises(attnkit.AttnkitError, match="block id"):
        layer.forward(np.zeros((1, 4, 32), np.float32), None, None, cache[:1], md)  # block 1 of a 1-block cache
    with pytest.raises(attnkit.AttnkitError, match="seq_lens"):
        layer.build_metadata(np.array([0, 1], np.int32), np.array([5, 6], np.int32), np.array([[1]], np.int32),
                             np.array([4], np.int64))


def test_workspace_api():
    # The caller-owned workspace: the CPU reference needs none; a GPU layer's backend says how
    # much its forwards can need (split-KV or plan partials) before any GPU is touched.
    layer = attnkit.AttentionLayer(4, 2, 32, "float32")
    assert layer.workspace_bytes(4096) == 0
    layer.set_workspace(None)
    md = layer.build_metadata(np.array([0, 1], np.int32), np.array([5], np.int32), np.array([[0]], np.int32),
                              np.array([4], np.int64))
    assert layer.workspace_bytes_for(md) == 0
    # (the FlashInfer-style backend serves GPU configurations where its kernels are built)
    for backend in ("flash_attn", "flashinfer") if attnkit.cuda_built else ("flash_attn",):
        gpu = attnkit.AttentionLayer(32, 8, 128, "bfloat16", device="sm90", backend=backend)
        small, big = gpu.workspace_bytes(64), gpu.workspace_bytes(8192)
        assert 0 < small <= big, (backend, small, big)  # (flashinfer: its builder's capacity either way)
    with pytest.raises(attnkit.AttnkitError, match="workspace"):
        gpu.set_workspace(np.zeros(16, np.uint8))  # a host array


@pytest.mark.parametrize("interleave", [1, 16])
def test_layer_dcp_ranks_merge_to_the_unsharded_result(interleave):
    # Decode context parallelism through the engine path: two ranks each hold their shard of
    # every request's keys (token t on rank (t // interleave) % 2) in their own cache; each
    # rank's forward gives its partial and LSE; merge_states of the two is the unsharded result.
    H, Hkv, D, bs, N = 8, 2, 32, 16, 2
    rng = np.random.default_rng(interleave)
    kv_lens, q_lens = [40, 7, 70], [1, 1, 3]  # decodes and a speculative-decode request
    keys = [rng.standard_normal((n, Hkv, D)).astype(np.float32) for n in kv_lens]
    vals = [rng.standard_normal((n, Hkv, D)).astype(np.float32) for n in kv_lens]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), H, D)).astype(np.float32)
    parts = []
    for rank in range(N):
        layer = attnkit.AttentionLayer(H, Hkv, D, "float32", block_size=bs, lse=True)
        mine = [[t for t in range(n) if (t // interleave) % N == rank] for n in kv_lens]
        blocks = [max(1, -(-len(m) // bs)) for m in mine]
        table = np.zeros((len(kv_lens), max(blocks)), np.int32)
        at = 0
        for r, b in enumerate(blocks):
            table[r, :b] = np.arange(at, at + b)
            at += b
        cache = np.zeros(layer.kv_cache_physical_shape(at), np.float32)
        for r, m in enumerate(mine):
            if m:
                slots = np.array([table[r, j // bs] * bs + j % bs for j in range(len(m))], np.int64)
                attnkit.write_kv(keys[r][m], vals[r][m], cache, slots, layout="NHD")
        md = layer.build_metadata(qsl, np.array(kv_lens, np.int32), table, np.full(int(qsl[-1]), -1, np.int64),
                                  dcp=(N, rank, interleave))
        parts.append(layer.forward(q, None, None, cache, md, return_lse=True))
    out, lse = attnkit.merge_states(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    exp_out, exp_lse = pyref.attention(q.astype(np.float64).tolist(), [k.astype(np.float64).tolist() for k in keys],
                                       [v.astype(np.float64).tolist() for v in vals], qsl.tolist(), kv_lens, Hkv)
    assert_close(out, exp_out, 1e-5, 1e-5, "dcp out")
    assert_close(lse, exp_lse, 1e-5, 1e-5, "dcp lse")
    with pytest.raises(attnkit.AttnkitError, match="rank"):
        layer.build_metadata(qsl, np.array(kv_lens, np.int32), table, np.full(int(qsl[-1]), -1, np.int64),
                             dcp=(N, N, interleave))


def test_device_errors_api():
    # The device error record's API: nothing to report without CUDA; with a CUDA build it needs
    # a GPU (python/tests/test_gpu.py runs the guards).
    if attnkit.cuda_built:
        pytest.skip("the record is read from a GPU (test_gpu.py)")
    e = attnkit.device_errors()
    assert e["faults"] == 0 and e["dropped_kv_tokens"] == 0 and e["message"] == "none"
    assert attnkit.check_device_errors() == e
    attnkit.set_check_device_errors(True)
    attnkit.set_check_device_errors(False)
