"""The FlashInfer-compatible wrappers on CPU NumPy arrays (the reference backend) against the
plain-Python oracle: FlashInfer's page tables, layouts (NHD / HND / (k, v) tuple), base-2 LSE,
window_left, logits_soft_cap, sinks, q/k/v scales and fp8 caches; merge_state(s)."""

import math

import numpy as np
import pytest

import attnkit
import attnkit.flashinfer as fi
import pyref
from helpers import PagedBatch, assert_close, page_table, tolerances

LN2 = math.log(2.0)


def base2(lse_nat):
    """Oracle LSE [heads][tokens] natural log -> FlashInfer's [tokens][heads] base 2."""
    return [[x / LN2 for x in col] for col in zip(*lse_nat)]


def qtype(dtype):
    return np.dtype(dtype).name


def check(out, lse, exp, dtype, what):
    atol, rtol = tolerances(dtype)
    assert_close(out, exp[0], atol, rtol, f"{what} out")
    assert_close(lse, base2(exp[1]), 1e-5, 1e-5, f"{what} lse (base 2)")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("as_tuple", [False, True], ids=["5d", "tuple"])
def test_decode(layout, heads, page_size, as_tuple):
    rng = np.random.default_rng(page_size + heads[1])
    b = PagedBatch(rng, [1] * 5, [1, 16, 17, 40, 70], heads[0], heads[1], 32, page_size, layout=layout)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None, kv_layout=layout)
    w.plan(*page_table(b), heads[0], heads[1], 32, page_size, q_data_type="float32")
    cache = (b.kv_cache[:, 0], b.kv_cache[:, 1]) if as_tuple else b.kv_cache
    out, lse = w.run(b.q, cache, return_lse=True)
    check(out, lse, b.expected(causal=True), np.float32, f"decode {layout}")


@pytest.mark.parametrize("q_len", [2, 4])
def test_decode_q_len_per_req(q_len):
    # Speculative decoding: q_len_per_req new tokens per request, causal among themselves.
    rng = np.random.default_rng(q_len)
    b = PagedBatch(rng, [q_len] * 4, [q_len, 20, 33, 70], 8, 2, 32, 16)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(b), 8, 2, 32, 16, q_data_type="float32", q_len_per_req=q_len)
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    check(out, lse, b.expected(causal=True), np.float32, f"q_len_per_req {q_len}")
    with pytest.raises(attnkit.AttnkitError, match="batch size x q_len_per_req"):
        w.run(b.q[:4], b.kv_cache)
    with pytest.raises(attnkit.AttnkitError, match="q_len_per_req = 9"):
        w.plan(*page_table(b), 8, 2, 32, 16, q_data_type="float32", q_len_per_req=9)


DECODE_FEATURES = {
    "window": dict(plan=dict(window_left=9), oracle=dict(window=(9, 0))),
    "softcap_scale": dict(plan=dict(logits_soft_cap=2.0, sm_scale=0.4), oracle=dict(softcap=2.0, scale=0.4)),
    "sinks": dict(run=dict(sinks=np.array([0.5, -2.0, 1.0, 0.0], np.float32)),
                  oracle=dict(sinks=[0.5, -2.0, 1.0, 0.0])),
    "qkv_scales": dict(run=dict(q_scale=0.5, k_scale=1.5, v_scale=0.25),
                       oracle=dict(scale=0.5 * 1.5 / math.sqrt(32)), v_scale=0.25),
}


