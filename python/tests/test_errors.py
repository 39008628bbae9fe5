"""Bad input raises attnkit.AttnkitError (a ValueError) carrying the library's message: which
value broke which rule."""

import numpy as np
import pytest

import attnkit
from helpers import PagedBatch

AttnkitError = attnkit.AttnkitError


def test_error_class():
    assert issubclass(AttnkitError, ValueError)


@pytest.fixture
def batch():
    return PagedBatch(np.random.default_rng(0), [1, 4], [10, 20], 4, 2, 16, 16)


def call(b, q=None, k=None, v=None, **kw):
    kc, vc = b.cache_views()
    args = dict(seqused_k=b.seqused_k, block_table=b.block_table, causal=True)
    args.update(kw)
    return attnkit.flash_attn_varlen_func(b.q if q is None else q, kc if k is None else k, vc if v is None else v,
                                          args.pop("max_seqlen_q", b.max_seqlen_q),
                                          args.pop("cu_seqlens_q", b.cu_seqlens_q),
                                          args.pop("max_seqlen_k", b.max_seqlen_k), **args)


CASES = {
    "q float64": (lambda b: dict(q=b.q.astype(np.float64)), r"q\.dtype"),
    "q 2-D": (lambda b: dict(q=b.q[:, 0]), r"q\.shape.*3 dims"),
    "q head dim strided": (lambda b: dict(q=np.zeros((5, 4, 32), np.float32)[:, :, ::2]), r"q\.stride\(-1\)"),
    "cu_seqlens_q int64": (lambda b: dict(cu_seqlens_q=b.cu_seqlens_q.astype(np.int64)), r"cu_seqlens_q\.dtype.*i32"),
    "block_table rows": (lambda b: dict(block_table=b.block_table[:1]), r"block_table\.shape"),
    "block id out of range": (lambda b: dict(block_table=b.block_table + 100), r"block"),
    "max_seqlen_q too small": (lambda b: dict(max_seqlen_q=2), r"max_seqlen_q = 2"),
    "max_seqlen_k too small": (lambda b: dict(max_seqlen_k=15), r"max_seqlen_k = 15"),
    "cu_seqlens_k with block_table": (lambda b: dict(cu_seqlens_k=b.cu_seqlens_q), r"cu_seqlens_k"),
    "block_table without seqused_k": (lambda b: dict(seqused_k=None), r"seqused_k.*required"),
    "out dtype": (lambda b: dict(out=np.zeros(b.q.shape, np.float16)), r"out\.dtype"),
    "out shape": (lambda b: dict(out=np.zeros((1, 4, 16), np.float32)), r"out\.shape"),
    "heads not divisible": (lambda b: dict(q=np.zeros((5, 3, 16), np.float32)), r"num_heads"),
    "head size mismatch": (lambda b: dict(q=np.zeros((5, 4, 32), np.float32)), r"head_size"),
    "k v shapes differ": (lambda b: dict(v=b.cache_views()[1][:-1]), r"value_cache\.shape"),
    "uint8 cache auto": (lambda b: dict(k=b.cache_views()[0].view(np.uint8)[..., :16],
                                        v=b.cache_views()[1].view(np.uint8)[..., :16]), r"uint8"),
    "per-sequence descale": (lambda b: dict(k=b.cache_views()[0].view(np.uint8)[..., :16],
                                            v=b.cache_views()[1].view(np.uint8)[..., :16], kv_cache_dtype="fp8",
                                            k_descale=np.ones((2, 2), np.float32)), r"per-sequence"),
    "fp8 cache dtype on f32": (lambda b: dict(kv_cache_dtype="fp8"), r"needs a uint8"),
    "sinks shape": (lambda b: dict(s_aux=np.zeros(3, np.float32)), r"sinks"),
    "window": (lambda b: dict(window_size=(-2, 0)), r"window_left"),
    "negative softcap": (lambda b: dict(softcap=-1.0), r"softcap"),
    "fp8 q": (lambda b: dict(q=b.q.view(np.uint8)), r"q\.dtype"),
    "dropout": (lambda b: dict(dropout_p=0.1), r"dropout_p"),
    "not an array": (lambda b: dict(q=[[1.0]]), r"must be an array"),
    "bad window_size": (lambda b: dict(window_size=3), r"window_size"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attn_varlen_func_rejects(batch, name):
    make, pattern = CASES[name]
    with pytest.raises(AttnkitError, match=pattern) as e:
        call(batch, **make(batch))
    assert "violates" in str(e.value), str(e.value)


def test_contiguous_kv_needs_cu_seqlens_k(batch):
    k = np.zeros((30, 2, 16), np.float32)
    with pytest.raises(AttnkitError, match="cu_seqlens_k"):
        attnkit.flash_attn_varlen_func(batch.q, k, k, 4, batch.cu_seqlens_q, 20, causal=True)


def test_contiguous_kv_segment_overflow(batch):
    k = np.zeros((25, 2, 16), np.float32)
    with pytest.raises(AttnkitError, match=r"cu_seqlens_k\[2\]"):
        attnkit.flash_attn_varlen_func(batch.q, k, k, 4, batch.cu_seqlens_q, 20,
                                       cu_seqlens_k=np.array([0, 10, 30], np.int32), causal=True)


def kv_case(**over):
    rng = np.random.default_rng(1)
    cache = np.zeros((2, 2, 16, 2, 16), np.float32)
    args = dict(key=rng.standard_normal((3, 2, 16)).astype(np.float32),
                value=rng.standard_normal((3, 2, 16)).astype(np.float32),
                key_cache=cache[:, 0], value_cache=cache[:, 1],
                slot_mapping=np.array([0, 5, 31], np.int64), kv_cache_dtype="auto", k_scale=None, v_scale=None)
    args.update(over)
    return args


KV_CASES = {
    "slot beyond cache": (dict(slot_mapping=np.array([0, 5, 32], np.int64)), r"slot_mapping"),
    "slot_mapping int32": (dict(slot_mapping=np.array([0, 5, 6], np.int32)), r"slot_mapping\.dtype"),
    "fewer key rows than slots": (dict(slot_mapping=np.array([0, 1, 2, 3], np.int64)), r"key\.size\(0\)"),
    "key float64": (dict(key=np.zeros((3, 2, 16))), r"key\.dtype"),
    "key heads": (dict(key=np.zeros((3, 1, 16), np.float32)), r"key"),
    "unknown cache dtype": (dict(kv_cache_dtype="fp7"), r"fp7"),
    "cache dtype mismatch": (dict(kv_cache_dtype="float16"), r"key_cache\.dtype"),
}


@pytest.mark.parametrize("name", sorted(KV_CASES))
def test_reshape_and_cache_flash_rejects(name):
    over, pattern = KV_CASES[name]
    with pytest.raises(AttnkitError, match=pattern):
        attnkit.reshape_and_cache_flash(**kv_case(**over))


def test_fp8_scale_must_be_positive():
    cache = np.zeros((2, 2, 16, 2, 16), np.uint8)
    with pytest.raises(AttnkitError, match="scale"):
        attnkit.reshape_and_cache_flash(**kv_case(key_cache=cache[:, 0], value_cache=cache[:, 1],
                                                  kv_cache_dtype="fp8", k_scale=0.0, v_scale=1.0))


def test_merge_state_shape_mismatch():
    v = np.zeros((4, 2, 8), np.float32)
    s = np.zeros((4, 2), np.float32)
    with pytest.raises(AttnkitError):
        attnkit.merge_state(v, s, np.zeros((4, 3, 8), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(AttnkitError, match="s_a"):
        attnkit.merge_state(v, np.zeros(4, np.float32), v, s)


def decode_plan(w, **over):
    args = dict(indptr=np.array([0, 1, 3], np.int32), indices=np.array([0, 1, 2], np.int32),
                last_page_len=np.array([5, 16], np.int32), num_qo_heads=4, num_kv_heads=2, head_dim=16,
                page_size=16, q_data_type="float32")
    args.update(over)
    w.plan(**args)


PLAN_CASES = {
    "indptr not monotone": (dict(indptr=np.array([0, 2, 1], np.int32)), r"indptr\[2\]"),
    "indptr start": (dict(indptr=np.array([1, 2, 3], np.int32)), r"indptr\[0\]"),
    "last_page_len too big": (dict(last_page_len=np.array([17, 16], np.int32)), r"last_page_len\[0\] = 17"),
    "last_page_len zero": (dict(last_page_len=np.array([0, 16], np.int32)), r"last_page_len\[0\] = 0"),
    "indices short": (dict(indices=np.array([0, 1], np.int32)), r"indices"),
    "rope": (dict(pos_encoding_mode="ROPE_LLAMA"), r"pos_encoding_mode"),
    "float indptr": (dict(indptr=np.array([0.0, 1.0, 3.0])), r"indptr\.dtype"),
    "unknown option": (dict(block_tables=np.zeros((2, 2), np.int32)), r"block_tables"),
}


@pytest.mark.parametrize("name", sorted(PLAN_CASES))
def test_flashinfer_plan_rejects(name):
    over, pattern = PLAN_CASES[name]
    with pytest.raises(AttnkitError, match=pattern):
        decode_plan(attnkit.BatchDecodeWithPagedKVCacheWrapper(None), **over)


def test_flashinfer_run_rejects():
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    decode_plan(w)
    cache = np.zeros((3, 2, 16, 2, 16), np.float32)
    q = np.zeros((2, 4, 16), np.float32)
    with pytest.raises(AttnkitError, match="q_data_type"):
        w.run(q.astype(np.float16), cache)
    with pytest.raises(AttnkitError, match="window_left"):
        w.run(q, cache, window_left=5)
    with pytest.raises(AttnkitError, match="batch size"):
        w.run(q[:1], cache)
    with pytest.raises(AttnkitError, match="paged_kv_cache.shape"):
        w.run(q, cache[:, 0])
    with pytest.raises(AttnkitError, match="block"):  # page id 2 of a 2-page cache
        w.run(q, cache[:2])
    with pytest.raises(AttnkitError, match="kv_layout"):
        attnkit.BatchDecodeWithPagedKVCacheWrapper(None, kv_layout="NDH")
