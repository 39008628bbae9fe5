"""attnkit's own API: the backend registry, the selector, KV cache specs, write_kv and
merge_states (natural-log LSE, [num_heads, num_tokens], as everywhere inside attnkit)."""

from __future__ import annotations

import re

import numpy as np
from dataclasses import dataclass, field

from . import _arrays as A
from . import _attnkit as _C

KVCacheSpec = _C.KVCacheSpec


@dataclass(frozen=True)
class Refusal:
    backend: str
    reasons: list = field(default_factory=list)


@dataclass(frozen=True)
class Selection:
    """The selector's answer: the chosen backend and why it (reason: the caller's choice, the
    backend's preference for this configuration, or the registry's order), the kernel
    generation / path it will use and why, and every refused backend with each rule it broke."""

    backend: str
    variant: str
    refused: list = field(default_factory=list)
    reason: str = ""

    def __str__(self):
        lines = [f"backend: {self.backend}", f"why: {self.reason}", f"variant: {self.variant}"]
        for r in self.refused:
            lines.append(f"refused {r.backend}: " + "; ".join(r.reasons))
        return "\n".join(lines)


def backends():
    """Every registered backend (selector order) with its capabilities, as dicts."""
    return _C.backends()


def _device_cc(device):
    """(compute capability as major*10+minor, 0 for the CPU) of a device description: 'cpu',
    'cuda' / 'cuda:N' (asks PyTorch), 'sm90' / 'sm_90a', (9, 0), or a torch.device."""
    if device is None or device == "cpu":
        return 0
    if isinstance(device, tuple):
        return int(device[0]) * 10 + int(device[1])
    text = str(device)
    m = re.fullmatch(r"sm_?(\d+)(\d)a?", text)
    if m:
        return int(m.group(1)) * 10 + int(m.group(2))
    if text.startswith("cuda"):
        import torch

        major, minor = torch.cuda.get_device_capability(device if text != "cuda" else None)
        return major * 10 + minor
    A.fail("select", f"device = {device!r}", "must be 'cpu', 'cuda[:N]', 'smXY' or (major, minor)")


def select(num_heads, num_kv_heads, head_size, dtype="bfloat16", kv_cache_dtype="auto", block_size=16,
           layout="NHD", *, sinks=False, alibi=False, softcap=False, sliding_window=False,
           non_causal=False, lse=False, device="cpu", num_sms=0, backend=None) -> Selection:
    """Which backend serves this layer on `device`, which variant, and why the others cannot.
    With backend=NAME the choice is forced (AttnkitError listing its reasons if it cannot)."""
    d = _C.select(int(num_heads), int(num_kv_heads), int(head_size), str(dtype), str(kv_cache_dtype),
                  int(block_size), str(layout), bool(sinks), bool(alibi), bool(softcap),
                  bool(sliding_window), bool(non_causal), bool(lse), _device_cc(device), int(num_sms),
                  backend)
    return Selection(d["backend"], d["variant"], [Refusal(r["backend"], list(r["reasons"])) for r in d["refused"]],
                     d["reason"])


def split_decodes_and_prefills(query_start_loc, seq_lens, decode_threshold=1):
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens) of a batch ordered
    decodes first (a decode has query_len <= decode_threshold); AttnkitError names the first
    decode found after a prefill."""
    where = "split_decodes_and_prefills"
    d = _C.split_decodes_and_prefills(A.host_int32(query_start_loc, where, "query_start_loc"),
                                      A.host_int32(seq_lens, where, "seq_lens"), int(decode_threshold))
    return d["num_decodes"], d["num_prefills"], d["num_decode_tokens"], d["num_prefill_tokens"]


def decode_first_order(query_start_loc, seq_lens, decode_threshold=1):
    """The permutation (list) that puts decodes first, stable within each group: new request i
    is old request perm[i]."""
    where = "decode_first_order"
    return list(_C.decode_first_order(A.host_int32(query_start_loc, where, "query_start_loc"),
                                      A.host_int32(seq_lens, where, "seq_lens"), int(decode_threshold)))


def kv_cache_shape(backend, num_blocks, block_size, num_kv_heads, head_size, cache_dtype="bfloat16"):
    """The backend's logical KV cache shape (num_blocks, 2, block_size, num_kv_heads, row)."""
    return tuple(_C.kv_cache_shape(backend, int(num_blocks), int(block_size), int(num_kv_heads),
                                   int(head_size), str(cache_dtype)))


