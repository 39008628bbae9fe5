"""FlashInfer-compatible wrappers: plan(...) once per batch, run(...) per layer, with FlashInfer's
argument names, page-table format and **base-2 LSE** convention (attnkit itself uses natural
log; conversion happens here, at the boundary).

plan() hands the page table and the batch to the C++ FlashInfer-style host side (the page table
is validated and held by flashinfer::PageTable, the batch planned by plan_batch into
fixed-capacity buffers; `wrapper.plan_info` shows what it decided). run() executes the plan: on
CPU inputs on the backend's CPU path (the reference's math, item by item through the page
table); on CUDA inputs, for the decode wrapper, with the planned decode kernels (the caller's
float_workspace_buffer holds the split tiles' partials; the plan's device copy is made by the
first CUDA run and refreshed by every later plan(), so a run captured in a CUDA graph replays
after a re-plan). The prefill wrappers raise AttnkitError on CUDA inputs (their kernels are not
built yet). merge_state(s) run on both devices through attnkit's merge.
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
# kv_data_type names of an NVFP4 cache (FlashInfer passes its packed codes as uint8).
_NVFP4_NAMES = ("uint8", "nvfp4", "fp4_e2m1", "float4_e2m1fn_x2")


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


def _table(where, indptr, indices, last_page_len):
    """FlashInfer's CSR page table as host int32 arrays (the C++ PageTable checks the rest)."""
    return [A.host_int32(x, where, name) for x, name in
            ((indptr, "indptr"), (indices, "indices"), (last_page_len, "last_page_len"))]


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


class _Plan:
    """The attention options plan() fixed (the batch itself is in the C++ plan)."""

    def __init__(self, head_dim, window_left, logits_soft_cap, sm_scale, q_data_type, kv_data_type):
        self.head_dim = int(head_dim)
        self.window_left = int(window_left)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.sm_scale = sm_scale
        self.q_data_type = _dtype_str(q_data_type)
        self.kv_data_type = _dtype_str(kv_data_type) or self.q_data_type


def _rows(buf, extra=0):
    """Capacity given by a CUDA-graph buffer's length (0 when there is none)."""
    return max(int(buf.shape[0]) - extra, 0) if buf is not None else 0


