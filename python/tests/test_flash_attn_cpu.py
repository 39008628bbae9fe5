"""attnkit.flash_attn_varlen_func on CPU NumPy arrays (the reference backend) against the
plain-Python float64 oracle, over grids of GQA ratios, head sizes, block sizes, dtypes, masks,
score modifications and fp8 caches."""

import math

import numpy as np
import pytest

import attnkit
from helpers import PagedBatch, assert_close, tolerances

# A mixed batch: two decodes, then prefills (one chunked over a cached prefix, one fresh).
Q_LENS, KV_LENS = [1, 1, 5, 9], [17, 40, 5, 30]


def run_paged(b, return_lse=True, **kw):
    k, v = b.cache_views()
    return attnkit.flash_attn_varlen_func(
        b.q, k, v, b.max_seqlen_q, b.cu_seqlens_q, b.max_seqlen_k, seqused_k=b.seqused_k,
        block_table=b.block_table, return_softmax_lse=return_lse, **kw)


def check(b, got, exp, dtype, what):
    out, lse = got
    exp_out, exp_lse = exp
    atol, rtol = tolerances(dtype)
    assert out.dtype == np.dtype(dtype) and out.shape == b.q.shape
    assert lse.dtype == np.float32 and lse.shape == (b.num_heads, b.q.shape[0])
    assert_close(out, exp_out, atol, rtol, f"{what} out")
    assert_close(lse, exp_lse, 1e-5, 1e-5, f"{what} lse")


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa6"])
@pytest.mark.parametrize("head_size", [16, 64, 128])
def test_gqa_and_head_sizes(heads, head_size):
    rng = np.random.default_rng(head_size * 10 + heads[1])
    b = PagedBatch(rng, Q_LENS, KV_LENS, heads[0], heads[1], head_size, 16)
    check(b, run_paged(b, causal=True), b.expected(causal=True), np.float32, f"heads={heads} d={head_size}")


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_block_sizes_and_dtypes(block_size, dtype):
    rng = np.random.default_rng(block_size)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, block_size, dtype=dtype)
    check(b, run_paged(b, causal=True), b.expected(causal=True), dtype, f"bs={block_size} {np.dtype(dtype)}")


FEATURES = {
    "non_causal": dict(causal=False),
    "window_causal": dict(causal=True, window_size=(8, 0)),
    "window_both_sides": dict(causal=False, window_size=(4, 2)),
    "softcap": dict(causal=True, softcap=1.5, softmax_scale=0.5),
    "scale": dict(causal=True, softmax_scale=0.3),
    "alibi": dict(causal=True, alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32)),
    # one row of slopes per request [num_seqs, num_heads]
    "alibi_per_seq": dict(causal=False, alibi_slopes=np.array([[0.5, 0.25, 0.125, 0.0625], [0.0, 1.0, 0.3, 0.2],
                                                               [0.7, 0.1, 0.05, 0.4], [0.2, 0.2, 0.9, 0.0]], np.float32)),
    "sinks": dict(causal=True, s_aux=np.array([0.5, -1.0, 2.0, -math.inf], np.float32)),
    "sinks_window_softcap": dict(causal=True, window_size=(6, 0), softcap=3.0,
                                 s_aux=np.array([1.0, 0.0, -0.5, 0.25], np.float32)),
}