@pytest.mark.parametrize("name", sorted(DECODE_FEATURES))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decode_features(name, dtype):
    f = DECODE_FEATURES[name]
    rng = np.random.default_rng(len(name))
    b = PagedBatch(rng, [1] * 4, [5, 16, 33, 50], 4, 2, 32, 16, dtype=dtype)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(b), 4, 2, 32, 16, q_data_type=qtype(dtype), **f.get("plan", {}))
    out, lse = w.run(b.q, b.kv_cache, return_lse=True, **f.get("run", {}))
    exp_out, exp_lse = b.expected(causal=True, **f["oracle"])
    vs = f.get("v_scale", 1.0)
    exp_out = [[[x * vs for x in row] for row in tok] for tok in exp_out]
    check(out, lse, (exp_out, exp_lse), dtype, name)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_fp8_cache(fmt):
    # FlashInfer's fp8 convention: k_scale folds into sm_scale, v_scale scales the output.
    rng = np.random.default_rng(21)
    b = PagedBatch(rng, [1] * 3, [9, 30, 47], 4, 1, 32, 16, fp8=fmt)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(b), 4, 1, 32, 16, q_data_type="float32", kv_data_type="float8_" + fmt + ("fn" if fmt == "e4m3" else ""))
    out, lse = w.run(b.q, b.kv_cache, k_scale=0.5, v_scale=2.0, return_lse=True)
    exp_out, exp_lse = b.expected(causal=True, scale=0.5 / math.sqrt(32))
    exp_out = [[[2.0 * x for x in row] for row in tok] for tok in exp_out]
    check(out, lse, (exp_out, exp_lse), np.float32, f"fp8 {fmt}")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("as_tuple", [False, True], ids=["5d", "tuple"])
def test_decode_nvfp4_cache(layout, as_tuple):
    # FlashInfer's NVFP4 cache: packed codes as the cache, e4m3 block scales as kv_cache_sf, the
    # global scales as k_scale (folded into sm_scale) / v_scale (on the output).
    rng = np.random.default_rng(31)
    b = PagedBatch(rng, [1] * 4, [9, 30, 47, 16], 8, 2, 64, 16, layout=layout, nvfp4=True)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None, kv_layout=layout)
    w.plan(*page_table(b), 8, 2, 64, 16, q_data_type="float32", kv_data_type="uint8")
    cache = (b.kv_cache[:, 0], b.kv_cache[:, 1]) if as_tuple else b.kv_cache
    sf = (b.kv_sf[:, 0], b.kv_sf[:, 1]) if as_tuple else b.kv_sf
    out, lse = w.run(b.q, cache, kv_cache_sf=sf, k_scale=0.5, v_scale=2.0, return_lse=True)
    exp_out, exp_lse = b.expected(causal=True, scale=0.5 / math.sqrt(64))
    exp_out = [[[2.0 * x for x in row] for row in tok] for tok in exp_out]
    check(out, lse, (exp_out, exp_lse), np.float32, f"nvfp4 {layout}")
    with pytest.raises(attnkit.AttnkitError, match="kv_cache_sf = None"):
        w.run(b.q, cache)
    with pytest.raises(attnkit.AttnkitError, match="k_sf.dtype"):
        w.run(b.q, cache, kv_cache_sf=(b.kv_sf[:, 0].astype(np.float32), b.kv_sf[:, 1]))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window_left", [-1, 7])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_prefill_paged(causal, window_left, layout):
    rng = np.random.default_rng(31)
    b = PagedBatch(rng, [3, 1, 8, 5], [3, 20, 40, 5], 4, 2, 32, 16, layout=layout)
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(None, kv_layout=layout)
    w.plan(b.cu_seqlens_q, *page_table(b), 4, 2, 32, 16, causal=causal, window_left=window_left,
           q_data_type="float32")
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    window = (window_left, 0 if causal else -1) if window_left >= 0 else (-1, -1)
    check(out, lse, b.expected(causal=causal, window=window), np.float32, f"prefill {layout}")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_prefill_ragged(causal, dtype):
    rng = np.random.default_rng(41)
    qo = [4, 7, 1]
    kv = [4, 12, 9]
    heads, kv_heads, d = 6, 3, 16
    q = rng.standard_normal((sum(qo), heads, d)).astype(dtype)
    k = rng.standard_normal((sum(kv), kv_heads, d)).astype(dtype)
    v = rng.standard_normal((sum(kv), kv_heads, d)).astype(dtype)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
    w = attnkit.BatchPrefillWithRaggedKVCacheWrapper(None)
    w.plan(qo_indptr, kv_indptr, heads, kv_heads, d, causal=causal, logits_soft_cap=5.0, q_data_type=qtype(dtype))
    out = np.empty_like(q)
    lse = np.empty((sum(qo), heads), np.float32)
    res = w.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    keys = [k[kv_indptr[r]:kv_indptr[r + 1]].astype(np.float64).tolist() for r in range(3)]
    vals = [v[kv_indptr[r]:kv_indptr[r + 1]].astype(np.float64).tolist() for r in range(3)]
    exp = pyref.attention(q.astype(np.float64).tolist(), keys, vals, qo_indptr.tolist(), kv, kv_heads,
                          causal=causal, softcap=5.0)
    check(out, lse, exp, dtype, "ragged")


