"""attnkit.reshape_and_cache_flash (and the native write_kv) on CPU NumPy arrays: exact cache
contents against a plain-Python model of the write, over dtypes, layouts, block sizes, head
counts and fp8 formats with per-tensor and per-head scales."""

import struct

import numpy as np
import pytest

import attnkit
import pyref


def f32(x):
    """x rounded to float32 (the precision the op divides in)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def make_cache(rng, num_blocks, block_size, num_kv_heads, head_size, layout, dtype):
    phys = (num_blocks, 2, block_size, num_kv_heads, head_size) if layout == "NHD" else \
        (num_blocks, 2, num_kv_heads, block_size, head_size)
    if dtype == np.uint8:
        return rng.integers(0, 256, size=phys, dtype=np.uint8)
    return rng.standard_normal(phys).astype(dtype)


def views(cache, layout):
    k, v = cache[:, 0], cache[:, 1]
    return (k, v) if layout == "NHD" else (k.swapaxes(1, 2), v.swapaxes(1, 2))


def expected_cache(cache, layout, key, value, slots, block_size, convert):
    """The cache after the write, in plain Python: every token with a slot >= 0 lands at
    (slot // block_size, slot % block_size); convert(x, side, head) gives the stored element."""
    exp = cache.copy()
    kv, vv = views(exp, layout)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, block_size)
        for h in range(key.shape[1]):
            kv[blk, off, h] = [convert(x, 0, h) for x in key[t, h].tolist()]
            vv[blk, off, h] = [convert(x, 1, h) for x in value[t, h].tolist()]
    return exp


def slot_mapping(rng, num_tokens, num_slots, padding):
    slots = rng.choice(num_slots, size=num_tokens, replace=False).astype(np.int64)
    if padding:
        slots[rng.choice(num_tokens, size=padding, replace=False)] = -1
    return slots


def assert_cache_equal(got, exp, what):
    if np.array_equal(got, exp):
        return
    idx = tuple(int(i) for i in np.argwhere(got != exp)[0])
    raise AssertionError(f"{what}: first difference at {idx}: got {got[idx]!r}, expected {exp[idx]!r}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size,heads,head_size", [(16, 1, 16), (32, 4, 64), (16, 2, 128)])
