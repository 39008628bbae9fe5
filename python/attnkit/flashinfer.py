"""FlashInfer-compatible wrappers: plan(...) once per batch, run(...) per layer, with FlashInfer's
argument names, page-table format and **base-2 LSE** convention (attnkit itself uses natural
log; conversion happens here, at the boundary).

The FlashInfer-style GPU kernels are not part of this build yet: CPU inputs run on the reference
backend (the page table becomes a block table), CUDA inputs raise AttnkitError. merge_state(s)
run on both devices through attnkit's merge.
"""

from __future__ import annotations

import math

import numpy as np

from . import _arrays as A
from . import _attnkit as _C

_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                  "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                  "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_CACHE_NAME = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def _dtype_str(dt) -> str | None:
    """FlashInfer's data type arguments (strings or framework dtypes) as one name."""
    if dt is None:
        return None
    if isinstance(dt, str):
        return _DTYPE_ALIASES.get(dt, dt)
    if isinstance(dt, type) or isinstance(dt, np.dtype):  # NumPy scalar types and dtypes
        return np.dtype(dt).name
    name = str(dt).split(".")[-1]  # torch.float16 -> "float16"
    return _DTYPE_ALIASES.get(name, name)


def _page_table(indptr, indices, last_page_len, page_size, where):
    """FlashInfer's CSR page table -> (seq_lens, block_table) host int32 arrays."""
    indptr = A.host_int32(indptr, where, "indptr")
    indices = A.host_int32(indices, where, "indices")
    last = A.host_int32(last_page_len, where, "last_page_len")
    if indptr.ndim != 1 or indptr.size < 1:
        A.fail(where, f"indptr.shape = {list(indptr.shape)}", "must be [batch_size + 1]")
    batch = indptr.size - 1
    if indptr[0] != 0:
        A.fail(where, f"indptr[0] = {indptr[0]}", "must be 0")
    pages = np.diff(indptr)
    if batch and pages.min() < 0:
        r = int(np.argmin(pages))
        A.fail(where, f"indptr[{r + 1}] = {indptr[r + 1]}", f"must be >= indptr[{r}] = {indptr[r]}")
    if indices.ndim != 1 or indices.size < indptr[-1]:
        A.fail(where, f"indices.shape = {list(indices.shape)}", f"must hold indptr[-1] = {indptr[-1]} page ids")
    if last.shape != (batch,):
        A.fail(where, f"last_page_len.shape = {list(last.shape)}", f"must be [batch_size = {batch}]")
    for r in range(batch):
        if pages[r] > 0 and not 1 <= last[r] <= page_size:
            A.fail(where, f"last_page_len[{r}] = {last[r]}", f"must be in [1, page_size = {page_size}]")
    seq_lens = np.where(pages > 0, (pages - 1) * page_size + last, 0).astype(np.int32)
    width = max(int(pages.max()) if batch else 0, 1)
    table = np.zeros((batch, width), dtype=np.int32)
    for r in range(batch):
        table[r, :pages[r]] = indices[indptr[r]:indptr[r + 1]]
    return seq_lens, table


def _indptr(x, where, name):
    a = A.host_int32(x, where, name)
    if a.ndim != 1 or a.size < 1:
        A.fail(where, f"{name}.shape = {list(a.shape)}", "must be [batch_size + 1]")
    return a


def _check_layout(kv_layout, where):
    if kv_layout not in ("NHD", "HND"):
        A.fail(where, f"kv_layout = {kv_layout!r}", "must be 'NHD' or 'HND'")
    return kv_layout


def _refuse(where, **features):
    """Errors for FlashInfer features attnkit does not implement (given a non-default value)."""
    for name, (value, default) in features.items():
        if value is not None and value != default and not (isinstance(default, bool) and value is False):
            A.fail(where, f"{name} = {value!r}", f"is not supported by attnkit (leave it at {default!r})")


# plan() options that cannot change the result here (split-KV knobs: the CPU path is
# deterministic and unsplit); any other extra option must be left at None / False.
_HARMLESS = {"non_blocking", "fixed_split_size", "disable_split_kv", "enable_pdl"}