def kv_cache_stride_order(backend, layout="NHD"):
    """Permutation from the logical to the physical dim order for `layout`."""
    return tuple(_C.kv_cache_stride_order(backend, layout))


def write_kv(key, value, kv_cache, slot_mapping, layout="NHD", kv_cache_dtype="auto", k_scale=None,
             v_scale=None, *, stream=None):
    """Writes new tokens' K/V into one physically shaped cache tensor: NHD
    [num_blocks, 2, block_size, num_kv_heads, head_size] or HND
    [num_blocks, 2, num_kv_heads, block_size, head_size] (contiguous). fp8 caches: uint8 or fp8
    tensors with kv_cache_dtype 'fp8_e4m3' / 'fp8_e5m2'; nvfp4: uint8 with 'nvfp4'."""
    where = "write_kv"
    for name, x in (("key", key), ("value", value), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        A.check_array(x, where, name)
    kv_cache, fmt = A.split_fp8(kv_cache)
    cache_dtype = A.cache_dtype_for(kv_cache_dtype, fmt)
    with A.device_guard(kv_cache):
        _C.write_kv(key, value, kv_cache, slot_mapping, layout, cache_dtype,
                    A.scale_like(k_scale, kv_cache, where, "k_scale"),
                    A.scale_like(v_scale, kv_cache, where, "v_scale"),
                    A.resolve_stream(stream, kv_cache, key))


def merge_states(out_a, lse_a, out_b, lse_b, out=None, lse_out=None, *, return_lse=True, stream=None):
    """Merges two partial results over disjoint keys: out_* [num_tokens, num_heads, head_size],
    lse_* float32 [num_heads, num_tokens] natural log. Returns (out, lse) (or out)."""
    where = "merge_states"
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        A.check_array(x, where, name)
    if out is None:
        out = A.empty(out_a, out_a.shape)
    if lse_out is None and return_lse:
        lse_out = A.empty(out_a, lse_a.shape, "float32")
    with A.device_guard(out):
        _C.merge_states(out_a, lse_a, out_b, lse_b, out, lse_out, A.resolve_stream(stream, out))
    return (out, lse_out) if return_lse else out


class LayerMetadata:
    """A batch's metadata as the layer's backend builder made it (keeps the device copies of
    the small arrays alive for the kernels)."""

    def __init__(self, native, device_arrays):
        self._native = native
        self._device_arrays = device_arrays

    num_reqs = property(lambda self: self._native.num_reqs)
    num_actual_tokens = property(lambda self: self._native.num_actual_tokens)
    max_query_len = property(lambda self: self._native.max_query_len)
    max_seq_len = property(lambda self: self._native.max_seq_len)
    causal = property(lambda self: self._native.causal)


class AttentionLayer:
    """One attention layer through attnkit's own backend abstraction: the selector picks the
    backend (or `backend=` names it), its builder turns batch metadata into the backend's own,
    its impl runs forward. This is the C++ engine path, from Python.

    Example (CPU): layer = AttentionLayer(8, 2, 64, "float32"); md = layer.build_metadata(
    query_start_loc, seq_lens, block_table, slot_mapping); out = layer.forward(q, k, v, kv_cache, md)
    with kv_cache of shape layer.kv_cache_physical_shape(num_blocks).
    """

    def __init__(self, num_heads, num_kv_heads, head_size, dtype="bfloat16", kv_cache_dtype="auto", block_size=16,
                 layout="NHD", *, sinks=False, alibi=False, softcap=False, sliding_window=False, non_causal=False,
                 lse=False, device="cpu", num_sms=0, backend=None):
        self._device = device
        self._workspace = None  # the caller's (set_workspace)
        self._own_workspace = None  # else the layer's, made by _ensure_workspace
        self._device_buffer = None  # the builder's plans' device copies (set_device_buffer, or made by build_metadata)
        self._native = _C.Layer(int(num_heads), int(num_kv_heads), int(head_size), str(dtype), str(kv_cache_dtype),
                                int(block_size), str(layout), bool(sinks), bool(alibi), bool(softcap),
                                bool(sliding_window), bool(non_causal), bool(lse), _device_cc(device),
                                int(num_sms), backend)

    backend = property(lambda self: self._native.backend, doc="the chosen backend's name")
    variant = property(lambda self: self._native.variant, doc="the kernel generation / path, with why")
    reorder_batch_threshold = property(lambda self: self._native.reorder_batch_threshold)

    def workspace_bytes(self, max_tokens):
        """Device workspace bytes the layer's GPU forwards can need for batches of up to
        max_tokens query tokens (split-KV or plan partials; 0: none)."""
        return self._native.workspace_bytes(int(max_tokens))

    def workspace_bytes_for(self, metadata):
        """Device workspace bytes the GPU forward of this batch needs (0: none)."""
        return self._native.workspace_bytes_for(metadata._native)

    def set_workspace(self, workspace):
        """Hand the layer a CUDA buffer of at least workspace_bytes(max_tokens) bytes; a forward
        that needs more raises. None: the layer allocates one through PyTorch (the caching
        allocator: a graph capture takes it from the graph's pool) when a forward needs more than
        it holds. Keep the buffer alive while the layer runs; layers on one stream may share it."""
        self._workspace = workspace
        self._own_workspace = None
        self._native.set_workspace(workspace)

    def _ensure_workspace(self, like, metadata):
        # The C++ impl never allocates: without the caller's buffer this layer holds its own.
        if self._workspace is not None:
            return
        need = self._native.workspace_bytes_for(metadata._native)
        have = 0 if self._own_workspace is None else int(self._own_workspace.numel())
        if need > have:
            self._own_workspace = A.empty(like, (need,), "uint8")
            self._native.set_workspace(self._own_workspace)

    def device_buffer_bytes(self):
        """Device bytes the builder's metadata needs for GPU forwards (the FlashInfer-style plans'
        device copies, sized for the builder's limits; 0: none)."""
        return self._native.device_buffer_bytes()

    def set_device_buffer(self, buffer):
        """Hand the builder a CUDA buffer of at least device_buffer_bytes() bytes (else the first
        GPU build_metadata allocates one through PyTorch). Keep it alive while the layer runs."""
        self._native.set_device_buffer(buffer)
        self._device_buffer = buffer

    def kv_cache_shape(self, num_blocks):
        """The backend's logical cache shape (num_blocks, 2, block_size, num_kv_heads, row)."""
        return tuple(self._native.kv_cache_shape(int(num_blocks)))

    def kv_cache_physical_shape(self, num_blocks):
        """The shape to allocate: the logical shape in the layout's stride order."""
        shape = self.kv_cache_shape(num_blocks)
        return tuple(shape[d] for d in self._native.kv_cache_stride_order())

    def build_metadata(self, query_start_loc, seq_lens, block_table, slot_mapping, causal=True, *, dcp=None):
        """query_start_loc int32 [num_reqs+1], seq_lens int32 [num_reqs], block_table int32
        [num_reqs, max_blocks], slot_mapping int64 [num_tokens]: host arrays, or CUDA tensors
        (then the host copies are made here). On a CUDA layer host arrays are copied to the
        device with PyTorch. dcp=(world_size, rank, interleave): this rank's shard of decode
        context parallelism (seq_lens global, block_table over the rank's cache; the forward
        returns the rank's partial and LSE for the combine; the reference backend runs any shard,
        flash_attn on a GPU the shards whose queries see all of the rank's keys: causal decodes,
        or causal=False)."""
        where = "AttentionLayer.build_metadata"
        given = (query_start_loc, seq_lens, block_table, slot_mapping)
        host = [A.host_int32(x, where, n) for x, n in zip(given[:3], ("query_start_loc", "seq_lens", "block_table"))]
        host.append(_host_int64(slot_mapping, where))
        dev = [None] * 4
        on_gpu = [x for x in given if A.is_cuda(x)]
        if on_gpu or _device_cc(self._device) != 0:
            import torch

            target = on_gpu[0].device if on_gpu and A.is_torch(on_gpu[0]) else \
                (self._device if str(self._device).startswith("cuda") else "cuda")
            dev = [_device_int(x, h, target) for x, h in zip(given, host)]
        world, rank, interleave = (1, 0, 1) if dcp is None else (int(x) for x in dcp)
        local_dev = None
        if world > 1 and dev[1] is not None:  # (a GPU shard reads the rank's key counts: their device copy)
            lens = host[1].astype(np.int64)
            base = (lens // max(interleave, 1) // world) * interleave
            local = (base + np.clip(lens - base * world - rank * interleave, 0, interleave)).astype(np.int32)
            local_dev = _device_int(None, local, dev[1].device)
            dev.append(local_dev)
        if dev[0] is not None and self._device_buffer is None and self._native.device_buffer_bytes() > 0:
            # (made here, outside any forward: a captured forward allocates nothing)
            self.set_device_buffer(A.empty(dev[0], (self._native.device_buffer_bytes(),), "uint8"))
        native = self._native.build(*host, bool(causal), *dev[:4], world, rank, interleave, local_dev)
        return LayerMetadata(native, dev)

    def forward(self, q, k, v, kv_cache, metadata, out=None, *, scale=None, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, sinks=None, k_scale=None, v_scale=None, return_lse=False, stream=None):
        """Attention of the batch's new tokens: q [num_tokens, num_heads, head_size], k / v the
        new tokens' K/V (may be None: they are already in the cache), kv_cache the physically
        shaped cache. Returns out, or (out, lse) with lse [num_heads, num_tokens] natural log."""
        where = "AttentionLayer.forward"
        A.check_array(q, where, "q")
        kv_cache, _ = A.split_fp8(kv_cache)
        if out is None:
            out = A.empty(q, q.shape)
        lse = A.empty(q, (q.shape[1], q.shape[0]), "float32") if return_lse else None
        left, right = (int(w) for w in window_size)
        with A.device_guard(q):
            if A.is_cuda(q):
                self._ensure_workspace(q, metadata)
            self._native.forward(q, k, v, kv_cache, metadata._native, out, 0.0 if scale is None else float(scale),
                                 left, right, float(softcap or 0.0), A.as_float32(alibi_slopes, where, "alibi_slopes"),
                                 A.as_float32(sinks, where, "sinks"), A.scale_like(k_scale, kv_cache, where, "k_scale"),
                                 A.scale_like(v_scale, kv_cache, where, "v_scale"), lse, A.resolve_stream(stream, q))
        return (out, lse) if return_lse else out


def _host_int64(x, where):
    import numpy as np

    if A.is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        A.fail(where, f"slot_mapping.dtype = {a.dtype}", "must be an integer array")
    return np.ascontiguousarray(a, dtype=np.int64)


def _device_int(x, host, target):
    """The device copy the kernels read: x itself when it is a CUDA array of the right dtype,
    else the host copy moved to `target` with PyTorch."""
    if A.is_cuda(x) and A.dtype_name(x) == host.dtype.name:
        return A.contiguous(x)
    import torch

    return torch.from_numpy(host).to(target)


def _default_stream(stream):
    if stream is not None:
        return A.resolve_stream(stream)
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.current_stream().cuda_stream)
    except ImportError:
        pass
    return 0


def device_errors(stream=None):
    """What the GPU kernels found wrong in the metadata they were given since the last read (on
    the current device), and clears it: a dict with faults (count), first (the first violation
    in words), request, value, dropped_kv_tokens (write_kv slots outside the cache) and message.
    The kernels read nothing outside their buffers and write NaN to the rows a violation
    affects. One small copy and a wait on `stream` (default: PyTorch's current stream); a build
    without CUDA reports nothing."""
    return _C.device_errors(_default_stream(stream))


def check_device_errors(stream=None):
    """device_errors(stream), raising AttnkitError with its message when it holds anything."""
    e = device_errors(stream)
    if e["faults"] or e["dropped_kv_tokens"]:
        raise _C.AttnkitError(e["message"])
    return e


def set_check_device_errors(on):
    """Debug mode: every GPU call checks the record after its launches and raises (not inside a
    CUDA-graph capture). Also on with ATTNKIT_CHECK_DEVICE_ERRORS=1 in the environment."""
    _C.set_check_device_errors(bool(on))