def test_auto_cache(dtype, layout, block_size, heads, head_size):
    rng = np.random.default_rng(block_size + heads)
    cache = make_cache(rng, 6, block_size, heads, head_size, layout, dtype)
    # 12 tokens, 2 of them padding; key/value carry 3 extra rows (CUDA-graph padding).
    key = rng.standard_normal((15, heads, head_size)).astype(dtype)
    value = rng.standard_normal((15, heads, head_size)).astype(dtype)
    slots = slot_mapping(rng, 12, 6 * block_size, 2)
    exp = expected_cache(cache, layout, key, value, slots, block_size, lambda x, s, h: x)
    attnkit.reshape_and_cache_flash(key, value, *views(cache, layout), slots, "auto", None, None)
    assert_cache_equal(cache, exp, f"{np.dtype(dtype)} {layout}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("src_dtype", [np.float32, np.float16])
def test_fp8_cache(fmt, per_head, layout, src_dtype):
    rng = np.random.default_rng(3)
    heads, head_size, block_size = 2, 32, 16
    cache = make_cache(rng, 4, block_size, heads, head_size, layout, np.uint8)
    key = (rng.standard_normal((9, heads, head_size)) * 4).astype(src_dtype)
    value = (rng.standard_normal((9, heads, head_size)) * 4).astype(src_dtype)
    key[0, 0, :4] = [1e4, -1e4, 1e-6, -0.0]  # saturation, underflow and signed zero
    if src_dtype == np.float32:
        value[1, 1, :2] = [1e9, -1e9]
    k_scale = np.array([0.5, 2.0] if per_head else [0.25], np.float32)
    v_scale = np.array([1.5, 0.125] if per_head else [3.0], np.float32)
    slots = slot_mapping(rng, 9, 4 * block_size, 1)
    scales = (k_scale.tolist(), v_scale.tolist())

    def convert(x, side, h):
        sc = scales[side][h % len(scales[side])]
        return pyref.fp8_encode(f32(x / sc), fmt)

    exp = expected_cache(cache, layout, key, value, slots, block_size, convert)
    attnkit.reshape_and_cache_flash(key, value, *views(cache, layout), slots, "fp8_" + fmt, k_scale, v_scale)
    assert_cache_equal(cache, exp, f"fp8 {fmt} {layout}")


def test_fp8_alias_and_python_float_scales():
    # vLLM's kv_cache_dtype "fp8" means e4m3; scales may be plain floats here.
    rng = np.random.default_rng(4)
    cache = make_cache(rng, 2, 16, 1, 16, "NHD", np.uint8)
    key = rng.standard_normal((5, 1, 16)).astype(np.float32)
    value = rng.standard_normal((5, 1, 16)).astype(np.float32)
    slots = np.array([3, 17, 0, 31, -1], np.int64)
    exp = expected_cache(cache, "NHD", key, value, slots, 16,
                         lambda x, s, h: pyref.fp8_encode(f32(x / (0.5 if s == 0 else 2.0)), "e4m3"))
    attnkit.reshape_and_cache_flash(key, value, cache[:, 0], cache[:, 1], slots, "fp8", 0.5, 2.0)
    assert_cache_equal(cache, exp, "fp8 alias")


def test_scales_ignored_for_auto_cache():
    rng = np.random.default_rng(5)
    cache = make_cache(rng, 2, 16, 2, 16, "NHD", np.float32)
    key = rng.standard_normal((3, 2, 16)).astype(np.float32)
    slots = np.array([1, 2, 20], np.int64)
    exp = expected_cache(cache, "NHD", key, key, slots, 16, lambda x, s, h: x)
    attnkit.reshape_and_cache_flash(key, key, cache[:, 0], cache[:, 1], slots, "auto", 4.0, 4.0)
    assert_cache_equal(cache, exp, "auto with scales")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_native_write_kv(layout):
    # The native write_kv takes the whole physically shaped cache tensor and its layout.
    rng = np.random.default_rng(6)
    cache = make_cache(rng, 3, 16, 2, 32, layout, np.float16)
    key = rng.standard_normal((7, 2, 32)).astype(np.float16)
    value = rng.standard_normal((7, 2, 32)).astype(np.float16)
    slots = slot_mapping(rng, 7, 48, 1)
    exp = expected_cache(cache, layout, key, value, slots, 16, lambda x, s, h: x)
    attnkit.write_kv(key, value, cache, slots, layout=layout)
    assert_cache_equal(cache, exp, f"write_kv {layout}")


def test_write_then_attend_roundtrip():
    # The vLLM step: write the new tokens' K/V, then attend over the cache (one decode).
    rng = np.random.default_rng(7)
    cache = np.zeros((4, 2, 16, 1, 16), np.float32)
    keys = rng.standard_normal((20, 1, 16)).astype(np.float32)
    vals = rng.standard_normal((20, 1, 16)).astype(np.float32)
    table = np.array([[2, 0]], np.int32)
    slots = np.array([table[0, p // 16] * 16 + p % 16 for p in range(20)], np.int64)
    attnkit.reshape_and_cache_flash(keys, vals, cache[:, 0], cache[:, 1], slots, "auto", None, None)
    q = rng.standard_normal((1, 2, 16)).astype(np.float32)
    out = attnkit.flash_attn_varlen_func(q, cache[:, 0], cache[:, 1], 1, np.array([0, 1], np.int32), 20,
                                         seqused_k=np.array([20], np.int32), block_table=table, causal=True)
    exp, _ = pyref.attention(q.tolist(), [keys.tolist()], [vals.tolist()], [0, 1], [20], 1)
    np.testing.assert_allclose(out, np.array(exp), rtol=1e-5, atol=1e-6)
