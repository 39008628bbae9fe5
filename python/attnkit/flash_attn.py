"""vLLM / FlashAttention-compatible calls: flash_attn_varlen_func and reshape_and_cache_flash.

Same argument names and meanings as vllm_flash_attn's; the differences are documented in each
docstring (and in README's Python section)."""

from __future__ import annotations

import weakref

import numpy as np

from . import _arrays as A
from . import _attnkit as _C

# Schedules made by get_scheduler_metadata: id(tensor) -> (weak reference, what it was made for).
# Host-side, so a call checks its schedule without reading the device tensor (graph-safe).
_SCHEDULES: dict = {}
_SCHEDULE_FIELDS = ("batch_size", "max_seqlen_q", "max_seqlen_k", "num_heads", "num_kv_heads", "head_size",
                    "fp8_cache")


def _window(window_size, where):
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        A.fail(where, f"window_size = {window_size!r}", "must be a pair (left, right) of ints, -1 = unbounded")
    return left, right


def _is_fp8_name(dtype) -> bool:
    name = dtype if isinstance(dtype, str) else str(dtype).split(".")[-1]
    return name.startswith("float8") or name.startswith("fp8")


def _rule_splits(info, like) -> int:
    """The builder's split count for a uniform batch of these sizes on like's CUDA device (1 on the
    CPU and in a build without CUDA: the reference never splits)."""
    if not (A.is_cuda(like) and _C.cuda_built):
        return 1
    device = like.device.index if A.is_torch(like) else like.device.id
    return _C.varlen_num_splits(info["batch_size"], info["max_seqlen_q"], info["max_seqlen_k"], info["num_heads"],
                                info["num_kv_heads"], info["head_size"], info["fp8_cache"], int(device or 0))


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens, qkv_dtype=None, headdim_v=None, cu_seqlens_q=None,
                           cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), has_softcap=False, num_splits=0, pack_gqa=None,
                           sm_margin=0):
    """The ahead-of-time schedule of a batch, as FlashAttention-3's get_scheduler_metadata: call it
    once per batch with the batch's sizes and pass the result as flash_attn_varlen_func's
    scheduler_metadata. The schedule is the split-KV count of the library's rule for these sizes
    (num_splits > 0 forces that count), computed from host-visible sizes only; it comes back as an
    int32 array on cache_seqlens' device: [num_splits, batch_size, max_seqlen_q, max_seqlen_k].
    qkv_dtype: the cache's dtype (an fp8 dtype for fp8 caches). A call whose sizes differ from the
    schedule's is an error. The other arguments are accepted for call compatibility."""
    where = "get_scheduler_metadata"
    del cu_seqlens_q, cu_seqlens_k_new, cache_leftpad, page_size, max_seqlen_k_new, causal, window_size
    del has_softcap, pack_gqa, sm_margin
    A.check_array(cache_seqlens, where, "cache_seqlens")
    if headdim_v is not None and int(headdim_v) != int(headdim):
        A.fail(where, f"headdim_v = {headdim_v}", f"must equal headdim = {headdim} (one head size for q, k and v)")
    info = dict(batch_size=int(batch_size), max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k),
                num_heads=int(num_heads_q), num_kv_heads=int(num_heads_kv), head_size=int(headdim),
                fp8_cache=qkv_dtype is not None and _is_fp8_name(qkv_dtype))
    if int(num_splits) < 0:
        A.fail(where, f"num_splits = {num_splits}", "must be >= 0 (0 = the library's rule)")
    info["num_splits"] = int(num_splits) if int(num_splits) > 0 else _rule_splits(info, cache_seqlens)
    values = np.array([info["num_splits"], info["batch_size"], info["max_seqlen_q"], info["max_seqlen_k"]], np.int32)
    if isinstance(cache_seqlens, np.ndarray):
        meta = values
    else:
        meta = A.empty(cache_seqlens, (4,), "int32")
        if A.is_torch(meta):
            import torch

            meta.copy_(torch.from_numpy(values))
        else:
            meta[...] = values
    key = id(meta)
    _SCHEDULES[key] = (weakref.ref(meta, lambda _ref, key=key: _SCHEDULES.pop(key, None)), info)
    return meta


