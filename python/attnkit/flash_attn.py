"""vLLM / FlashAttention-compatible calls: flash_attn_varlen_func and reshape_and_cache_flash.

Same argument names and meanings as vllm_flash_attn's; the differences are documented in each
docstring (and in README's Python section)."""

from __future__ import annotations

from . import _arrays as A
from . import _attnkit as _C


def _window(window_size, where):
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        A.fail(where, f"window_size = {window_size!r}", "must be a pair (left, right) of ints, -1 = unbounded")
    return left, right


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
    [total_k, num_kv_heads, head_size] with cu_seqlens_k (and optionally seqused_k); this form
    runs on the CPU only (it is read through an identity paged view, no copy).

    Semantics are FlashAttention's: causal is bottom-right aligned, a query longer than its keys
    is allowed (rows before the first key see nothing and output 0), window_size = (left, right)
    with -1 unbounded, softcap > 0 caps scaled logits, alibi_slopes [num_heads] or
    [num_seqs, num_heads] (per sequence), s_aux [num_heads] are sink logits (gpt-oss),
    k_descale / v_descale are an fp8 cache's dequant scales ([1], [num_kv_heads] or
    FlashAttention's expanded [num_seqs, num_kv_heads]; ignored for 16/32-bit caches). Returns out, or (out, softmax_lse) with lse float32
    [num_heads, total_q] in natural log.

    Devices: CPU arrays run on the reference backend (float32/float16/bfloat16), CUDA arrays on
    the FlashAttention-style kernel, on `stream` (default: PyTorch's / CuPy's current stream).

    Differences from vllm_flash_attn: fp8 caches may also be uint8 tensors with
    kv_cache_dtype='fp8' / 'fp8_e4m3' / 'fp8_e5m2' (NumPy has no fp8 dtype); fp8 queries and
    dropout are refused; q_descale, scheduler_metadata and fa_version are accepted and ignored; num_splits 0 means 1 on the GPU (no split-KV unless asked for); on the CPU,
    max_seqlen_q / max_seqlen_k must bound the true lengths (the GPU trusts them).
    """
    where = "flash_attn_varlen_func"
    for name, x in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q)):
        A.check_array(x, where, name)
    if dropout_p:
        A.fail(where, f"dropout_p = {dropout_p}", "must be 0 (attnkit is for inference)")
    # Accepted for call compatibility: attnkit plans its own schedule, and q is never fp8 (its
    # dtype check refuses it), so q_descale has nothing to scale, as in FlashAttention.
    del scheduler_metadata, fa_version, q_descale
    left, right = _window(window_size, where)
    k, k_fmt = A.split_fp8(k)
    v, v_fmt = A.split_fp8(v)
    cache_dtype = A.cache_dtype_for(kv_cache_dtype, k_fmt, v_fmt)
    if out is None:
        out = A.empty(q, q.shape)
    lse = A.empty(q, (q.shape[1], q.shape[0]), "float32") if return_softmax_lse else None
    num_splits = int(num_splits)
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
