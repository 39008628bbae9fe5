"""The native API: registry, selector, KV cache specs and shapes, natural-log merge_states."""

import math

import numpy as np
import pytest

import attnkit
import pyref
from helpers import assert_close


def test_backends_lists_the_registry():
    names = [b["name"] for b in attnkit.backends()]
    assert "reference" in names and "flash_attn" in names
    ref = next(b for b in attnkit.backends() if b["name"] == "reference")
    assert ref["runs_on_cpu"] is True
    assert set(ref["features"]) == {"sinks", "alibi", "softcap", "sliding_window", "non_causal", "lse"}
    assert "f32" in ref["dtypes"]


def test_select_on_cpu_picks_reference_and_says_why_not_the_others():
    s = attnkit.select(32, 8, 128, "bfloat16", device="cpu")
    assert s.backend == "reference"
    assert s.variant
    refused = {r.backend: r.reasons for r in s.refused}
    assert "flash_attn" in refused and refused["flash_attn"], "every refusal carries its reasons"
    assert "reference" not in refused
    assert "backend: reference" in str(s)


@pytest.mark.parametrize("device", ["sm90", (9, 0), "sm_90a", "sm80"])
def test_select_on_gpu_never_picks_the_cpu_reference(device):
    if attnkit.cuda_built and device == "sm80" and not any(a in attnkit.cuda_archs for a in ("sm_80", "compute_80")):
        # a CUDA build without code that runs on sm80 (e.g. ATTNKIT_CUDA_ARCHS=90a) refuses every GPU backend there
        with pytest.raises(attnkit.AttnkitError, match="no GPU code that runs on sm80") as e:
            attnkit.select(32, 8, 128, "bfloat16", device=device)
        assert attnkit.cuda_archs in str(e.value)
        return
    s = attnkit.select(32, 8, 128, "bfloat16", device=device)
    assert s.backend != "reference"
    assert any(r.backend == "reference" for r in s.refused)


def test_select_prefers_flashinfer_for_pages_above_256():
    s = attnkit.select(32, 8, 128, "bfloat16", block_size=512, device="sm90")
    if attnkit.cuda_built:
        assert s.backend == "flashinfer" and "pages of 512 tokens" in s.reason, str(s)
    else:  # (no GPU kernels in this build: the FlashInfer-style backend refuses GPUs)
        assert s.backend == "flash_attn" and "registry" in s.reason, str(s)
    assert attnkit.select(32, 8, 128, "bfloat16", block_size=256, device="sm90").backend == "flash_attn"
    assert "why: " in str(s)


def test_select_preferred_backend_that_cannot_serve_raises_with_reasons():
    with pytest.raises(attnkit.AttnkitError) as e:
        attnkit.select(32, 8, 128, device="cpu", backend="flash_attn")
    assert "flash_attn" in str(e.value)
    with pytest.raises(attnkit.AttnkitError, match="reference"):
        attnkit.select(32, 8, 128, device="cpu", backend="no_such_backend")


def test_select_rejects_malformed_configs_and_devices():
    with pytest.raises(attnkit.AttnkitError):
        attnkit.select(32, 5, 128)  # 32 heads do not split into 5 KV-head groups
    with pytest.raises(attnkit.AttnkitError, match="device"):
        attnkit.select(32, 8, 128, device="tpu")


@pytest.mark.parametrize("layout,order", [("NHD", (0, 1, 2, 3, 4)), ("HND", (0, 1, 3, 2, 4))])
def test_kv_cache_spec(layout, order):
    spec = attnkit.KVCacheSpec(10, 32, 4, 64, "bf16", layout)
    assert tuple(spec.logical_shape) == (10, 2, 32, 4, 64)
    assert tuple(spec.stride_order) == order
    assert tuple(spec.physical_shape) == tuple(spec.logical_shape[d] for d in order)
    assert spec.total_bytes == 10 * 2 * 32 * 4 * 64 * 2
    assert spec.layout == layout and spec.cache_dtype == "bf16"
    assert "KVCacheSpec(num_blocks=10" in repr(spec)


def test_kv_cache_spec_validates():
    with pytest.raises(attnkit.AttnkitError, match="block_size"):
        attnkit.KVCacheSpec(10, 24, 4, 64)


def test_kv_cache_shape_and_stride_order():
    assert attnkit.kv_cache_shape("reference", 7, 16, 2, 64, "float16") == (7, 2, 16, 2, 64)
    assert attnkit.kv_cache_stride_order("reference", "HND") == (0, 1, 3, 2, 4)
    with pytest.raises(attnkit.AttnkitError):
        attnkit.kv_cache_shape("reference", 7, 20, 2, 64, "float16")


def test_native_merge_states_natural_log():
    rng = np.random.default_rng(3)
    n, h, d = 5, 3, 8
    out_a = rng.standard_normal((n, h, d)).astype(np.float32)
    out_b = rng.standard_normal((n, h, d)).astype(np.float32)
    lse_a = rng.standard_normal((h, n)).astype(np.float32)
    lse_b = rng.standard_normal((h, n)).astype(np.float32)
    lse_b[1, 2] = -np.inf
    out, lse = attnkit.merge_states(out_a, lse_a, out_b, lse_b)
    exp_o = [[None] * h for _ in range(n)]
    exp_l = [[None] * n for _ in range(h)]
    for t in range(n):
        for j in range(h):
            exp_o[t][j], exp_l[j][t] = pyref.merge(out_a[t, j].tolist(), float(lse_a[j, t]),
                                                  out_b[t, j].tolist(), float(lse_b[j, t]))
    assert_close(out, exp_o, 1e-6, 1e-5, "merge out")
    assert_close(lse, exp_l, 1e-6, 1e-5, "merge lse")
    assert math.isclose(float(lse[1, 2]), float(lse_a[1, 2]), rel_tol=1e-6)


def test_decode_prefill_helpers():
    # query lens 1, 4, 1, 0, 3: the empty request counts as a decode (0 <= threshold 1).
    qsl = np.array([0, 1, 5, 6, 6, 9], np.int32)
    seq = np.array([10, 4, 7, 3, 9], np.int32)
    perm = attnkit.decode_first_order(qsl, seq)
    assert perm == [0, 2, 3, 1, 4]
    ordered_q = [[1, 4, 1, 0, 3][i] for i in perm]
    qsl2 = np.concatenate([[0], np.cumsum(ordered_q)]).astype(np.int32)
    assert attnkit.split_decodes_and_prefills(qsl2, seq[perm]) == (3, 2, 2, 7)
    with pytest.raises(attnkit.AttnkitError, match="decode"):
        attnkit.split_decodes_and_prefills(qsl, seq)  # a decode after a prefill
    assert attnkit.decode_first_order(qsl, seq, decode_threshold=3) == [0, 2, 3, 4, 1]