def _refuse_extras(where, extras):
    for name, value in extras.items():
        if name not in _HARMLESS and value is not None and value is not False:
            A.fail(where, f"{name} = {value!r}", "is not supported by attnkit (leave it unset)")


def _no_positional_extras(where, args):
    if args:
        A.fail(where, f"{len(args)} extra positional argument(s)", "pass run()'s options by keyword")


def _assign(dst, src):
    if A.is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src


def _cuda_refused(where, q):
    if A.is_cuda(q):
        A.fail(where, "q.device = cuda",
               "the FlashInfer-style GPU kernels are not part of this attnkit build yet: run the "
               "wrapper on CPU tensors, or use attnkit.flash_attn_varlen_func on the GPU")


class _Plan:
    """What plan() fixed: host metadata and the attention options."""

    def __init__(self, qo_indptr, seq_lens, block_table, cu_seqlens_k, num_qo_heads, num_kv_heads,
                 head_dim, page_size, causal, window_left, logits_soft_cap, sm_scale, q_data_type,
                 kv_data_type):
        self.qo_indptr = qo_indptr
        self.seq_lens = seq_lens
        self.block_table = block_table
        self.cu_seqlens_k = cu_seqlens_k
        self.num_qo_heads = int(num_qo_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.page_size = page_size
        self.causal = bool(causal)
        self.window_left = int(window_left)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.sm_scale = sm_scale
        self.q_data_type = _dtype_str(q_data_type)
        self.kv_data_type = _dtype_str(kv_data_type) or self.q_data_type


class _Wrapper:
    _name = "wrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, backend="auto",
                 **_buffers):
        # The workspace and CUDA-graph buffers are FlashInfer's GPU resources; the CPU path
        # needs none (kept for call compatibility).
        self._layout = _check_layout(kv_layout, self._name)
        self._float_workspace_buffer = float_workspace_buffer
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend
        self._plan = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._float_workspace_buffer = float_workspace_buffer

    def _need_plan(self, where):
        if self._plan is None:
            A.fail(where, "plan = None", "call plan(...) before run(...)")
        return self._plan

    def _cache_views(self, paged_kv_cache, where):
        """(k, v) as [num_pages, page_size, num_kv_heads, head_dim] views (no copy) and the
        attnkit cache dtype name."""
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                A.fail(where, f"len(paged_kv_cache) = {len(paged_kv_cache)}", "a tuple must be (k_cache, v_cache)")
            k, v = paged_kv_cache
            for name, x in (("k_cache", k), ("v_cache", v)):
                A.check_array(x, where, name)
                if len(x.shape) != 4:
                    A.fail(where, f"{name}.shape = {list(x.shape)}", "must be 4-D [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D] (HND)")
        else:
            A.check_array(paged_kv_cache, where, "paged_kv_cache")
            shape = list(paged_kv_cache.shape)
            if len(shape) != 5 or shape[1] != 2:
                A.fail(where, f"paged_kv_cache.shape = {shape}", "must be [num_pages, 2, page_size, H, D] (NHD) or [num_pages, 2, H, page_size, D] (HND)")
            k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
        if self._layout == "HND":
            k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        k, k_fmt = A.split_fp8(k)
        v, v_fmt = A.split_fp8(v)
        return k, v, self._cache_dtype(k_fmt or v_fmt, A.dtype_name(k), where)

    def _cache_dtype(self, fp8_fmt, storage, where):
        plan = self._plan
        want = plan.kv_data_type
        if fp8_fmt is not None:
            have = fp8_fmt
        elif storage == "uint8":  # raw fp8 bytes (NumPy): kv_data_type names the format
            if want not in _CACHE_NAME:
                A.fail(where, "cache dtype = uint8", "needs kv_data_type float8_e4m3fn or float8_e5m2 in plan()")
            return _CACHE_NAME[want]
        else:
            have = storage
        have_name = {v: k for k, v in _CACHE_NAME.items()}.get(have, have)
        if want is not None and want != have_name:
            A.fail(where, f"cache dtype = {have_name}", f"must be plan()'s kv_data_type = {want}")
        return have if have in _CACHE_NAME.values() else "auto"

    def _attend(self, where, q, k, v, cache_dtype, block_table, seq_lens, cu_seqlens_k, causal,
                q_scale, k_scale, v_scale, out, lse, return_lse, window_left, sinks):
        plan = self._need_plan(where)
        A.check_array(q, where, "q")
        _cuda_refused(where, q)
        if plan.q_data_type is not None and A.dtype_name(q) != plan.q_data_type:
            A.fail(where, f"q.dtype = {A.dtype_name(q)}", f"must be plan()'s q_data_type = {plan.q_data_type}")
        if window_left is not None and int(window_left) != plan.window_left:
            A.fail(where, f"window_left = {window_left}", f"must equal plan()'s window_left = {plan.window_left}")
        # FlashInfer folds q_scale and k_scale into sm_scale and multiplies the output by v_scale.
        scale = plan.sm_scale if plan.sm_scale is not None else 1.0 / math.sqrt(plan.head_dim)
        scale *= float(q_scale if q_scale is not None else 1.0) * float(k_scale if k_scale is not None else 1.0)
        if out is None:
            out = A.empty(q, q.shape)
        lse_nat = A.empty(q, (q.shape[1], q.shape[0]), "float32") if (return_lse or lse is not None) else None
        qo = plan.qo_indptr
        max_q = int(np.diff(qo).max()) if qo.size > 1 else 0
        max_k = int(plan.seq_lens.max()) if plan.seq_lens.size else 0
        _C.varlen_attention(
            q, k, v, cache_dtype, qo, cu_seqlens_k, seq_lens, block_table, max_q, max_k, scale, causal,
            plan.window_left, 0 if causal else -1, plan.logits_soft_cap, None,
            A.as_float32(sinks, where, "sinks"), None, None, out, lse_nat, 0, None, 0)
        if v_scale is not None and float(v_scale) != 1.0:
            out *= float(v_scale)
        if lse_nat is None:
            return out
        lse2 = lse_nat.T * (1.0 / A.LN2)  # [tokens, heads], base 2
        if lse is None:
            lse = A.contiguous(lse2)
        else:
            _assign(lse, lse2)
        return (out, lse) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """FlashInfer's decode wrapper: one query token per request over a paged cache."""

    _name = "BatchDecodeWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend="auto", jit_args=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        self._use_tensor_cores = bool(use_tensor_cores)

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, *, o_data_type=None, q_len_per_req=1, **extras):
        where = f"{self._name}.plan"
        _refuse_extras(where, extras)
        _refuse(where, pos_encoding_mode=(pos_encoding_mode, "NONE"), rope_scale=(rope_scale, None),
                rope_theta=(rope_theta, None), q_len_per_req=(q_len_per_req, 1))
        if o_data_type is not None and _dtype_str(o_data_type) != _dtype_str(data_type or q_data_type):
            A.fail(where, f"o_data_type = {o_data_type}", "must equal q_data_type (attnkit writes q's dtype)")
        seq_lens, table = _page_table(indptr, indices, last_page_len, int(page_size), where)
        batch = seq_lens.size
        self._plan = _Plan(np.arange(batch + 1, dtype=np.int32), seq_lens, table, None, num_qo_heads,
                           num_kv_heads, head_dim, int(page_size), True, window_left, logits_soft_cap,
                           sm_scale, data_type or q_data_type, kv_data_type or data_type)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """q [batch_size, num_qo_heads, head_dim] -> out [batch_size, num_qo_heads, head_dim]
        (and lse [batch_size, num_qo_heads], base 2, with return_lse)."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        plan = self._need_plan(where)
        A.check_array(q, where, "q")
        _cuda_refused(where, q)
        if q.shape[0] != plan.seq_lens.size:
            A.fail(where, f"q.shape[0] = {q.shape[0]}", f"must be plan()'s batch size = {plan.seq_lens.size}")
        k, v, cache_dtype = self._cache_views(paged_kv_cache, where)
        return self._attend(where, q, k, v, cache_dtype, plan.block_table, plan.seq_lens, None, True,
                            q_scale, k_scale, v_scale, out, lse, return_lse, window_left, sinks)

    forward = run


def _check_prefill_plan_options(where, extras, custom_mask, packed_custom_mask, pos_encoding_mode,
                                use_fp16_qk_reduction, rope_scale, rope_theta, head_dim_qk, head_dim_vo,
                                q_data_type, o_data_type):
    """The options both prefill wrappers' plan() refuse rather than ignore."""
    _refuse_extras(where, extras)
    _refuse(where, custom_mask=(custom_mask, None), packed_custom_mask=(packed_custom_mask, None),
            pos_encoding_mode=(pos_encoding_mode, "NONE"), use_fp16_qk_reduction=(use_fp16_qk_reduction, False),
            rope_scale=(rope_scale, None), rope_theta=(rope_theta, None))
    if head_dim_vo is not None and int(head_dim_vo) != int(head_dim_qk):
        A.fail(where, f"head_dim_vo = {head_dim_vo}", f"must equal head_dim_qk = {head_dim_qk}")
    if o_data_type is not None and _dtype_str(o_data_type) != _dtype_str(q_data_type):
        A.fail(where, f"o_data_type = {o_data_type}", "must equal q_data_type (attnkit writes q's dtype)")


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """FlashInfer's paged prefill wrapper: qo_indptr ragged queries over a paged cache."""

    _name = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, **extras):
        where = f"{self._name}.plan"
        _check_prefill_plan_options(where, extras, custom_mask, packed_custom_mask, pos_encoding_mode,
                                    use_fp16_qk_reduction, rope_scale, rope_theta, head_dim_qk,
                                    head_dim_vo, q_data_type, o_data_type)
        qo = _indptr(qo_indptr, where, "qo_indptr")
        seq_lens, table = _page_table(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                      int(page_size), where)
        if qo.size != seq_lens.size + 1:
            A.fail(where, f"qo_indptr.shape = [{qo.size}]", f"must be [batch_size + 1 = {seq_lens.size + 1}]")
        self._plan = _Plan(qo, seq_lens, table, None, num_qo_heads, num_kv_heads, head_dim_qk,
                           int(page_size), causal, window_left, logits_soft_cap, sm_scale, q_data_type,
                           kv_data_type)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """q [qo_indptr[-1], num_qo_heads, head_dim] -> out of the same shape (and lse
        [qo_indptr[-1], num_qo_heads], base 2, with return_lse)."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        plan = self._need_plan(where)
        A.check_array(q, where, "q")
        _cuda_refused(where, q)
        k, v, cache_dtype = self._cache_views(paged_kv_cache, where)
        return self._attend(where, q, k, v, cache_dtype, plan.block_table, plan.seq_lens, None,
                            plan.causal, q_scale, k_scale, v_scale, out, lse, return_lse, window_left,
                            sinks)

    forward = run


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """FlashInfer's ragged prefill wrapper: ragged queries over ragged (contiguous) K/V."""

    _name = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto",
                 jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, **extras):
        where = f"{self._name}.plan"
        _check_prefill_plan_options(where, extras, custom_mask, packed_custom_mask, pos_encoding_mode,
                                    use_fp16_qk_reduction, rope_scale, rope_theta, head_dim_qk,
                                    head_dim_vo, q_data_type, o_data_type)
        qo = _indptr(qo_indptr, where, "qo_indptr")
        kv = _indptr(kv_indptr, where, "kv_indptr")
        if kv.size != qo.size:
            A.fail(where, f"kv_indptr.shape = [{kv.size}]", f"must equal qo_indptr.shape = [{qo.size}]")
        self._plan = _Plan(qo, np.diff(kv).astype(np.int32), None, kv, num_qo_heads, num_kv_heads,
                           head_dim_qk, None, causal, window_left, logits_soft_cap, sm_scale, q_data_type,
                           kv_data_type)

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """q [qo_indptr[-1], num_qo_heads, head_dim], k / v [kv_indptr[-1], num_kv_heads,
        head_dim] -> out like q (and lse [qo_indptr[-1], num_qo_heads], base 2)."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        plan = self._need_plan(where)
        for name, x in (("q", q), ("k", k), ("v", v)):
            A.check_array(x, where, name)
        _cuda_refused(where, q)
        if o_scale is not None and float(o_scale) != 1.0:
            A.fail(where, f"o_scale = {o_scale}", "is not supported (fp8 outputs)")
        k, k_fmt = A.split_fp8(k)
        v, v_fmt = A.split_fp8(v)
        cache_dtype = self._cache_dtype(k_fmt or v_fmt, A.dtype_name(k), where)
        return self._attend(where, q, k, v, cache_dtype, None, None, plan.cu_seqlens_k, plan.causal,
                            q_scale, k_scale, v_scale, out, lse, return_lse, window_left, sinks)

    forward = run


def merge_state(v_a, s_a, v_b, s_b, *, stream=None):
    """Merges two attention states over disjoint keys (FlashInfer's cascade.merge_state).

    v_*: [seq_len, num_heads, head_dim]; s_*: float32 [seq_len, num_heads] LSE in base 2.
    Returns (v, s) with v of v_a's dtype and s base 2. CPU or CUDA arrays.
    """
    where = "merge_state"
    for name, x in (("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b)):
        A.check_array(x, where, name)
    v = A.empty(v_a, v_a.shape)
    s = A.empty(v_a, (v_a.shape[1], v_a.shape[0]), "float32")
    _merge_into(v_a, s_a, v_b, s_b, v, s, stream, where)
    return v, A.contiguous(s.T * (1.0 / A.LN2))


def _natural_heads_first(s, where, name):
    """Base-2 [tokens, heads] LSE -> natural-log [heads, tokens], contiguous float32."""
    if len(s.shape) != 2:
        A.fail(where, f"{name}.shape = {list(s.shape)}", "must be [seq_len, num_heads]")
    return A.contiguous(A.as_float32(s, where, name).T * A.LN2)


def _merge_into(v_a, s_a, v_b, s_b, v_out, lse_out_nat, stream, where):
    la = _natural_heads_first(s_a, where, "s_a")
    lb = _natural_heads_first(s_b, where, "s_b")
    with A.device_guard(v_out):
        _C.merge_states(v_a, la, v_b, lb, v_out, lse_out_nat, A.resolve_stream(stream, v_out))


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, stream=None):
    """v, s <- merge((v, s), (v_other, s_other)) in place (base-2 LSE, FlashInfer's signature).
    mask (FlashInfer's per-row CUDA-graph switch) is not supported."""
    where = "merge_state_in_place"
    if mask is not None:
        A.fail(where, "mask = given", "is not supported: merge every row")
    for name, x in (("v", v), ("s", s), ("v_other", v_other), ("s_other", s_other)):
        A.check_array(x, where, name)
    lse = A.empty(v, (v.shape[1], v.shape[0]), "float32")
    _merge_into(v, s, v_other, s_other, v, lse, stream, where)
    _assign(s, lse.T * (1.0 / A.LN2))


def merge_states(v, s, *, stream=None):
    """Merges num_states attention states per row: v [seq_len, num_states, num_heads, head_dim],
    s [seq_len, num_states, num_heads] (base 2) -> (v [seq_len, num_heads, head_dim],
    s [seq_len, num_heads])."""
    where = "merge_states"
    A.check_array(v, where, "v")
    A.check_array(s, where, "s")
    if len(v.shape) != 4 or len(s.shape) != 3 or v.shape[1] < 1:
        A.fail(where, f"v.shape = {list(v.shape)}, s.shape = {list(s.shape)}",
               "must be [seq_len, num_states >= 1, num_heads, head_dim] and [seq_len, num_states, num_heads]")
    out_v = A.copy(v[:, 0])
    out_s = A.copy(A.as_float32(s[:, 0], where, "s"))
    for i in range(1, v.shape[1]):
        merge_state_in_place(out_v, out_s, v[:, i], s[:, i], stream=stream)
    return out_v, out_s
