"""attnkit's own API: the backend registry, the selector, KV cache specs, write_kv and
merge_states (natural-log LSE, [num_heads, num_tokens], as everywhere inside attnkit)."""

from __future__ import annotations

import re
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
    """The selector's answer: the chosen backend, the kernel generation / path it will use and
    why, and every refused backend with each rule it broke."""

    backend: str
    variant: str
    refused: list = field(default_factory=list)

    def __str__(self):
        lines = [f"backend: {self.backend}", f"variant: {self.variant}"]
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
    return Selection(d["backend"], d["variant"], [Refusal(r["backend"], list(r["reasons"])) for r in d["refused"]])


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
