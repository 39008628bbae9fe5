"""Test data builders (NumPy, CPU) and comparisons that name the worst element."""

import math

import numpy as np

import pyref

FP8_NUMPY = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def assert_close(actual, expected, atol, rtol, what):
    """actual (array) vs expected (nested lists); -inf must match -inf exactly. On failure the
    message names the worst element, its coordinates and both values."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    if a.size == 0:
        return
    a_inf, e_inf = np.isneginf(a), np.isneginf(e)
    if not np.array_equal(a_inf, e_inf):
        idx = tuple(int(i) for i in np.argwhere(a_inf != e_inf)[0])
        raise AssertionError(f"{what}: -inf mismatch at {idx}: got {a[idx]}, expected {e[idx]}")
    finite = ~e_inf
    a_f, e_f = np.where(finite, a, 0.0), np.where(finite, e, 0.0)
    err = np.abs(a_f - e_f)
    err = np.where(np.isnan(err), np.inf, err)  # NaN (or inf - inf) is never close
    excess = err - (atol + rtol * np.abs(e_f))
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
    if excess[idx] > 0:
        raise AssertionError(
            f"{what}: worst element at {tuple(int(i) for i in idx)}: got {a[idx]!r}, expected "
            f"{e[idx]!r} (|diff| {err[idx]:.3g} > atol {atol} + rtol {rtol} * |expected|)")


def tolerances(dtype):
    return (1e-5, 1e-5) if np.dtype(dtype) == np.float32 else (2e-3, 2e-3)


def fp8_codes(fmt, max_abs):
    """Every fp8 code of `fmt` whose value is finite with |value| <= max_abs."""
    return np.array([c for c in range(256)
                     if math.isfinite(pyref.fp8_value(c, fmt)) and abs(pyref.fp8_value(c, fmt)) <= max_abs],
                    dtype=np.uint8)


class PagedBatch:
    """A varlen batch over a paged cache in NumPy, with the same data as plain lists for pyref.

    kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_size] (NHD) or
    [num_blocks, 2, num_kv_heads, block_size, head_size] (HND), dtype `dtype`, or uint8 holding
    fp8 codes when fp8 is 'e4m3' / 'e5m2' (values = code value * k_scale / v_scale).
    Blocks are shuffled and the cache has spare blocks, so block tables are non-trivial.
    """

    def __init__(self, rng, q_lens, kv_lens, num_heads, num_kv_heads, head_size, block_size,
                 dtype=np.float32, fp8=None, k_scale=1.0, v_scale=1.0, layout="NHD", spare_blocks=3,
                 nvfp4=False):
        self.q_lens, self.kv_lens = list(q_lens), list(kv_lens)
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.block_size, self.layout, self.fp8 = block_size, layout, fp8
        num_reqs = len(q_lens)
        blocks = [-(-n // block_size) for n in kv_lens]
        num_blocks = sum(blocks) + spare_blocks
        ids = rng.permutation(num_blocks).astype(np.int32)
        width = max(max(blocks, default=0), 1)
        self.block_table = np.zeros((num_reqs, width), dtype=np.int32)
        at = 0
        for r, nb in enumerate(blocks):
            self.block_table[r, :nb] = ids[at:at + nb]
            at += nb
        self.cu_seqlens_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        self.seqused_k = np.array(kv_lens, dtype=np.int32)
        self.max_seqlen_q = max(q_lens, default=0)
        self.max_seqlen_k = max(kv_lens, default=0)
        total_q = int(self.cu_seqlens_q[-1])
        self.q = rng.standard_normal((total_q, num_heads, head_size)).astype(dtype)
        phys = (num_blocks, 2, block_size, num_kv_heads, head_size) if layout == "NHD" else \
            (num_blocks, 2, num_kv_heads, block_size, head_size)
        if nvfp4:
            # FlashInfer's NVFP4 form: kv_cache uint8 packed codes [..., head_size / 2] (value 2i
            # in the low nibble of byte i), kv_sf e4m3 block scales [..., head_size / 16] (codes
            # 0x20..0x3f: 0.125 .. 1.875); values = code x block scale x k_scale / v_scale.
            self.kv_cache = rng.integers(0, 256, size=phys[:-1] + (head_size // 2,), dtype=np.uint8)
            self.kv_sf = rng.integers(0x20, 0x40, size=phys[:-1] + (head_size // 16,), dtype=np.uint8)
            e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 2) * np.repeat([1.0, -1.0], 8)
            lo, hi = e2m1[self.kv_cache & 0xF], e2m1[self.kv_cache >> 4]
            vals = np.stack([lo, hi], axis=-1).reshape(phys)
            sf = 2.0 ** (((self.kv_sf >> 3) & 0xF).astype(np.float64) - 7) * (1 + (self.kv_sf & 7) / 8.0)
            vals = vals * np.repeat(sf, 16, axis=-1)
            full = [vals[:, s] * (k_scale, v_scale)[s] for s in range(2)]
        elif fp8:
            codes = fp8_codes(fp8, 2.0)
            self.kv_cache = rng.choice(codes, size=phys)
            scales = (k_scale, v_scale)
            value_of = np.array([pyref.fp8_value(c, fp8) if math.isfinite(pyref.fp8_value(c, fp8)) else 0.0
                                 for c in range(256)])
            full = [value_of[self.kv_cache[:, s]] * scales[s] for s in range(2)]
        else:
            self.kv_cache = rng.standard_normal(phys).astype(dtype)
            full = [self.kv_cache[:, s].astype(np.float64) for s in range(2)]
        if layout == "HND":
            full = [f.swapaxes(1, 2) for f in full]
        # Per-request dequantized keys/values as lists [seq_len][kv_heads][d].
        self.keys_ref, self.values_ref = [], []
        for r, n in enumerate(kv_lens):
            pos = np.arange(n)
            blk, off = self.block_table[r, pos // block_size], pos % block_size
            self.keys_ref.append(full[0][blk, off].tolist())
            self.values_ref.append(full[1][blk, off].tolist())
        self.q_ref = self.q.astype(np.float64).tolist()

    def cache_views(self):
        """vLLM's key_cache / value_cache: kv_cache[:, 0] / kv_cache[:, 1] as
        [num_blocks, block_size, num_kv_heads, head_size] views (strided, no copy)."""
        k, v = self.kv_cache[:, 0], self.kv_cache[:, 1]
        if self.layout == "HND":
            k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
        return k, v

    def expected(self, **kw):
        return pyref.attention(self.q_ref, self.keys_ref, self.values_ref, self.cu_seqlens_q.tolist(),
                               self.kv_lens, self.num_kv_heads, **kw)


def page_table(b):
    """FlashInfer's CSR page table (indptr, indices, last_page_len) of a PagedBatch."""
    pages = [-(-n // b.block_size) for n in b.kv_lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.concatenate([b.block_table[r, :p] for r, p in enumerate(pages)] + [np.zeros(0, np.int32)])
    last = np.array([n - (p - 1) * b.block_size if p else 0 for n, p in zip(b.kv_lens, pages)], np.int32)
    return indptr, indices.astype(np.int32), last