def test_run_without_lse_returns_out_only():
    rng = np.random.default_rng(51)
    b = PagedBatch(rng, [1, 1], [4, 20], 2, 2, 16, 16)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(b), 2, 2, 16, 16, q_data_type="float32")
    out = w.run(b.q, b.kv_cache)
    assert isinstance(out, np.ndarray)
    assert_close(out, b.expected(causal=True)[0], 1e-5, 1e-5, "out only")


# ---- merge_state(s): base-2 LSE ----------------------------------------------------------------

def merge_oracle(v_a, s_a, v_b, s_b):
    n, h, _ = v_a.shape
    out, lse = [], []
    for t in range(n):
        orow, lrow = [], []
        for j in range(h):
            o, l_nat = pyref.merge(v_a[t, j].tolist(), float(s_a[t, j]) * LN2, v_b[t, j].tolist(), float(s_b[t, j]) * LN2)
            orow.append(o)
            lrow.append(l_nat / LN2)
        out.append(orow)
        lse.append(lrow)
    return out, lse


def states(rng, n, h, d, dtype):
    v_a = rng.standard_normal((n, h, d)).astype(dtype)
    v_b = rng.standard_normal((n, h, d)).astype(dtype)
    s_a = (rng.standard_normal((n, h)) * 3).astype(np.float32)
    s_b = (rng.standard_normal((n, h)) * 3).astype(np.float32)
    s_a[0, 0] = -np.inf          # an empty side
    s_a[1, 1] = s_b[1, 1] = -np.inf  # both empty
    s_b[2, 0] = np.nan           # NaN counts as empty
    v_b[2, 0] = np.nan           # and its NaN output is ignored
    return v_a, s_a, v_b, s_b


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(5, 3, 16), (9, 8, 64)])
def test_merge_state(dtype, shape):
    rng = np.random.default_rng(shape[0])
    v_a, s_a, v_b, s_b = states(rng, *shape, dtype)
    v, s = attnkit.merge_state(v_a, s_a, v_b, s_b)
    exp_v, exp_s = merge_oracle(v_a, s_a, v_b, s_b)
    atol, rtol = tolerances(dtype)
    assert v.dtype == np.dtype(dtype) and s.shape == shape[:2]
    assert_close(v, exp_v, atol, rtol, "merge_state v")
    assert_close(s, exp_s, 1e-5, 1e-5, "merge_state s")


def test_merge_state_in_place_and_merge_states():
    rng = np.random.default_rng(61)
    v_a, s_a, v_b, s_b = states(rng, 6, 4, 16, np.float32)
    exp_v, exp_s = merge_oracle(v_a, s_a, v_b, s_b)
    v, s = v_a.copy(), s_a.copy()
    attnkit.merge_state_in_place(v, s, v_b, s_b)
    assert_close(v, exp_v, 1e-5, 1e-5, "in place v")
    assert_close(s, exp_s, 1e-5, 1e-5, "in place s")
    # Three states folded left to right equal two pairwise merges.
    v_c = rng.standard_normal((6, 4, 16)).astype(np.float32)
    s_c = rng.standard_normal((6, 4)).astype(np.float32)
    vs, ss = fi.merge_states(np.stack([v_a, v_b, v_c], 1), np.stack([s_a, s_b, s_c], 1))
    ab_v, ab_s = attnkit.merge_state(v_a, s_a, v_b, s_b)
    exp3_v, exp3_s = merge_oracle(ab_v, ab_s, v_c, s_c)
    assert_close(vs, exp3_v, 1e-5, 1e-5, "merge_states v")
    assert_close(ss, exp3_s, 1e-5, 1e-5, "merge_states s")


def test_wrapper_cuda_refusal_message_names_the_rule():
    # On the CPU we can only check the message path through plan/run ordering.
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(attnkit.AttnkitError, match="call plan"):
        w.run(np.zeros((1, 1, 16), np.float32), np.zeros((1, 2, 16, 1, 16), np.float32))