def oracle_kwargs(kw):
    return dict(scale=kw.get("softmax_scale"), causal=kw["causal"], window=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0),
                alibi=None if kw.get("alibi_slopes") is None else kw["alibi_slopes"].tolist(),
                sinks=None if kw.get("s_aux") is None else kw["s_aux"].tolist())


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_features(name):
    kw = FEATURES[name]
    rng = np.random.default_rng(len(name))
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16)
    check(b, run_paged(b, **kw), b.expected(**oracle_kwargs(kw)), np.float32, name)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_cache(fmt, per_head, layout):
    rng = np.random.default_rng(7)
    k_scale = [0.5, 2.0] if per_head else [0.75]
    v_scale = [1.5, 0.25] if per_head else [1.25]
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16, fp8=fmt, layout=layout)
    # Scales are per KV head; the oracle applies them to the dequantized values.
    ks, vs = np.array(k_scale, np.float32), np.array(v_scale, np.float32)
    for r in range(len(KV_LENS)):
        for row in b.keys_ref[r]:
            for h in range(2):
                row[h] = [x * float(ks[h % ks.size]) for x in row[h]]
        for row in b.values_ref[r]:
            for h in range(2):
                row[h] = [x * float(vs[h % vs.size]) for x in row[h]]
    # FlashAttention's descale layout: [num_seqs, num_kv_heads], an expanded (stride-0) view.
    shape = (len(Q_LENS), 2)
    k_descale = np.broadcast_to(ks if per_head else ks[0], shape)
    v_descale = np.broadcast_to(vs if per_head else vs[0], shape)
    got = run_paged(b, causal=True, kv_cache_dtype="fp8_" + fmt, k_descale=k_descale, v_descale=v_descale)
    check(b, got, b.expected(causal=True), np.float32, f"fp8 {fmt} {layout}")


def test_descales_ignored_for_16bit_cache_and_16bit_q():
    # vLLM passes q/k/v descales on every call; FlashAttention uses them only for fp8 data.
    rng = np.random.default_rng(8)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16)
    three = np.full((4, 2), 3.0, np.float32)
    meta = attnkit.get_scheduler_metadata(len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k, 4, 2, 32, b.seqused_k)
    got = run_paged(b, causal=True, q_descale=three, k_descale=three, v_descale=three,
                    scheduler_metadata=meta, fa_version=3)
    check(b, got, b.expected(causal=True), np.float32, "descale on f32 cache")


@pytest.mark.parametrize("causal", [True, False])
def test_query_longer_than_keys(causal):
    # FlashAttention's contract: rows before the first key see nothing (0 output, -inf LSE)
    # under the causal mask; a request with no keys at all is all zeros.
    rng = np.random.default_rng(11)
    b = PagedBatch(rng, [6, 3, 2], [3, 0, 20], 4, 2, 32, 16)
    got = run_paged(b, causal=causal)
    check(b, got, b.expected(causal=causal), np.float32, f"q>k causal={causal}")
    if causal:
        assert np.all(got[0][:3] == 0) and np.all(np.isneginf(got[1][:, :3]))


def test_empty_requests():
    rng = np.random.default_rng(12)
    b = PagedBatch(rng, [0, 2, 0, 1], [0, 18, 5, 33], 4, 4, 16, 16)
    check(b, run_paged(b, causal=True), b.expected(causal=True), np.float32, "empty requests")


def test_return_without_lse_and_out_argument():
    rng = np.random.default_rng(13)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16, dtype=np.float16)
    buf = np.full((b.q.shape[0] + 3, 4, 32), np.nan, np.float16)
    out = buf[:b.q.shape[0]]
    res = run_paged(b, return_lse=False, causal=True, out=out)
    assert res is out
    exp_out, _ = b.expected(causal=True)
    assert_close(out, exp_out, 2e-3, 2e-3, "out=")
    assert np.all(np.isnan(buf[b.q.shape[0]:])), "rows past the batch must be untouched"


def test_strided_q_rows():
    # q as a slice of a fused QKV tensor: rows strided, head dim contiguous.
    rng = np.random.default_rng(14)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16)
    qkv = np.zeros((b.q.shape[0], 8, 32), np.float32)
    qkv[:, :4] = b.q
    k, v = b.cache_views()
    out = attnkit.flash_attn_varlen_func(qkv[:, :4], k, v, b.max_seqlen_q, b.cu_seqlens_q, b.max_seqlen_k,
                                         seqused_k=b.seqused_k, block_table=b.block_table, causal=True)
    assert_close(out, b.expected(causal=True)[0], 1e-5, 1e-5, "strided q")