class _Wrapper:
    _name = "wrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, backend="auto",
                 max_reqs=0, max_pages=0):
        # The workspace is FlashInfer's GPU resource; the CPU path needs none (kept for call
        # compatibility). In CUDA-graph mode the buffers' lengths fix the plan's capacity
        # (max_reqs, max_pages; the tokens come from the first plan), as FlashInfer's do.
        self._layout = _check_layout(kv_layout, self._name)
        self._float_workspace_buffer = float_workspace_buffer
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend
        self._plan = None
        graph = self._use_cuda_graph
        self._cpp = _C.FlashInferPlan(max_reqs if graph else 0, max_pages if graph else 0, graph)

    @property
    def plan_info(self) -> dict:
        """What the C++ plan of the last plan() decided (a copy; {} before plan): kernel, tile_q,
        kv_chunk_tokens, num_items, num_slots, split_kv, num_split_tiles, num_partial_rows,
        num_merged_rows, num_reqs, num_tokens, page_size, group_size and the capacity."""
        return self._cpp.info() if self._plan is not None else {}

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._float_workspace_buffer = float_workspace_buffer

    def _need_plan(self, where):
        if self._plan is None:
            A.fail(where, "plan = None", "call plan(...) before run(...)")
        return self._plan

    def _cache_views(self, paged_kv_cache, where, kv_cache_sf=None):
        """(k, v) as [num_pages, page_size, num_kv_heads, head_dim] views (no copy), the attnkit
        cache dtype name and, for an NVFP4 cache (kv_cache_sf given: FlashInfer's block scales,
        a (k_sf, v_sf) tuple or one [num_pages, 2, ...] tensor of e4m3 bytes), (k_sf, v_sf) views
        in the same order ((None, None) otherwise). NVFP4: k / v are uint8 [..., head_dim / 2]."""
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
        if kv_cache_sf is None:
            if self._plan.kv_data_type in _NVFP4_NAMES:
                A.fail(where, "kv_cache_sf = None", "an NVFP4 cache (plan()'s kv_data_type) needs its block scales")
            return k, v, self._cache_dtype(k_fmt or v_fmt, A.dtype_name(k), where), (None, None)
        if isinstance(kv_cache_sf, (tuple, list)):
            if len(kv_cache_sf) != 2:
                A.fail(where, f"len(kv_cache_sf) = {len(kv_cache_sf)}", "a tuple must be (k_sf, v_sf)")
            k_sf, v_sf = kv_cache_sf
        else:
            A.check_array(kv_cache_sf, where, "kv_cache_sf")
            if len(kv_cache_sf.shape) != 5 or kv_cache_sf.shape[1] != 2:
                A.fail(where, f"kv_cache_sf.shape = {list(kv_cache_sf.shape)}",
                       "must be [num_pages, 2, page_size, H, D / 16] (NHD) or [num_pages, 2, H, page_size, D / 16] (HND)")
            k_sf, v_sf = kv_cache_sf[:, 0], kv_cache_sf[:, 1]
        for name, x in (("k_sf", k_sf), ("v_sf", v_sf)):
            A.check_array(x, where, name)
            if A.dtype_name(x) not in ("uint8", "float8_e4m3fn"):
                A.fail(where, f"{name}.dtype = {A.dtype_name(x)}", "must be float8_e4m3fn or uint8 (e4m3 block scales)")
        if self._layout == "HND":
            k_sf, v_sf = k_sf.swapaxes(1, 2), v_sf.swapaxes(1, 2)
        k_sf, _ = A.split_fp8(k_sf)
        v_sf, _ = A.split_fp8(v_sf)
        if A.dtype_name(k) != "uint8" or A.dtype_name(v) != "uint8":
            A.fail(where, f"cache dtype = {A.dtype_name(k)}", "an NVFP4 cache (kv_cache_sf given) holds uint8 packed codes")
        want = self._plan.kv_data_type
        if want is not None and want not in _NVFP4_NAMES:
            A.fail(where, "kv_cache_sf given", f"is for NVFP4 caches: plan()'s kv_data_type is {want}")
        return k, v, "nvfp4", (k_sf, v_sf)

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

    def _attend(self, where, q, k, v, cache_dtype, q_scale, k_scale, v_scale, out, lse, return_lse,
                window_left, sinks, sf=(None, None)):
        plan = self._need_plan(where)
        A.check_array(q, where, "q")
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
        if A.is_cuda(q):  # the planned kernels
            self._cpp.run_cuda(where, q, k, v, cache_dtype, scale, plan.logits_soft_cap,
                               A.as_float32(sinks, where, "sinks"), out, lse_nat,
                               self._float_workspace_buffer, A.resolve_stream(None, q), *sf)
        else:
            self._cpp.run(where, q, k, v, cache_dtype, scale, plan.logits_soft_cap,
                          A.as_float32(sinks, where, "sinks"), out, lse_nat, *sf)
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
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                         _rows(paged_kv_indptr_buffer, 1), _rows(paged_kv_indices_buffer))
        self._use_tensor_cores = bool(use_tensor_cores)
        self._q_len_per_req = 1

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
                rope_theta=(rope_theta, None))
        if o_data_type is not None and _dtype_str(o_data_type) != _dtype_str(data_type or q_data_type):
            A.fail(where, f"o_data_type = {o_data_type}", "must equal q_data_type (attnkit writes q's dtype)")
        if int(q_len_per_req) != q_len_per_req or not 1 <= int(q_len_per_req) <= 8:
            A.fail(where, f"q_len_per_req = {q_len_per_req}", "must be an integer in [1, 8]")
        self._plan = None  # kept only when the C++ page table and plan accept the batch
        # q_len_per_req > 1 (speculative decoding): each request's tokens are the last of its
        # keys, causal among themselves; always the tensor-core plan.
        self._cpp.plan_paged(where, None, *_table(where, indptr, indices, last_page_len), int(num_qo_heads),
                             int(num_kv_heads), int(head_dim), int(page_size), True, int(window_left),
                             self._use_tensor_cores, int(q_len_per_req),
                             _dtype_str(kv_data_type or data_type) in _NVFP4_NAMES)
        self._q_len_per_req = int(q_len_per_req)
        self._plan = _Plan(head_dim, window_left, logits_soft_cap, sm_scale, data_type or q_data_type,
                           kv_data_type or data_type)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None):
        """q [batch_size * q_len_per_req, num_qo_heads, head_dim] -> out of q's shape (and lse
        [tokens, num_qo_heads], base 2, with return_lse). NVFP4 caches: the packed codes as
        paged_kv_cache, their e4m3 block scales as kv_cache_sf, the global scales as k_scale /
        v_scale."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        self._need_plan(where)
        A.check_array(q, where, "q")
        tokens = self._cpp.num_reqs * self._q_len_per_req
        if q.shape[0] != tokens:
            A.fail(where, f"q.shape[0] = {q.shape[0]}",
                   f"must be plan()'s batch size x q_len_per_req = {self._cpp.num_reqs} x {self._q_len_per_req}")
        k, v, cache_dtype, sf = self._cache_views(paged_kv_cache, where, kv_cache_sf)
        return self._attend(where, q, k, v, cache_dtype, q_scale, k_scale, v_scale, out, lse, return_lse,
                            window_left, sinks, sf)

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
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                         _rows(qo_indptr_buf, 1) or _rows(paged_kv_indptr_buf, 1), _rows(paged_kv_indices_buf))

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, **extras):
        where = f"{self._name}.plan"
        _check_prefill_plan_options(where, extras, custom_mask, packed_custom_mask, pos_encoding_mode,
                                    use_fp16_qk_reduction, rope_scale, rope_theta, head_dim_qk,
                                    head_dim_vo, q_data_type, o_data_type)
        self._plan = None
        self._cpp.plan_paged(where, A.host_int32(qo_indptr, where, "qo_indptr"),
                             *_table(where, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len),
                             int(num_qo_heads), int(num_kv_heads), int(head_dim_qk), int(page_size),
                             bool(causal), int(window_left), True, 1, _dtype_str(kv_data_type) in _NVFP4_NAMES)
        self._plan = _Plan(head_dim_qk, window_left, logits_soft_cap, sm_scale, q_data_type, kv_data_type)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None):
        """q [qo_indptr[-1], num_qo_heads, head_dim] -> out of the same shape (and lse
        [qo_indptr[-1], num_qo_heads], base 2, with return_lse). NVFP4: as the decode wrapper."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        self._need_plan(where)
        A.check_array(q, where, "q")
        k, v, cache_dtype, sf = self._cache_views(paged_kv_cache, where, kv_cache_sf)
        return self._attend(where, q, k, v, cache_dtype, q_scale, k_scale, v_scale, out, lse, return_lse,
                            window_left, sinks, sf)

    forward = run


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """FlashInfer's ragged prefill wrapper: ragged queries over ragged (contiguous) K/V."""

    _name = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto",
                 jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                         _rows(qo_indptr_buf, 1) or _rows(kv_indptr_buf, 1))

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, **extras):
        where = f"{self._name}.plan"
        _check_prefill_plan_options(where, extras, custom_mask, packed_custom_mask, pos_encoding_mode,
                                    use_fp16_qk_reduction, rope_scale, rope_theta, head_dim_qk,
                                    head_dim_vo, q_data_type, o_data_type)
        self._plan = None
        self._cpp.plan_ragged(where, A.host_int32(qo_indptr, where, "qo_indptr"),
                              A.host_int32(kv_indptr, where, "kv_indptr"), int(num_qo_heads),
                              int(num_kv_heads), int(head_dim_qk), bool(causal), int(window_left))
        self._plan = _Plan(head_dim_qk, window_left, logits_soft_cap, sm_scale, q_data_type, kv_data_type)

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """q [qo_indptr[-1], num_qo_heads, head_dim], k / v [kv_indptr[-1], num_kv_heads,
        head_dim] -> out like q (and lse [qo_indptr[-1], num_qo_heads], base 2)."""
        where = f"{self._name}.run"
        _no_positional_extras(where, args)
        self._need_plan(where)
        for name, x in (("q", q), ("k", k), ("v", v)):
            A.check_array(x, where, name)
        if o_scale is not None and float(o_scale) != 1.0:
            A.fail(where, f"o_scale = {o_scale}", "is not supported (fp8 outputs)")
        k, k_fmt = A.split_fp8(k)
        v, v_fmt = A.split_fp8(v)
        cache_dtype = self._cache_dtype(k_fmt or v_fmt, A.dtype_name(k), where)
        return self._attend(where, q, k, v, cache_dtype, q_scale, k_scale, v_scale, out, lse, return_lse,
                            window_left, sinks)

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