def _scheduled_splits(meta, call, num_splits, where) -> int:
    """The split count of schedule `meta` after checking it was made for this call."""
    entry = _SCHEDULES.get(id(meta))
    if entry is None or entry[0]() is not meta:
        A.fail(where, "scheduler_metadata", "must be an array returned by attnkit.get_scheduler_metadata")
    info = entry[1]
    for name in _SCHEDULE_FIELDS:
        if info[name] != call[name]:
            A.fail(where, f"scheduler_metadata's {name} = {info[name]}",
                   f"must equal this call's {name} = {call[name]} (the schedule was made for another batch)")
    if num_splits > 0 and num_splits != info["num_splits"]:
        A.fail(where, f"num_splits = {num_splits}",
               f"must be 0 or the schedule's count {info['num_splits']} when scheduler_metadata is given")
    return info["num_splits"]


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None,
                           seqused_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, block_table=None,
                           return_softmax_lse=False, out=None, k_descale=None, v_descale=None,
                           num_splits=0, s_aux=None, *, q_descale=None, scheduler_metadata=None,
                           fa_version=None, dropout_p=0.0, kv_cache_dtype="auto", stream=None):
    """Varlen attention over a paged (or contiguous) KV cache, as vLLM calls FlashAttention.

    q: [total_q, num_heads, head_size]; with block_table, k / v are the paged caches
    [num_blocks, block_size, num_kv_heads, head_size] (any strides on the first three dims, so
    kv_cache[:, 0] / kv_cache[:, 1] views work), seqused_k [num_seqs] gives each sequence's key
    length and cu_seqlens_k must be None. Without block_table, k / v are contiguous varlen
    [total_k, num_kv_heads, head_size] with cu_seqlens_k (and optionally seqused_k), read in
    place (no copy) on both devices.

    Semantics are FlashAttention's: causal is bottom-right aligned, a query longer than its keys
    is allowed (rows before the first key see nothing and output 0), window_size = (left, right)
    with -1 unbounded, softcap > 0 caps scaled logits, alibi_slopes [num_heads] or
    [num_seqs, num_heads] (per sequence), s_aux [num_heads] are sink logits (gpt-oss),
    k_descale / v_descale are an fp8 cache's dequant scales ([1], [num_kv_heads] or
    FlashAttention's expanded [num_seqs, num_kv_heads]; ignored for 16/32-bit caches). Returns out, or (out, softmax_lse) with lse float32
    [num_heads, total_q] in natural log.

    Devices: CPU arrays run on the reference backend (float32/float16/bfloat16), CUDA arrays on
    the FlashAttention-style kernel, on `stream` (default: PyTorch's / CuPy's current stream).

    Split-KV as in FlashAttention: num_splits = 0 lets the library decide (the builder's rule for
    a uniform batch of the call's sizes), 1 means none, > 1 forces that many; scheduler_metadata
    from get_scheduler_metadata carries a count decided ahead of time (checked against the call;
    a mismatch is an error). The CPU reference never splits.

    Differences from vllm_flash_attn: fp8 caches may also be uint8 tensors with
    kv_cache_dtype='fp8' / 'fp8_e4m3' / 'fp8_e5m2' (NumPy has no fp8 dtype); fp8 queries and
    dropout are refused; q_descale and fa_version are accepted and ignored; on the CPU,
    max_seqlen_q / max_seqlen_k must bound the true lengths (the GPU trusts them).
    """
    where = "flash_attn_varlen_func"
    for name, x in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q)):
        A.check_array(x, where, name)
    if dropout_p:
        A.fail(where, f"dropout_p = {dropout_p}", "must be 0 (attnkit is for inference)")
    # Accepted for call compatibility: q is never fp8 (its dtype check refuses it), so q_descale
    # has nothing to scale, as in FlashAttention.
    del fa_version, q_descale
    left, right = _window(window_size, where)
    k, k_fmt = A.split_fp8(k)
    v, v_fmt = A.split_fp8(v)
    cache_dtype = A.cache_dtype_for(kv_cache_dtype, k_fmt, v_fmt)
    if out is None:
        out = A.empty(q, q.shape)
    lse = A.empty(q, (q.shape[1], q.shape[0]), "float32") if return_softmax_lse else None
    num_splits = int(num_splits)
    if num_splits < 0:
        A.fail(where, f"num_splits = {num_splits}", "must be >= 0 (0 = the library's rule)")
    call = dict(batch_size=int(cu_seqlens_q.shape[0]) - 1, max_seqlen_q=int(max_seqlen_q),
                max_seqlen_k=int(max_seqlen_k), num_heads=int(q.shape[1]), num_kv_heads=int(k.shape[-2]),
                head_size=int(q.shape[-1]), fp8_cache=cache_dtype.startswith("fp8"))
    if scheduler_metadata is not None:
        num_splits = _scheduled_splits(scheduler_metadata, call, num_splits, where)
    elif num_splits == 0:
        num_splits = _rule_splits(call, q)
    if block_table is None and seqused_k is None and cu_seqlens_k is not None and A.is_cuda(q):
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]  # (the kernels read each request's key count)
    workspace = None
    if num_splits > 1 and A.is_cuda(q) and _C.cuda_built:
        nbytes = _C.varlen_workspace_bytes(q.shape[0], q.shape[1], q.shape[2], num_splits)
        workspace = A.empty(q, (max(nbytes, 1),), "uint8")
    with A.device_guard(q):
        _C.varlen_attention(
            q, k, v, cache_dtype, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
            int(max_seqlen_q), int(max_seqlen_k),
            0.0 if softmax_scale is None else float(softmax_scale), bool(causal), left, right,
            float(softcap or 0.0), A.as_float32(alibi_slopes, where, "alibi_slopes"),
            A.as_float32(s_aux, where, "s_aux"), A.scale_like(k_descale, q, where, "k_descale"),
            A.scale_like(v_descale, q, where, "v_descale"), out, lse, num_splits, workspace,
            A.resolve_stream(stream, q))
    return (out, lse) if return_softmax_lse else out


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                            k_scale=None, v_scale=None, *, stream=None):
    """Writes the new tokens' keys and values into the paged cache, as vLLM's op does.

    key / value: [num_tokens, num_kv_heads, head_size] (rows may be strided, e.g. slices of a
    fused QKV tensor; only the first slot_mapping.shape[0] rows are written, so CUDA-graph
    padding is fine). key_cache / value_cache: [num_blocks, block_size, num_kv_heads, head_size]
    views with any strides on the first three dims. slot_mapping: int64 [num_tokens], slot =
    block * block_size + offset, negative = padding (skipped). kv_cache_dtype: 'auto' (the
    caches' dtype) or 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' (uint8 or fp8 cache tensors; stored =
    saturate(round(x / scale))). k_scale / v_scale: float32 [1] or [num_kv_heads] arrays, or
    Python floats; ignored for 'auto' caches. Runs on the arrays' device (stream as above).
    """
    where = "reshape_and_cache_flash"
    for name, x in (("key", key), ("value", value), ("key_cache", key_cache),
                    ("value_cache", value_cache), ("slot_mapping", slot_mapping)):
        A.check_array(x, where, name)
    key_cache, k_fmt = A.split_fp8(key_cache)
    value_cache, v_fmt = A.split_fp8(value_cache)
    cache_dtype = A.cache_dtype_for(kv_cache_dtype, k_fmt, v_fmt)
    with A.device_guard(key_cache):
        _C.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, cache_dtype,
                             A.scale_like(k_scale, key_cache, where, "k_scale"),
                             A.scale_like(v_scale, key_cache, where, "v_scale"),
                             A.resolve_stream(stream, key_cache, key))
