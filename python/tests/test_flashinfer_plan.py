"""The FlashInfer-style wrappers go through the C++ host side: plan() validates the page table in
flashinfer::PageTable and plans the batch with plan_batch (wrapper.plan_info shows the plan);
run() executes that plan work item by work item on the CPU, merging split tiles through the merge
map. These tests fail if a wrapper bypasses the plan: skewed batches must show split tiles and a
merge map and still match the plain-Python oracle, and the C++ rules (with the offending value)
must be what rejects a bad table or an over-capacity batch."""

import math

import numpy as np
import pytest

import attnkit
import pyref
from helpers import PagedBatch, assert_close, page_table, tolerances

LN2 = math.log(2.0)


def check(out, lse, exp, what, dtype=np.float32):
    atol, rtol = tolerances(dtype)
    assert_close(out, exp[0], atol, rtol, f"{what} out")
    assert_close(lse, [[x / LN2 for x in col] for col in zip(*exp[1])], 1e-5, 1e-5, f"{what} lse (base 2)")


def decode(b, **plan):
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None, kv_layout=b.layout)
    w.plan(*page_table(b), b.num_heads, b.num_kv_heads, b.head_size, b.block_size, q_data_type="float32", **plan)
    return w


def prefill(b, causal, **plan):
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(None, kv_layout=b.layout)
    w.plan(b.cu_seqlens_q, *page_table(b), b.num_heads, b.num_kv_heads, b.head_size, b.block_size,
           causal=causal, q_data_type="float32", **plan)
    return w


# ---- the plan is the C++ one ---------------------------------------------------------------------

def test_plan_info_before_plan_is_empty():
    assert attnkit.BatchDecodeWithPagedKVCacheWrapper(None).plan_info == {}


@pytest.mark.parametrize("heads,kernel", [((4, 4), "cuda_core_decode"), ((8, 2), "tensor_core")],
                         ids=["mha", "gqa4"])
def test_skewed_decode_splits_and_merges(heads, kernel):
    # One long request among short ones: its tile is cut into KV chunks whose partials the merge
    # map combines; the sinks must join each row's softmax once, after the merge.
    rng = np.random.default_rng(1)
    b = PagedBatch(rng, [1] * 4, [700, 3, 17, 40], *heads, 16, 16)
    w = decode(b)
    info = w.plan_info
    assert info["kernel"] == kernel
    assert info["split_kv"] and info["num_split_tiles"] == 1
    assert info["kv_chunk_tokens"] == 128 and info["num_items"] == 3 + math.ceil(700 / 128)
    group = heads[0] // heads[1]
    assert info["num_merged_rows"] == group and info["num_partial_rows"] == group * math.ceil(700 / 128)
    assert info["tile_q"] == (group if kernel == "cuda_core_decode" else 16)
    assert info["num_slots"] == 132 * 2 // heads[1] and info["num_reqs"] == 4
    sinks = np.linspace(-1.0, 2.0, heads[0]).astype(np.float32)
    out, lse = w.run(b.q, b.kv_cache, return_lse=True, sinks=sinks)
    check(out, lse, b.expected(causal=True, sinks=sinks.tolist()), f"skewed decode {kernel}")


def test_skewed_prefill_and_ragged_split_and_merge():
    rng = np.random.default_rng(2)
    b = PagedBatch(rng, [6, 1, 3], [600, 4, 9], 4, 2, 16, 32)
    w = prefill(b, causal=True)
    assert w.plan_info["split_kv"] and w.plan_info["num_merged_rows"] > 0
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    exp = b.expected(causal=True)
    check(out, lse, exp, "skewed paged prefill")
    # The same keys as contiguous rows: the ragged wrapper plans them too (pages of 16 rows).
    k = np.concatenate([np.array(x, np.float32) for x in b.keys_ref])
    v = np.concatenate([np.array(x, np.float32) for x in b.values_ref])
    kv_indptr = np.concatenate([[0], np.cumsum(b.kv_lens)]).astype(np.int32)
    r = attnkit.BatchPrefillWithRaggedKVCacheWrapper(None)
    r.plan(b.cu_seqlens_q, kv_indptr, 4, 2, 16, causal=True, q_data_type="float32")
    assert r.plan_info["page_size"] == 16 and r.plan_info["split_kv"]
    out, lse = r.run(b.q, k, v, return_lse=True)
    check(out, lse, exp, "skewed ragged prefill")