def contiguous_kv(b, rng, pad):
    """The batch's keys/values packed as contiguous varlen k/v [total_k, kv_heads, d] (with
    `pad` extra rows after each request, so seqused_k < the segment length)."""
    ks, vs, cu = [], [], [0]
    for r in range(len(b.kv_lens)):
        ks.append(np.array(b.keys_ref[r]).reshape(-1, b.num_kv_heads, b.head_size))
        vs.append(np.array(b.values_ref[r]).reshape(-1, b.num_kv_heads, b.head_size))
        ks.append(rng.standard_normal((pad, b.num_kv_heads, b.head_size)))
        vs.append(rng.standard_normal((pad, b.num_kv_heads, b.head_size)))
        cu.append(cu[-1] + b.kv_lens[r] + pad)
    return np.concatenate(ks), np.concatenate(vs), np.array(cu, np.int32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("pad", [0, 3])
def test_contiguous_kv(dtype, pad):
    rng = np.random.default_rng(15)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16, dtype=dtype)
    k, v, cu_k = contiguous_kv(b, rng, pad)
    k, v = k.astype(dtype), v.astype(dtype)
    out, lse = attnkit.flash_attn_varlen_func(
        b.q, k, v, b.max_seqlen_q, b.cu_seqlens_q, b.max_seqlen_k + pad, cu_seqlens_k=cu_k,
        seqused_k=b.seqused_k if pad else None, causal=True, return_softmax_lse=True)
    check(b, (out, lse), b.expected(causal=True), dtype, f"contiguous pad={pad}")


def test_alibi_slopes_of_another_shape_are_refused():
    rng = np.random.default_rng(3)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16)
    for bad in (np.zeros((len(Q_LENS) + 1, 4), np.float32), np.zeros((len(Q_LENS), 3), np.float32),
                np.zeros(5, np.float32), np.zeros((1, 1, 4), np.float32)):
        with pytest.raises(attnkit.AttnkitError, match="alibi_slopes"):
            run_paged(b, causal=True, alibi_slopes=bad)


# ---- num_splits and scheduler_metadata (FlashAttention-3's call sequence) ---------------------

def test_scheduler_metadata_round_trip_and_mismatches():
    rng = np.random.default_rng(11)
    b = PagedBatch(rng, Q_LENS, KV_LENS, 4, 2, 32, 16)
    seqused = b.seqused_k
    meta = attnkit.get_scheduler_metadata(len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k, 4, 2, 32, seqused)
    # CPU arrays: the reference never splits; the schedule records what it was made for.
    assert meta.dtype == np.int32 and meta.tolist() == [1, len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k]
    check(b, run_paged(b, causal=True, scheduler_metadata=meta), b.expected(causal=True), np.float32, "scheduled")
    check(b, run_paged(b, causal=True, num_splits=0), b.expected(causal=True), np.float32, "num_splits=0")
    other = attnkit.get_scheduler_metadata(len(Q_LENS) + 1, b.max_seqlen_q, b.max_seqlen_k, 4, 2, 32, seqused)
    with pytest.raises(attnkit.AttnkitError, match="batch_size"):
        run_paged(b, causal=True, scheduler_metadata=other)
    wider = attnkit.get_scheduler_metadata(len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k + 1, 4, 2, 32, seqused)
    with pytest.raises(attnkit.AttnkitError, match="max_seqlen_k"):
        run_paged(b, causal=True, scheduler_metadata=wider)
    fp8 = attnkit.get_scheduler_metadata(len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k, 4, 2, 32, seqused,
                                         qkv_dtype="float8_e4m3fn")
    with pytest.raises(attnkit.AttnkitError, match="fp8_cache"):
        run_paged(b, causal=True, scheduler_metadata=fp8)
    with pytest.raises(attnkit.AttnkitError, match="get_scheduler_metadata"):
        run_paged(b, causal=True, scheduler_metadata=meta.copy())  # not a schedule attnkit made
    with pytest.raises(attnkit.AttnkitError, match="num_splits"):
        run_paged(b, causal=True, scheduler_metadata=meta, num_splits=3)
    forced = attnkit.get_scheduler_metadata(len(Q_LENS), b.max_seqlen_q, b.max_seqlen_k, 4, 2, 32, seqused,
                                            num_splits=4)
    assert forced.tolist()[0] == 4
    with pytest.raises(attnkit.AttnkitError, match="num_splits = -1"):
        run_paged(b, causal=True, num_splits=-1)
    with pytest.raises(attnkit.AttnkitError, match="headdim_v"):
        attnkit.get_scheduler_metadata(1, 1, 1, 4, 2, 32, seqused, headdim_v=64)