def test_replan_keeps_the_capacity():
    rng = np.random.default_rng(3)
    big = PagedBatch(rng, [1] * 5, [50, 3, 17, 40, 9], 4, 2, 16, 16)
    small = PagedBatch(rng, [1] * 2, [5, 20], 4, 2, 16, 16)
    w = decode(big)
    cap = w.plan_info["capacity"]
    w.plan(*page_table(small), 4, 2, 16, 16, q_data_type="float32")
    assert w.plan_info["capacity"] == cap and w.plan_info["num_reqs"] == 2
    out, lse = w.run(small.q, small.kv_cache, return_lse=True)
    check(out, lse, small.expected(causal=True), "re-planned decode")


# ---- the C++ page table and plan reject, naming the value ----------------------------------------

def plan_args(**over):
    args = dict(indptr=np.array([0, 1, 3], np.int32), indices=np.array([0, 1, 2], np.int32),
                last_page_len=np.array([5, 16], np.int32), num_qo_heads=4, num_kv_heads=2, head_dim=16,
                page_size=16, q_data_type="float32")
    args.update(over)
    return args


BAD_TABLES = {
    "indptr decreasing": (dict(indptr=np.array([0, 3, 1], np.int32)),
                          r"flashinfer page table\): indptr\[2\] = 1 violates: must be >= indptr\[1\] = 3"),
    "last_page_len 0": (dict(last_page_len=np.array([5, 0], np.int32)),
                        r"page table\): last_page_len\[1\] = 0 violates: must be in \[1, page_size = 16\]"),
    "last_page_len > page_size": (dict(last_page_len=np.array([33, 16], np.int32), page_size=32),
                                  r"last_page_len\[0\] = 33 violates: must be in \[1, page_size = 32\]"),
    "negative page id": (dict(indices=np.array([0, -4, 2], np.int32)), r"indices\[1\] = -4 violates"),
    "heads": (dict(num_qo_heads=3), r"flashinfer plan\): num_qo_heads = 3 violates"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_bad_page_table(name):
    over, pattern = BAD_TABLES[name]
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(attnkit.AttnkitError, match=r"BatchDecodeWithPagedKVCacheWrapper\.plan"):
        w.plan(**plan_args(**over))
    with pytest.raises(attnkit.AttnkitError, match=pattern):
        w.plan(**plan_args(**over))
    assert w.plan_info == {}  # a rejected plan leaves no plan behind
    with pytest.raises(attnkit.AttnkitError, match="call plan"):
        w.run(np.zeros((2, 4, 16), np.float32), np.zeros((3, 2, 16, 2, 16), np.float32))


def test_page_id_past_num_pages():
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(**plan_args(indices=np.array([0, 1, 7], np.int32)))
    with pytest.raises(attnkit.AttnkitError, match=r"indices\[2\] = 7 violates: must be < the cache's num_blocks = 3"):
        w.run(np.zeros((2, 4, 16), np.float32), np.zeros((3, 2, 16, 2, 16), np.float32))


def prefill_plan(w, qo_indptr, **over):
    a = plan_args(**over)
    w.plan(qo_indptr, a["indptr"], a["indices"], a["last_page_len"], 4, 2, 16, a["page_size"], causal=True,
           q_data_type="float32")


def test_query_longer_than_keys_is_refused_by_the_plan():
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(None)
    with pytest.raises(attnkit.AttnkitError, match=r"flashinfer plan\): kv_lens\[1\] = 32 violates"):
        prefill_plan(w, np.array([0, 1, 40], np.int32))


def test_batch_larger_than_the_cuda_graph_capacity():
    # CUDA-graph mode: the buffers fix max_reqs / max_pages, the first plan the query tokens.
    bufs = dict(paged_kv_indptr_buffer=np.zeros(3, np.int32), paged_kv_indices_buffer=np.zeros(4, np.int32),
                paged_kv_last_page_len_buffer=np.zeros(2, np.int32))
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(None, use_cuda_graph=True, **bufs)
    w.plan(**plan_args())
    assert w.plan_info["capacity"]["max_reqs"] == 2 and w.plan_info["capacity"]["max_pages"] == 4
    with pytest.raises(attnkit.AttnkitError, match=r"batch_size = 3 violates: must be <= the table's capacity max_reqs = 2"):
        w.plan(**plan_args(indptr=np.array([0, 1, 2, 3], np.int32), last_page_len=np.array([1, 2, 3], np.int32)))
    with pytest.raises(attnkit.AttnkitError, match=r"pages indptr\[2\] = 6 violates: must be <= the table's capacity max_pages = 4"):
        w.plan(**plan_args(indptr=np.array([0, 1, 6], np.int32), indices=np.arange(6, dtype=np.int32)))
    p = attnkit.BatchPrefillWithPagedKVCacheWrapper(None, use_cuda_graph=True, qo_indptr_buf=np.zeros(3, np.int32))
    prefill_plan(p, np.array([0, 1, 5], np.int32))
    assert p.plan_info["tile_q"] == 128  # graph mode fixes the largest tile
    with pytest.raises(attnkit.AttnkitError, match=r"num_tokens = 6 violates: must be <= the plan's capacity max_tokens = 5"):
        prefill_plan(p, np.array([0, 1, 6], np.int32))


# ---- outputs vs the oracle over a small grid -----------------------------------------------------

FEATURES = {"plain": ({}, {}), "window": (dict(window_left=40), dict(window_left=40)),
            "softcap": (dict(logits_soft_cap=3.0), dict(softcap=3.0))}


def oracle_kw(feature, causal):
    kw = dict(FEATURES[feature][1])
    if "window_left" in kw:
        kw["window"] = (kw.pop("window_left"), 0 if causal else -1)
    return kw


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 32, 128])
def test_decode_grid(page_size, layout, group, feature):
    rng = np.random.default_rng(page_size + group)
    b = PagedBatch(rng, [1] * 4, [1, page_size, 300, 57], group, 1, 16, page_size, layout=layout)
    w = decode(b, **FEATURES[feature][0])
    # The 300-key request is cut into chunks of 128 tokens (or one page); a 41-key window is not.
    assert w.plan_info["split_kv"] == (feature != "window")
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    check(out, lse, b.expected(causal=True, **oracle_kw(feature, True)), f"decode p{page_size} {layout} g{group}")


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [16, 32, 128])
def test_prefill_grid(page_size, layout, group, causal, feature):
    rng = np.random.default_rng(page_size * 3 + group)
    b = PagedBatch(rng, [5, 1, 0, 9], [5, 260, 3, 9 + page_size], group, 1, 16, page_size, layout=layout)
    w = prefill(b, causal, **FEATURES[feature][0])
    assert w.plan_info["num_tokens"] == 15
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    check(out, lse, b.expected(causal=causal, **oracle_kw(feature, causal)),
          f"prefill p{page_size} {layout} g{group} causal={causal}")


def test_ragged_window_softcap():
    rng = np.random.default_rng(7)
    qo, kv, heads, kv_heads, d = [3, 8, 1], [3, 150, 40], 8, 2, 16
    q = rng.standard_normal((sum(qo), heads, d)).astype(np.float32)
    k = rng.standard_normal((sum(kv), kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((sum(kv), kv_heads, d)).astype(np.float32)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
    w = attnkit.BatchPrefillWithRaggedKVCacheWrapper(None)
    w.plan(qo_indptr, kv_indptr, heads, kv_heads, d, causal=False, window_left=20, logits_soft_cap=2.0,
           q_data_type="float32")
    out, lse = w.run(q, k, v, return_lse=True)
    keys = [k[kv_indptr[r]:kv_indptr[r + 1]].astype(np.float64).tolist() for r in range(3)]
    vals = [v[kv_indptr[r]:kv_indptr[r + 1]].astype(np.float64).tolist() for r in range(3)]
    exp = pyref.attention(q.astype(np.float64).tolist(), keys, vals, qo_indptr.tolist(), kv, kv_heads,
                          causal=False, window=(20, -1), softcap=2.0)
    check(out, lse, exp, "ragged window softcap")
    with pytest.raises(attnkit.AttnkitError, match=r"kv_indptr\[batch_size\] = 193 violates: must be <= k.shape\[0\] = 192"):
        w.run(q, k[:-1], v[:-1])
