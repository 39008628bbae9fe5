"""The mirrored calls on CUDA PyTorch tensors against a PyTorch float64 reference, over grids of
dtypes, GQA ratios, head sizes, block sizes, soft cap, window, ALiBi, sinks and fp8 caches; the
KV write, merges, streams and framework interop. Skipped without a CUDA PyTorch (and a CUDA
build of attnkit); the GPU script (tools/gpu-check.sh) runs them on the H200.

Also here: CPU PyTorch tensors (bfloat16 included), which run on the reference backend."""

import math

import numpy as np
import pytest

import attnkit

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and attnkit.cuda_built),
                                reason="needs a CUDA GPU, CUDA PyTorch and attnkit built with CUDA")

FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


# ---- the PyTorch reference ---------------------------------------------------------------------

def torch_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, *, causal=True,
                    window=(-1, -1), softcap=0.0, alibi=None, sinks=None, scale=None, k_scale=None,
                    v_scale=None):
    """float64 attention per request over paged caches [num_blocks, block_size, Hkv, D] (fp8
    caches dequantized with k_scale / v_scale per tensor or per KV head). Returns (out, lse)
    with out float64 [T, H, D] and lse float64 [H, T] natural log."""
    dev = q.device
    T, H, D = q.shape
    Hkv = k_cache.shape[2]
    bs = k_cache.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(T, H, D, dtype=torch.float64, device=dev)
    lse = torch.full((H, T), -math.inf, dtype=torch.float64, device=dev)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()

    def deq(cache, s):
        x = cache.to(torch.float64)
        if s is not None:
            x = x * s.to(torch.float64).to(dev).view(1, 1, -1, 1) if s.numel() > 1 else x * float(s.reshape(-1)[0])
        return x

    kd, vd = deq(k_cache, k_scale), deq(v_cache, v_scale)
    left, right = window
    for r in range(len(lens)):
        q0, q1, L = cu[r], cu[r + 1], lens[r]
        ql = q1 - q0
        if ql == 0:
            continue
        pos = torch.arange(L, device=dev)
        blk = block_table[r, (pos // bs)].long()
        K = kd[blk, pos % bs]  # [L, Hkv, D]
        V = vd[blk, pos % bs]
        K = K.repeat_interleave(H // Hkv, dim=1).transpose(0, 1)  # [H, L, D]
        V = V.repeat_interleave(H // Hkv, dim=1).transpose(0, 1)
        Q = q[q0:q1].to(torch.float64).transpose(0, 1)  # [H, ql, D]
        s = scale * Q @ K.transpose(1, 2)  # [H, ql, L]
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        p = (L - ql + torch.arange(ql, device=dev)).view(-1, 1)  # query positions
        j = pos.view(1, -1)
        if alibi is not None:  # [H] or [num_reqs, H]
            slopes = alibi[r] if alibi.dim() == 2 else alibi
            s = s - slopes.to(torch.float64).view(-1, 1, 1) * (p - j).abs().view(1, ql, L)
        vis = torch.ones(ql, L, dtype=torch.bool, device=dev)
        if causal:
            vis &= j <= p
        if left >= 0:
            vis &= j >= p - left
        if right >= 0:
            vis &= j <= p + right
        s = s.masked_fill(~vis.view(1, ql, L), -math.inf)
        if sinks is not None:
            sink = sinks.to(torch.float64).view(-1, 1, 1).expand(H, ql, 1)
            s_all = torch.cat([s, sink], dim=2)
        else:
            s_all = s
        m = s_all.amax(dim=2, keepdim=True)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s_all - m_safe)
        denom = e.sum(dim=2, keepdim=True)
        row_lse = (m_safe + torch.log(denom)).squeeze(2)  # -inf when nothing (and no sink) is visible
        w = e[:, :, :L] / torch.where(denom > 0, denom, torch.ones_like(denom))
        out[q0:q1] = (w @ V).transpose(0, 1)
        lse[:, q0:q1] = row_lse
    return out, lse


def assert_close_t(actual, expected, atol, rtol, what):
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    a_inf, e_inf = torch.isneginf(a), torch.isneginf(e)
    if not torch.equal(a_inf, e_inf):
        idx = tuple(int(i) for i in torch.nonzero(a_inf != e_inf)[0])
        raise AssertionError(f"{what}: -inf mismatch at {idx}: got {a[idx].item()}, expected {e[idx].item()}")
    a_f = torch.where(e_inf, torch.zeros_like(a), a)
    e_f = torch.where(e_inf, torch.zeros_like(e), e)
    err = (a_f - e_f).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    excess = err - (atol + rtol * e_f.abs())
    flat = int(torch.argmax(excess))
    idx = tuple(int(i) for i in np.unravel_index(flat, tuple(excess.shape)))
    if excess[idx] > 0:
        raise AssertionError(f"{what}: worst element at {idx}: got {a[idx].item()!r}, expected "
                             f"{e[idx].item()!r} (|diff| {err[idx].item():.3g} > atol {atol} + rtol {rtol} * |expected|)")


def tol(dtype):
    return {torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2), torch.float32: (1e-4, 1e-4)}[dtype]


# Outputs of the hopper prefill kernel on fp8 caches: both GEMMs on the fp8 wgmma, P rounded to
# e4m3 (each within 2^-4 relative: an output within 2^-4 of the P-weighted mean |v|; these
# batches' V is N(0, 1)).
FP8_WGMMA_TOL = (8e-2, 2e-2)


class TorchBatch:
    """A paged batch of torch tensors: kv_cache [num_blocks, 2, block_size, Hkv, D] (NHD) or
    [num_blocks, 2, Hkv, block_size, D] (HND); the paged views are kv_cache[:, 0] / [:, 1]."""

    def __init__(self, q_lens, kv_lens, H, Hkv, D, bs, dtype, device, fp8=None, layout="NHD", seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        blocks = [-(-n // bs) for n in kv_lens]
        nb = sum(blocks) + 5
        ids = torch.randperm(nb, generator=g).to(torch.int32)
        width = max(max(blocks, default=0), 1)
        self.block_table = torch.zeros(len(q_lens), width, dtype=torch.int32)
        at = 0
        for r, n in enumerate(blocks):
            self.block_table[r, :n] = ids[at:at + n]
            at += n
        self.cu_seqlens_q = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32)
        self.seqused_k = torch.tensor(kv_lens, dtype=torch.int32)
        self.max_seqlen_q, self.max_seqlen_k = max(q_lens), max(kv_lens)
        T = int(sum(q_lens))
        self.q = torch.randn(T, H, D, generator=g).to(dtype)
        if fp8:  # queries on the e4m3 grid: the hopper prefill kernel quantises Q to e4m3 for S = Q K^T
            self.q = self.q.to(torch.float8_e4m3fn).to(dtype)
        phys = (nb, 2, bs, Hkv, D) if layout == "NHD" else (nb, 2, Hkv, bs, D)
        cache = torch.randn(phys, generator=g)
        if fp8:
            cache = cache.clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(getattr(torch, FP8[fp8]))
        else:
            cache = cache.to(dtype)
        self.kv_cache = cache
        self.layout = layout
        self.fp8 = fp8
        self.to(device)

    def to(self, device):
        for name in ("block_table", "cu_seqlens_q", "seqused_k", "q", "kv_cache"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def views(self):
        k, v = self.kv_cache[:, 0], self.kv_cache[:, 1]
        return (k, v) if self.layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))

    def run(self, **kw):
        k, v = self.views()
        return attnkit.flash_attn_varlen_func(self.q, k, v, self.max_seqlen_q, self.cu_seqlens_q, self.max_seqlen_k,
                                              seqused_k=self.seqused_k, block_table=self.block_table,
                                              return_softmax_lse=True, **kw)

    def reference(self, **kw):
        k, v = self.views()
        return torch_attention(self.q, k, v, self.cu_seqlens_q, self.seqused_k, self.block_table, **kw)


Q_LENS = [1, 1, 1, 1, 1, 1, 37, 128, 5, 64]
KV_LENS = [1, 17, 100, 257, 600, 33, 37, 300, 500, 64]


def check(b, got, exp, what):
    out, lse = got
    atol, rtol = FP8_WGMMA_TOL if b.fp8 and b.q.is_cuda else tol(b.q.dtype)
    assert out.dtype == b.q.dtype and out.device == b.q.device
    assert_close_t(out, exp[0], atol, rtol, f"{what} out")
    assert_close_t(lse, exp[1].to(torch.float32), 2e-3, 2e-3, f"{what} lse")


# ---- flash_attn_varlen_func on CUDA ---------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (16, 1)], ids=["mha", "gqa4", "mqa16"])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_cuda_varlen_grid(dtype, heads, head_size, block_size):
    b = TorchBatch(Q_LENS, KV_LENS, heads[0], heads[1], head_size, block_size, dtype, "cuda",
                   seed=head_size + block_size)
    check(b, b.run(causal=True), b.reference(causal=True), f"{dtype} {heads} d={head_size} bs={block_size}")


@needs_cuda
@pytest.mark.parametrize("head_size", [8, 32, 40, 72, 80, 96, 112, 160, 200, 224, 256, 320, 512])
def test_cuda_varlen_head_sizes(head_size):
    # Head sizes padded up to the next compiled dim (and dims 80, 96, 256): paged and contiguous
    # K/V, GQA, causal; an fp8 cache where the size is a multiple of 16.
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, head_size, 16, torch.bfloat16, "cuda", seed=head_size)
    check(b, b.run(causal=True), b.reference(causal=True), f"d={head_size} paged")
    kc, vc, cu_k = contiguous_rows(b)
    got = attnkit.flash_attn_varlen_func(b.q, kc, vc, b.max_seqlen_q, b.cu_seqlens_q, b.max_seqlen_k,
                                         cu_seqlens_k=cu_k, causal=False, return_softmax_lse=True)
    check(b, got, b.reference(causal=False), f"d={head_size} contiguous")
    if head_size % 16 == 0:
        f = TorchBatch(Q_LENS, KV_LENS, 8, 2, head_size, 16, torch.float16, "cuda", fp8="e4m3", seed=head_size + 1)
        check(f, f.run(causal=True), f.reference(causal=True), f"d={head_size} fp8")


@needs_cuda
@pytest.mark.parametrize("head_size,fp8", [(84, None), (520, None), (40, "e4m3")])
def test_cuda_varlen_unserved_head_size_is_an_error(head_size, fp8):
    b = TorchBatch([3, 1], [5, 9], 4, 2, head_size, 16, torch.bfloat16, "cuda", fp8=fp8, seed=9)
    with pytest.raises(attnkit.AttnkitError, match=f"head_size.*{head_size}.*multiple of"):
        b.run(causal=True)


CUDA_FEATURES = {
    "non_causal": (dict(causal=False), dict(causal=False)),
    "window": (dict(causal=True, window_size=(63, 0)), dict(causal=True, window=(63, 0))),
    "softcap": (dict(causal=True, softcap=5.0, softmax_scale=0.3), dict(causal=True, softcap=5.0, scale=0.3)),
    "alibi": ("alibi", None),
    "alibi_per_seq": ("alibi_per_seq", None),
    "sinks": ("sinks", None),
}


@needs_cuda
@pytest.mark.parametrize("name", sorted(CUDA_FEATURES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_cuda_varlen_features(name, dtype):
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, 128, 16, dtype, "cuda", seed=len(name))
    kw, ref_kw = CUDA_FEATURES[name]
    if kw == "alibi":
        slopes = torch.tensor([2 ** (-(i + 1)) for i in range(8)], dtype=torch.float32, device="cuda")
        kw, ref_kw = dict(causal=True, alibi_slopes=slopes), dict(causal=True, alibi=slopes)
    elif kw == "alibi_per_seq":  # [num_seqs, num_heads]: one row of slopes per request
        g = torch.Generator().manual_seed(5)
        slopes = (torch.rand(len(Q_LENS), 8, generator=g) * 0.3).to("cuda")
        kw, ref_kw = dict(causal=True, alibi_slopes=slopes), dict(causal=True, alibi=slopes)
    elif kw == "sinks":
        sinks = torch.linspace(-2, 2, 8, device="cuda")
        kw, ref_kw = dict(causal=True, s_aux=sinks.to(torch.bfloat16)), dict(causal=True, sinks=sinks.to(torch.bfloat16))
    check(b, b.run(**kw), b.reference(**ref_kw), name)


@needs_cuda
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_cuda_varlen_fp8_cache(fmt, per_head):
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, 128, 16, torch.bfloat16, "cuda", fp8=fmt, seed=3)
    ks = torch.tensor([0.5, 2.0] if per_head else [0.75], device="cuda")
    vs = torch.tensor([1.5, 0.25] if per_head else [1.25], device="cuda")
    shape = (len(Q_LENS), 2)
    got = b.run(causal=True, k_descale=ks.expand(shape) if per_head else ks.view(1, 1).expand(shape),
                v_descale=vs.expand(shape) if per_head else vs.view(1, 1).expand(shape))
    check(b, got, b.reference(causal=True, k_scale=ks, v_scale=vs), f"fp8 {fmt}")


@needs_cuda
def test_cuda_varlen_hnd_views_and_uint8_cache():
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, 64, 16, torch.float16, "cuda", layout="HND", seed=4)
    check(b, b.run(causal=True), b.reference(causal=True), "HND views")
    f = TorchBatch(Q_LENS, KV_LENS, 8, 2, 64, 16, torch.float16, "cuda", fp8="e4m3", seed=5)
    k, v = f.views()
    got = attnkit.flash_attn_varlen_func(f.q, k.view(torch.uint8), v.view(torch.uint8), f.max_seqlen_q,
                                         f.cu_seqlens_q, f.max_seqlen_k, seqused_k=f.seqused_k,
                                         block_table=f.block_table, causal=True, return_softmax_lse=True,
                                         kv_cache_dtype="fp8")
    check(f, got, f.reference(causal=True), "uint8 fp8 cache")


@needs_cuda
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_query_longer_than_keys(causal):
    b = TorchBatch([20, 3, 1], [5, 40, 9], 8, 2, 64, 16, torch.bfloat16, "cuda", seed=6)
    got = b.run(causal=causal)
    check(b, got, b.reference(causal=causal), "q longer than k")
    if causal:
        assert torch.all(got[0][:15] == 0)


@needs_cuda
@pytest.mark.parametrize("num_splits", [2, 4])
def test_cuda_split_kv(num_splits):
    b = TorchBatch([1] * 4, [1000, 1500, 700, 2000], 8, 1, 128, 16, torch.bfloat16, "cuda", seed=7)
    check(b, b.run(causal=True, num_splits=num_splits), b.reference(causal=True), f"splits={num_splits}")


@needs_cuda
def test_cuda_stream_defaults_to_current_and_explicit_stream():
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, 128, 16, torch.bfloat16, "cuda", seed=8)
    exp = b.reference(causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = b.run(causal=True)
    s.synchronize()
    check(b, got, exp, "side stream")
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())
    got = b.run(causal=True, stream=s2.cuda_stream)
    s2.synchronize()
    check(b, got, exp, "explicit stream")


def contiguous_rows(b):
    """The batch's keys and values gathered from its paged cache into contiguous rows
    [total_k, Hkv, D], and cu_seqlens_k."""
    k, v = b.views()
    lens = b.seqused_k.tolist()
    rows_k, rows_v = [], []
    for r, L in enumerate(lens):
        pos = torch.arange(L, device=k.device)
        blk = b.block_table[r, pos // k.shape[1]].long()
        rows_k.append(k[blk, pos % k.shape[1]])
        rows_v.append(v[blk, pos % k.shape[1]])
    cu_k = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device=k.device)
    return torch.cat(rows_k), torch.cat(rows_v), cu_k


@needs_cuda
@pytest.mark.parametrize("name", ["causal", "non_causal", "window", "sinks", "seqused_k", "strided"])
def test_cuda_contiguous_kv(name):
    b = TorchBatch(Q_LENS, KV_LENS, 8, 2, 128, 16, torch.bfloat16, "cuda", seed=40 + len(name))
    kc, vc, cu_k = contiguous_rows(b)
    causal = name != "non_causal"
    kw, ref_kw = dict(causal=causal), dict(causal=causal)
    if name == "window":
        kw["window_size"] = ref_kw["window"] = (40, 0)
    if name == "sinks":
        sinks = torch.linspace(-1, 2, 8, device="cuda")
        kw["s_aux"], ref_kw["sinks"] = sinks, sinks
    if name == "seqused_k":
        kw["seqused_k"] = b.seqused_k
    if name == "strided":  # k / v as views of one [total_k, 2, Hkv, D] tensor
        kv = torch.stack([kc, vc], dim=1)
        kc, vc = kv[:, 0], kv[:, 1]
    out, lse = attnkit.flash_attn_varlen_func(b.q, kc, vc, b.max_seqlen_q, b.cu_seqlens_q, b.max_seqlen_k,
                                              cu_seqlens_k=cu_k, return_softmax_lse=True, **kw)
    check(b, (out, lse), b.reference(**ref_kw), f"contiguous {name}")


@needs_cuda
@pytest.mark.parametrize("fault", ["block id past the cache", "negative block id", "seqused_k past the table",
                                   "max_seqlen_q too small"])
def test_cuda_device_guards(fault):
    # Bad metadata on the device (what the host cannot check without a copy): no memory outside
    # the buffers is read (memcheck runs this file's siblings; here: no CUDA error), the
    # affected request's rows are NaN, the others right, and the device error record says what
    # and where; reading it clears it.
    H, Hkv, D, bs = 8, 2, 128, 16
    b = TorchBatch([1, 1, 5, 1], [300, 40, 200, 90], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=91)
    attnkit.device_errors()  # (start from a clear record)
    exp = b.reference(causal=True)
    bad, max_q = 2, b.max_seqlen_q
    if fault == "block id past the cache":
        b.block_table[bad, 3] = 50_000_000
    elif fault == "negative block id":
        b.block_table[bad, 0] = -7
    elif fault == "seqused_k past the table":
        b.seqused_k[bad] = 4000
    else:
        max_q = 1  # request 2 has 5 query tokens
    k, v = b.views()
    out, lse = attnkit.flash_attn_varlen_func(b.q, k, v, max_q, b.cu_seqlens_q, b.max_seqlen_k, seqused_k=b.seqused_k,
                                              block_table=b.block_table, return_softmax_lse=True, causal=True)
    torch.cuda.synchronize()
    e = attnkit.device_errors()
    assert e["faults"] >= 1 and e["request"] == bad, e
    want = {"block id past the cache": "block id", "negative block id": "block id",
            "seqused_k past the table": "key count", "max_seqlen_q too small": "max_seqlen_q"}[fault]
    assert want in e["first"], e
    assert attnkit.device_errors()["faults"] == 0  # (read clears it)
    rows = b.cu_seqlens_q.tolist()
    bad_rows = out[rows[bad]:rows[bad + 1]].float()
    if fault == "max_seqlen_q too small":
        assert torch.isnan(bad_rows[-1]).all()  # (the rows the grid covers; the others are not written)
    else:
        assert torch.isnan(bad_rows).all()
    good = [r for r in range(4) if r != bad]
    for r in good:
        sl = slice(rows[r], rows[r + 1])
        assert_close_t(out[sl], exp[0][sl], *tol(torch.bfloat16), f"request {r} next to a bad one")


@needs_cuda
def test_cuda_device_error_checks_after_every_call():
    # Debug mode: the call itself raises, naming the violation.
    b = TorchBatch([1, 1], [300, 40], 8, 2, 128, 16, torch.bfloat16, "cuda", seed=92)
    b.block_table[1, 0] = 1 << 30
    attnkit.device_errors()
    attnkit.set_check_device_errors(True)
    try:
        with pytest.raises(attnkit.AttnkitError, match="block id"):
            b.run(causal=True)
    finally:
        attnkit.set_check_device_errors(False)
    attnkit.device_errors()
    b.block_table[1, 0] = 0
    b.run(causal=True)
    assert attnkit.check_device_errors()["faults"] == 0


@needs_cuda
def test_cuda_write_kv_dropped_slots_join_the_record():
    H, Hkv, D, bs = 8, 2, 64, 16
    cache = torch.zeros(4, 2, bs, Hkv, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3, Hkv, D, device="cuda").to(torch.bfloat16)
    attnkit.device_errors()
    attnkit.reshape_and_cache_flash(k, k, cache[:, 0], cache[:, 1], torch.tensor([0, 10_000, 5], device="cuda"),
                                    "auto")
    e = attnkit.device_errors()
    assert e["dropped_kv_tokens"] == 1 and e["faults"] == 0, e
    assert "dropped 1 token" in e["message"]


@needs_cuda
def test_cuda_mixed_devices_are_refused():
    b = TorchBatch([1], [16], 2, 2, 64, 16, torch.float16, "cuda")
    k, v = b.views()
    with pytest.raises(attnkit.AttnkitError, match="device"):
        attnkit.flash_attn_varlen_func(b.q, k, v, 1, b.cu_seqlens_q.cpu(), 16, seqused_k=b.seqused_k,
                                       block_table=b.block_table)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_cuda_attention_layer_engine_path(dtype):
    # selector -> builder -> impl on the GPU, with the cache written by the native write_kv.
    H, Hkv, D, bs = 16, 4, 128, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, str(dtype).split(".")[-1], block_size=bs, device="cuda", lse=True)
    assert layer.backend != "reference"
    b = TorchBatch(Q_LENS, KV_LENS, H, Hkv, D, bs, dtype, "cuda", seed=21)
    cache = b.kv_cache.contiguous()
    assert tuple(cache.shape) == layer.kv_cache_physical_shape(cache.shape[0])
    slots = []
    for r, (ql, kl) in enumerate(zip(Q_LENS, KV_LENS)):
        slots += [int(b.block_table[r, p // bs]) * bs + p % bs for p in range(kl - ql, kl)]
    md = layer.build_metadata(b.cu_seqlens_q, b.seqused_k, b.block_table, torch.tensor(slots, device="cuda"))
    out, lse = layer.forward(b.q, None, None, cache, md, return_lse=True)
    check(b, (out, lse), b.reference(causal=True), "layer")


# ---- reshape_and_cache_flash on CUDA --------------------------------------------------------------

def torch_write(key, value, k_cache, v_cache, slots, fmt, k_scale, v_scale):
    bs = k_cache.shape[1]
    n = slots.shape[0]
    for t in range(n):
        s = int(slots[t])
        if s < 0:
            continue
        for cache, x, sc in ((k_cache, key[t], k_scale), (v_cache, value[t], v_scale)):
            if fmt is None:
                cache[s // bs, s % bs] = x
            else:
                y = x.float() / sc.view(-1, 1).float()
                cache[s // bs, s % bs] = y.clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(getattr(torch, FP8[fmt]))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("fmt", [None, "e4m3", "e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_cuda_reshape_and_cache(dtype, fmt, layout, per_head):
    if fmt is None and per_head:
        pytest.skip("scales only apply to fp8 caches")
    g = torch.Generator(device="cpu").manual_seed(9)
    H, D, bs, nb = 4, 128, 16, 12
    key = (torch.randn(40, H, D, generator=g) * 3).to(dtype).cuda()
    value = (torch.randn(40, H, D, generator=g) * 3).to(dtype).cuda()
    slots = torch.randperm(nb * bs, generator=g)[:36].to(torch.int64)
    slots[::7] = -1
    slots = slots.cuda()
    cdt = dtype if fmt is None else getattr(torch, FP8[fmt])
    phys = (nb, 2, bs, H, D) if layout == "NHD" else (nb, 2, H, bs, D)
    cache = torch.zeros(phys, dtype=cdt, device="cuda")
    ks = torch.tensor([0.5, 1.0, 2.0, 4.0] if per_head else [0.5], device="cuda")
    vs = torch.tensor([3.0, 0.25, 1.0, 2.0] if per_head else [2.0], device="cuda")
    exp = cache.clone()

    def views(c):
        k, v = c[:, 0], c[:, 1]
        return (k, v) if layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))

    torch_write(key, value, *views(exp), slots, fmt, ks, vs)
    attnkit.reshape_and_cache_flash(key, value, *views(cache), slots, "auto" if fmt is None else "fp8_" + fmt, ks, vs)
    torch.cuda.synchronize()
    got_b, exp_b = cache.view(torch.uint8), exp.view(torch.uint8)
    if not torch.equal(got_b, exp_b):
        idx = tuple(int(i) for i in torch.nonzero(got_b != exp_b)[0])
        raise AssertionError(f"cache differs at {idx}: got {got_b[idx].item()}, expected {exp_b[idx].item()}")


# ---- merges on CUDA ---------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["f16", "bf16", "f32"])
def test_cuda_merge_state_base2(dtype):
    g = torch.Generator(device="cpu").manual_seed(10)
    N, H, D = 33, 8, 128
    v_a, v_b = (torch.randn(N, H, D, generator=g).to(dtype).cuda() for _ in range(2))
    s_a, s_b = ((torch.randn(N, H, generator=g) * 4).cuda() for _ in range(2))
    s_a[0, 0] = -math.inf
    s_a[1, 1] = s_b[1, 1] = -math.inf
    v, s = attnkit.merge_state(v_a, s_a, v_b, s_b)
    torch.cuda.synchronize()
    m = torch.maximum(s_a, s_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp2(s_a.double() - m_safe), torch.exp2(s_b.double() - m_safe)
    tot = wa + wb
    exp_v = (v_a.double() * (wa / torch.where(tot > 0, tot, 1)).unsqueeze(-1) +
             v_b.double() * (wb / torch.where(tot > 0, tot, 1)).unsqueeze(-1))
    exp_s = m_safe + torch.log2(tot)
    atol, rtol = tol(dtype)
    assert_close_t(v, exp_v, atol, rtol, "merge v")
    assert_close_t(s, exp_s, 1e-4, 1e-5, "merge s")


def page_table_of(b):
    """FlashInfer's (indptr, indices, last_page_len) of a TorchBatch's block table."""
    bs = b.kv_cache.shape[2] if b.layout == "NHD" else b.kv_cache.shape[3]
    indptr, indices, last = [0], [], []
    for r, n in enumerate(b.seqused_k.tolist()):
        pages = -(-n // bs)
        indices += b.block_table[r, :pages].tolist()
        indptr.append(len(indices))
        last.append(n - (pages - 1) * bs if pages else 0)
    return [torch.tensor(x, dtype=torch.int32) for x in (indptr, indices, last)]


def flashinfer_decode(b, w, H, Hkv, D, **plan_kw):
    bs = b.kv_cache.shape[2] if b.layout == "NHD" else b.kv_cache.shape[3]
    w.plan(*page_table_of(b), H, Hkv, D, bs, q_data_type=b.q.dtype,
           kv_data_type=b.kv_cache.dtype, **plan_kw)


@needs_cuda
@pytest.mark.parametrize("page", [16, 128, 1024])
@pytest.mark.parametrize("heads", [(8, 2), (8, 8), (16, 2)], ids=["gqa4", "mha", "gqa8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cuda_flashinfer_decode_wrapper(page, heads, layout):
    H, Hkv = heads
    kv = [1, 17, 300, 2000, page, page + 1, 33]
    b = TorchBatch([1] * len(kv), kv, H, Hkv, 128, page, torch.bfloat16, "cuda", layout=layout, seed=page + H)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    for tc in (True, False):
        w = attnkit.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=layout, use_tensor_cores=tc)
        flashinfer_decode(b, w, H, Hkv, 128, logits_soft_cap=5.0, sm_scale=0.1)
        out, lse = w.run(b.q, b.kv_cache, return_lse=True)
        exp = b.reference(causal=True, softcap=5.0, scale=0.1)
        atol, rtol = tol(b.q.dtype)
        assert_close_t(out, exp[0], atol, rtol, f"decode page {page} tc {tc}")
        assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, f"decode lse page {page} tc {tc}")


@needs_cuda
@pytest.mark.parametrize("q_len", [2, 4])
def test_cuda_flashinfer_decode_q_len_per_req(q_len):
    kv = [q_len, 40, 700, 2100, 129]
    b = TorchBatch([q_len] * len(kv), kv, 8, 2, 128, 16, torch.bfloat16, "cuda", seed=50 + q_len)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"),
                                                   use_tensor_cores=True)
    flashinfer_decode(b, w, 8, 2, 128, q_len_per_req=q_len)
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    exp = b.reference(causal=True)
    assert_close_t(out, exp[0], *tol(torch.bfloat16), f"q_len_per_req {q_len}")
    assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, f"q_len_per_req {q_len} lse")


@needs_cuda
def test_cuda_flashinfer_decode_fp8_sinks_window_and_small_workspace():
    b = TorchBatch([1] * 5, [700, 40, 1300, 5, 260], 8, 2, 128, 32, torch.float16, "cuda", fp8="e4m3", seed=77)
    sinks = torch.linspace(-1, 2, 8, device="cuda")
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"),
                                                   use_tensor_cores=True)
    flashinfer_decode(b, w, 8, 2, 128, window_left=100)
    out = w.run(b.q, b.kv_cache, k_scale=0.5, v_scale=2.0, sinks=sinks)
    exp = b.reference(causal=True, window=(100, -1), sinks=sinks, k_scale=torch.tensor([0.5], device="cuda"),
                      v_scale=torch.tensor([2.0], device="cuda"))
    assert_close_t(out, exp[0], *tol(torch.float16), "fp8 sinks window")
    # A split plan with a workspace that cannot hold its partials: the error says how much.
    w_small = attnkit.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8, device="cuda"),
                                                         use_tensor_cores=True)
    long = TorchBatch([1], [30000], 8, 2, 128, 32, torch.float16, "cuda", seed=78)
    flashinfer_decode(long, w_small, 8, 2, 128)
    assert w_small.plan_info["split_kv"]
    with pytest.raises(attnkit.AttnkitError, match="workspace_bytes.*needs"):
        w_small.run(long.q, long.kv_cache)


def captured(run):
    """A CUDA graph of run(stream) captured on a side stream (after an eager call made the
    run's buffers: the first call must not be captured)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            run(s)
    torch.cuda.synchronize()
    return graph


def replayed(graph, out):
    """out zeroed, then the graph replayed to completion."""
    out.zero_()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()


def on_cache_of(bb, a, bs, seed):
    """Puts decode batch bb on a's cache: its pages become other blocks of it (shuffled)."""
    bb.kv_cache = a.kv_cache
    perm = torch.randperm(a.kv_cache.shape[0], generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    at = 0
    table = torch.zeros_like(bb.block_table, device="cpu")
    for r, n in enumerate(bb.seqused_k.tolist()):
        pages = -(-n // bs)
        table[r, :pages] = perm[at:at + pages]
        at += pages
    bb.block_table = table.cuda()


def last_token_slots(b, bs):
    """slot_mapping of a decode batch: each request's last key."""
    return torch.tensor([int(b.block_table[r, (n - 1) // bs]) * bs + (n - 1) % bs
                         for r, n in enumerate(b.seqused_k.tolist())], dtype=torch.int64, device="cuda")


@needs_cuda
def test_cuda_flashinfer_decode_graph_replays_after_replan():
    # Capture one run, re-plan other lengths and pages within the capacity, replay: the replay
    # reads the new plan (its device copy is refreshed in place by plan()).
    H, Hkv, D, bs = 8, 2, 128, 16
    a = TorchBatch([1] * 6, [100, 2000, 5, 900, 64, 3000], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=90)
    bb = TorchBatch([1] * 4, [1500, 17, 2500, 300], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=91)
    on_cache_of(bb, a, bs, seed=3)
    nb = a.kv_cache.shape[0]
    cap_reqs, cap_pages = 8, nb
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.empty(cap_reqs + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(cap_pages, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty(cap_reqs, dtype=torch.int32, device="cuda"))
    q = torch.zeros(cap_reqs, H, D, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros_like(q)
    flashinfer_decode(a, w, H, Hkv, D)
    q[:6] = a.q
    w.run(q[:6], a.kv_cache, out=out[:6])  # eager: makes the plan's device copy
    graph = captured(lambda s: w.run(q[:6], a.kv_cache, out=out[:6]))
    replayed(graph, out)
    assert_close_t(out[:6], a.reference(causal=True)[0], *tol(torch.bfloat16), "graph replay, first plan")
    flashinfer_decode(bb, w, H, Hkv, D)  # fewer requests, other lengths and pages
    q[:4] = bb.q
    replayed(graph, out)
    assert_close_t(out[:4], bb.reference(causal=True)[0], *tol(torch.bfloat16), "graph replay after re-plan")


def nvfp4_cache(nb, bs, Hkv, D, seed):
    """FlashInfer's NVFP4 cache on CUDA: packed codes uint8 [nb, 2, bs, Hkv, D / 2], e4m3 block
    scales uint8 [nb, 2, bs, Hkv, D / 16] (0.125 .. 1.875), and the values they hold (float64)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (nb, 2, bs, Hkv, D // 2), generator=g, dtype=torch.uint8)
    sf = torch.randint(0x20, 0x40, (nb, 2, bs, Hkv, D // 16), generator=g, dtype=torch.uint8)
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    e2m1 = torch.cat([e2m1, -e2m1])
    vals = torch.stack([e2m1[(codes & 0xF).long()], e2m1[(codes >> 4).long()]], dim=-1).reshape(nb, 2, bs, Hkv, D)
    scale = 2.0 ** (((sf >> 3) & 0xF).double() - 7) * (1 + (sf & 7).double() / 8)
    return codes.cuda(), sf.cuda(), (vals * scale.repeat_interleave(16, dim=-1)).cuda()


@needs_cuda
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("heads", [(8, 2), (8, 8)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("D", [64, 128])
def test_cuda_flashinfer_decode_nvfp4(page, heads, D):
    # NVFP4 caches in FlashInfer's form (codes + kv_cache_sf, global scales as k_scale / v_scale)
    # on the planned decode kernels, against the float64 reference of the values they hold.
    H, Hkv = heads
    kv = [1, 17, 300, 1200, page, page + 1]
    b = TorchBatch([1] * len(kv), kv, H, Hkv, D, page, torch.bfloat16, "cuda", seed=70 + page + D)
    codes, sf, vals = nvfp4_cache(b.kv_cache.shape[0], page, Hkv, D, seed=page + D)
    b.kv_cache = vals
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(*page_table_of(b), H, Hkv, D, page, q_data_type=torch.bfloat16, kv_data_type=torch.uint8)
    for as_tuple in (False, True):
        cache = (codes[:, 0], codes[:, 1]) if as_tuple else codes
        scales = (sf[:, 0], sf[:, 1]) if as_tuple else sf.view(torch.float8_e4m3fn)
        out, lse = w.run(b.q, cache, kv_cache_sf=scales, k_scale=0.5, v_scale=2.0, return_lse=True)
        exp = b.reference(causal=True, scale=0.5 / math.sqrt(D))
        atol, rtol = tol(torch.bfloat16)
        assert_close_t(out, 2.0 * exp[0], 2 * atol, rtol, f"nvfp4 decode page {page} D {D}")
        assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, f"nvfp4 lse page {page}")


@needs_cuda
@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_cuda_layer_caller_workspace(backend):
    # The caller-owned workspace: a buffer of workspace_bytes serves the forwards; one too small
    # for the batch's partials is an error before any launch.
    H, Hkv, D, bs = 16, 4, 128, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, "bfloat16", block_size=bs, device="cuda", backend=backend, lse=True)
    b = TorchBatch([1] * 4, [5000, 300, 17, 4000], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=77)
    ws = torch.empty(layer.workspace_bytes(64), dtype=torch.uint8, device="cuda")
    layer.set_workspace(ws)
    md = layer.build_metadata(b.cu_seqlens_q, b.seqused_k, b.block_table, last_token_slots(b, bs))
    out, lse = layer.forward(b.q, None, None, b.kv_cache.contiguous(), md, return_lse=True)
    check(b, (out, lse), b.reference(causal=True), f"{backend} with the caller's workspace")
    assert 0 <= layer.workspace_bytes_for(md) <= ws.numel()
    layer.set_workspace(torch.empty(16, dtype=torch.uint8, device="cuda"))
    if layer.workspace_bytes_for(md) > 16:
        with pytest.raises(attnkit.AttnkitError, match="workspace"):
            layer.forward(b.q, None, None, b.kv_cache.contiguous(), md)
    # None: the Python layer holds one through PyTorch, sized by the batch's need.
    layer.set_workspace(None)
    out, lse = layer.forward(b.q, None, None, b.kv_cache.contiguous(), md, return_lse=True)
    check(b, (out, lse), b.reference(causal=True), f"{backend} with the layer's own workspace")


@needs_cuda
@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_cuda_layer_caller_device_buffer(backend):
    # The builder's device buffer (the FlashInfer-style plans' device copies) from the caller:
    # flash_attn needs none; flashinfer's must be at least device_buffer_bytes, and a forward
    # over it equals the reference; a buffer too small is an error naming the size.
    H, Hkv, D, bs = 16, 4, 128, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, "bfloat16", block_size=bs, device="cuda", backend=backend)
    need = layer.device_buffer_bytes()
    if backend == "flash_attn":
        assert need == 0
        return
    assert need > 0
    with pytest.raises(attnkit.AttnkitError, match=str(need)):
        layer.set_device_buffer(torch.empty(need - 16, dtype=torch.uint8, device="cuda"))
    buf = torch.full((need,), 0xAB, dtype=torch.uint8, device="cuda")  # (whatever it held before)
    layer.set_device_buffer(buf)
    b = TorchBatch([1] * 4, [700, 33, 400, 2000], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=78)
    md = layer.build_metadata(b.cu_seqlens_q, b.seqused_k, b.block_table, last_token_slots(b, bs))
    out = layer.forward(b.q, None, None, b.kv_cache.contiguous(), md)
    atol, rtol = tol(b.q.dtype)
    assert_close_t(out, b.reference(causal=True)[0], atol, rtol, "flashinfer over the caller's device buffer")


@needs_cuda
def test_cuda_flashinfer_layer_graph_replays_after_rebuild():
    # The engine path (builder -> impl) of the FlashInfer-style backend, which declares CUDA
    # graphs ALWAYS for GQA: a forward captured once replays the builder's later decode batches
    # (other lengths, pages and fewer requests): every build stages the plan, the captured
    # forward copies it.
    H, Hkv, D, bs = 8, 2, 128, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, "bfloat16", block_size=bs, device="cuda", backend="flashinfer")
    a = TorchBatch([1] * 6, [100, 2000, 5, 900, 64, 3000], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=92)
    bb = TorchBatch([1] * 4, [1500, 17, 2500, 300], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=93)
    on_cache_of(bb, a, bs, seed=5)
    cache = a.kv_cache.contiguous()

    def metadata(b):
        return layer.build_metadata(b.cu_seqlens_q, b.seqused_k, b.block_table, last_token_slots(b, bs))

    q = a.q.clone()
    out = torch.zeros_like(q)
    md = metadata(a)
    layer.forward(q, None, None, cache, md, out=out)  # eager: the device plan and workspace
    graph = captured(lambda s: layer.forward(q, None, None, cache, md, out=out, stream=s))
    replayed(graph, out)
    assert_close_t(out, a.reference(causal=True)[0], *tol(torch.bfloat16), "graph replay, first batch")
    md = metadata(bb)  # fewer requests, other lengths and pages: staged by the builder
    q[:4] = bb.q
    replayed(graph, out)
    assert_close_t(out[:4], bb.reference(causal=True)[0], *tol(torch.bfloat16), "graph replay after a rebuild")


PREFILL_Q = [37, 1, 300, 5, 128, 64]
PREFILL_KV = [37, 900, 1500, 5, 2000, 64]  # no prefix, a decode among prefills, chunked prefills


@needs_cuda
@pytest.mark.parametrize("page", [16, 128, 1024])
@pytest.mark.parametrize("heads", [(8, 2), (8, 8)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_cuda_flashinfer_prefill_paged(page, heads, layout, causal):
    # The paged prefill wrapper on the planned kernels (16 / 64 / 128-row tiles from the plan).
    H, Hkv = heads
    b = TorchBatch(PREFILL_Q, PREFILL_KV, H, Hkv, 128, page, torch.bfloat16, "cuda", layout=layout,
                   seed=page + H + causal)
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"),
                                                    kv_layout=layout)
    w.plan(b.cu_seqlens_q.cpu(), *page_table_of(b), H, Hkv, 128, page, causal=causal, logits_soft_cap=5.0,
           q_data_type=torch.bfloat16)
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    exp = b.reference(causal=causal, softcap=5.0)
    assert_close_t(out, exp[0], *tol(torch.bfloat16), f"paged prefill page {page}")
    assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, f"paged prefill lse page {page}")


@needs_cuda
@pytest.mark.parametrize("heads", [(8, 2), (16, 2), (8, 8)], ids=["gqa4", "gqa8", "mha"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_cuda_flashinfer_prefill_ragged(heads, causal, dtype):
    # Ragged K/V (contiguous rows, kv_indptr) read through the contiguous view's page table,
    # with a window and sinks.
    H, Hkv = heads
    b = TorchBatch(PREFILL_Q, PREFILL_KV, H, Hkv, 128, 16, dtype, "cuda", seed=H + causal + 3)
    kc, vc, cu_k = contiguous_rows(b)
    sinks = torch.linspace(-1, 2, H, device="cuda")
    w = attnkit.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(b.cu_seqlens_q.cpu(), cu_k.cpu(), H, Hkv, 128, causal=causal, window_left=300, q_data_type=dtype)
    out, lse = w.run(b.q, kc, vc, return_lse=True, sinks=sinks)
    exp = b.reference(causal=causal, window=(300, -1), sinks=sinks)
    assert_close_t(out, exp[0], *tol(dtype), "ragged prefill")
    assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, "ragged prefill lse")


@needs_cuda
def test_cuda_flashinfer_prefill_graph_replays_after_replan():
    # A paged prefill run captured once (use_cuda_graph: the capacity is the first plan's requests,
    # pages and tokens), then a re-plan of fewer requests and tokens with other lengths and pages:
    # the replay reads the new plan.
    H, Hkv, D, bs = 8, 2, 128, 16
    a = TorchBatch(PREFILL_Q[:4], PREFILL_KV[:4], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=96)
    bb = TorchBatch([5, 100, 3], [500, 100, 1200], H, Hkv, D, bs, torch.bfloat16, "cuda", seed=97)
    on_cache_of(bb, a, bs, seed=7)
    cap_reqs, cap_pages = 4, a.kv_cache.shape[0]
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), use_cuda_graph=True,
        qo_indptr_buf=torch.empty(cap_reqs + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indptr_buf=torch.empty(cap_reqs + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buf=torch.empty(cap_pages, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buf=torch.empty(cap_reqs, dtype=torch.int32, device="cuda"))
    T = a.q.shape[0]
    q = a.q.clone()
    out = torch.zeros_like(q)

    def plan(b):
        w.plan(b.cu_seqlens_q.cpu(), *page_table_of(b), H, Hkv, D, bs, causal=True, q_data_type=torch.bfloat16)

    plan(a)
    w.run(q, a.kv_cache, out=out)  # eager: makes the plan's device copy
    graph = captured(lambda s: w.run(q, a.kv_cache, out=out))
    replayed(graph, out)
    assert_close_t(out, a.reference(causal=True)[0], *tol(torch.bfloat16), "prefill graph replay, first plan")
    plan(bb)
    tb = bb.q.shape[0]
    assert tb <= T
    q[:tb] = bb.q
    replayed(graph, out)
    assert_close_t(out[:tb], bb.reference(causal=True)[0], *tol(torch.bfloat16), "prefill graph replay after re-plan")


@needs_cuda
@pytest.mark.parametrize("heads", [(8, 2), (8, 8)], ids=["gqa4", "mha"])
def test_cuda_flashinfer_prefill_nvfp4(heads):
    # NVFP4 prefills: planned with 16-row tiles (the decode tile is the one that reads NVFP4).
    H, Hkv, D, page = heads[0], heads[1], 128, 64
    b = TorchBatch(PREFILL_Q, PREFILL_KV, H, Hkv, D, page, torch.bfloat16, "cuda", seed=81 + H)
    codes, sf, vals = nvfp4_cache(b.kv_cache.shape[0], page, Hkv, D, seed=H)
    b.kv_cache = vals
    w = attnkit.BatchPrefillWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(b.cu_seqlens_q.cpu(), *page_table_of(b), H, Hkv, D, page, causal=True, q_data_type=torch.bfloat16,
           kv_data_type=torch.uint8)
    assert w.plan_info["tile_q"] == 16
    out, lse = w.run(b.q, codes, kv_cache_sf=sf.view(torch.float8_e4m3fn), k_scale=0.5, v_scale=2.0, return_lse=True)
    exp = b.reference(causal=True, scale=0.5 / math.sqrt(D))
    atol, rtol = tol(torch.bfloat16)
    assert_close_t(out, 2.0 * exp[0], 2 * atol, rtol, "nvfp4 prefill")
    assert_close_t(lse, exp[1].T.to(torch.float32) / math.log(2), 2e-3, 2e-3, "nvfp4 prefill lse")


@needs_cuda
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_cuda_flashinfer_layer_mixed_batch(causal):
    # The engine path of the FlashInfer-style backend on a batch that mixes decodes (first) and
    # prefills (chunked, over a cached prefix): one forward, one output and LSE.
    H, Hkv, D, bs = 16, 4, 128, 16
    layer = attnkit.AttentionLayer(H, Hkv, D, "bfloat16", block_size=bs, device="cuda", backend="flashinfer",
                                   lse=True, non_causal=not causal)
    q_lens, kv_lens = [1, 1, 1, 1, 300, 37, 128], [5000, 17, 300, 4000, 2300, 37, 900]
    b = TorchBatch(q_lens, kv_lens, H, Hkv, D, bs, torch.bfloat16, "cuda", seed=95 + causal)
    slots = []
    for r, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        slots += [int(b.block_table[r, p // bs]) * bs + p % bs for p in range(kl - ql, kl)]
    md = layer.build_metadata(b.cu_seqlens_q, b.seqused_k, b.block_table, torch.tensor(slots, device="cuda"),
                              causal=causal)
    out, lse = layer.forward(b.q, None, None, b.kv_cache.contiguous(), md, return_lse=True)
    check(b, (out, lse), b.reference(causal=causal), f"flashinfer mixed batch causal {causal}")


@needs_cuda
def test_cupy_interop():
    cupy = pytest.importorskip("cupy")
    b = TorchBatch([1, 3], [20, 40], 4, 2, 64, 16, torch.float16, "cuda", seed=11)
    exp = b.reference(causal=True)
    k, v = b.views()
    c = [cupy.from_dlpack(t) for t in (b.q, k, v, b.cu_seqlens_q, b.seqused_k, b.block_table)]
    out = attnkit.flash_attn_varlen_func(c[0], c[1], c[2], b.max_seqlen_q, c[3], b.max_seqlen_k,
                                         seqused_k=c[4], block_table=c[5], causal=True)
    cupy.cuda.get_current_stream().synchronize()
    assert_close_t(torch.from_dlpack(out), exp[0], *tol(torch.float16), "cupy out")


# ---- CPU PyTorch tensors (the reference backend) ------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cpu_torch_tensors(dtype):
    b = TorchBatch([1, 4, 9], [30, 12, 50], 4, 2, 64, 16, dtype, "cpu", seed=12)
    check(b, b.run(causal=True, softcap=10.0), b.reference(causal=True, softcap=10.0), "cpu torch")


def test_cpu_torch_requires_grad_is_refused_clearly():
    b = TorchBatch([1], [16], 2, 2, 16, 16, torch.float32, "cpu")
    with pytest.raises(attnkit.AttnkitError, match="requires_grad"):
        attnkit.flash_attn_varlen_func(b.q.clone().requires_grad_(), *b.views(), 1, b.cu_seqlens_q, 16,
                                       seqused_k=b.seqused_k, block_table=b.block_table)


def test_cpu_torch_fp8_cache_and_write():
    b = TorchBatch([2, 1], [20, 33], 4, 2, 32, 16, torch.float32, "cpu", fp8="e4m3", seed=13)
    ks = torch.tensor([0.5])
    got = b.run(causal=True, k_descale=ks, v_descale=ks)
    check(b, got, b.reference(causal=True, k_scale=ks, v_scale=ks), "cpu torch fp8")
    key = torch.randn(3, 2, 32)
    cache = torch.zeros(2, 2, 16, 2, 32, dtype=torch.float8_e4m3fn)
    exp = cache.clone()
    slots = torch.tensor([0, 17, -1])
    torch_write(key, key, exp[:, 0], exp[:, 1], slots, "e4m3", ks, ks)
    attnkit.reshape_and_cache_flash(key, key, cache[:, 0], cache[:, 1], slots, "auto", ks, ks)
    assert torch.equal(cache.view(torch.uint8), exp.view(torch.uint8))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cpu_torch_flashinfer_decode(layout):
    b = TorchBatch([1] * 4, [3, 16, 40, 77], 8, 2, 64, 16, torch.bfloat16, "cpu", layout=layout, seed=14)
    pages = [-(-n // 16) for n in b.seqused_k.tolist()]
    indptr = torch.tensor([0] + list(np.cumsum(pages)), dtype=torch.int32)
    indices = torch.cat([b.block_table[r, :p] for r, p in enumerate(pages)])
    last = torch.tensor([n - (p - 1) * 16 for n, p in zip(b.seqused_k.tolist(), pages)], dtype=torch.int32)
    w = attnkit.BatchDecodeWithPagedKVCacheWrapper(torch.empty(0, dtype=torch.uint8), kv_layout=layout)
    w.plan(indptr, indices, last, 8, 2, 64, 16, q_data_type=torch.bfloat16, logits_soft_cap=8.0)
    out, lse = w.run(b.q, b.kv_cache, return_lse=True)
    exp_out, exp_lse = b.reference(causal=True, softcap=8.0)
    assert_close_t(out, exp_out, *tol(torch.bfloat16), "flashinfer cpu torch out")
    assert_close_t(lse, (exp_lse / math.log(2)).T, 2e-3, 2e-3, "flashinfer cpu torch lse (base 2)")


@needs_cuda
def test_cuda_num_splits_rule_and_scheduler_metadata():
    # One long decode and a few short ones: the builder's rule splits this batch (few work items).
    q_lens, kv_lens = [1, 1, 1], [4000, 70, 1]
    b = TorchBatch(q_lens, kv_lens, 8, 2, 128, 16, torch.bfloat16, "cuda", seed=77)
    ref = b.reference(causal=True)
    meta = attnkit.get_scheduler_metadata(len(q_lens), b.max_seqlen_q, b.max_seqlen_k, 8, 2, 128, b.seqused_k,
                                          qkv_dtype=torch.bfloat16)
    assert meta.is_cuda and meta.dtype == torch.int32
    splits = int(meta[0].item())
    assert splits > 1, meta.tolist()
    check(b, b.run(causal=True, num_splits=0), ref, "num_splits=0 (the rule)")
    check(b, b.run(causal=True, scheduler_metadata=meta), ref, f"scheduler_metadata ({splits} splits)")
    check(b, b.run(causal=True, num_splits=1), ref, "num_splits=1")
    check(b, b.run(causal=True, num_splits=5), ref, "num_splits=5")
    other = attnkit.get_scheduler_metadata(len(q_lens), b.max_seqlen_q, b.max_seqlen_k, 8, 1, 128, b.seqused_k)
    with pytest.raises(attnkit.AttnkitError, match="num_kv_heads"):
        b.run(causal=True, scheduler_metadata=other)


# ---- soak: many random mixed batches through the engine path ------------------------------------

SOAK_LAYERS = [  # (heads, kv heads, head size, dtype, kv cache dtype, block size, backend)
    (32, 8, 128, "bfloat16", "auto", 16, "flash_attn"),
    (32, 8, 128, "bfloat16", "auto", 16, "flashinfer"),
    (16, 16, 64, "float16", "auto", 32, "flash_attn"),
    (8, 1, 256, "bfloat16", "auto", 16, "flash_attn"),
    (32, 8, 128, "bfloat16", "fp8_e4m3", 16, "flash_attn"),
    (8, 2, 128, "float16", "auto", 64, "flashinfer"),
    (12, 4, 96, "bfloat16", "auto", 16, "flash_attn"),
    (32, 4, 128, "bfloat16", "auto", 128, "flashinfer"),
]


def _rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@needs_cuda
def test_cuda_soak_engine_path():
    # Random mixed batches (decodes first, prefills, chunked prefills; GQA ratios, head sizes,
    # fp8 and 16-bit caches, block sizes 16..128, both GPU backends) through
    # AttentionLayer.build_metadata / forward, two sampled requests of each checked against the
    # float64 reference; zero failures, an empty device error record, and no growth of device
    # memory (no PyTorch block but the layers' workspaces outlives the batches; the driver's free
    # bytes) or of the host's resident set between the end of a warm-up and the end. ATTNKIT_SOAK=N batches (default 300;
    # tools/gpu-check.sh's soak step runs 10,000).
    import gc
    import os
    import random

    n_batches = int(os.environ.get("ATTNKIT_SOAK", "300"))
    rnd = random.Random(2026)
    g = torch.Generator(device="cuda").manual_seed(2026)
    max_reqs, max_kv = 12, 2000  # (a request's keys: at most 2000, below)
    layers = []
    for H, Hkv, D, dtype, cache_dtype, bs, backend in SOAK_LAYERS:
        layer = attnkit.AttentionLayer(H, Hkv, D, dtype, kv_cache_dtype=cache_dtype, block_size=bs, device="cuda",
                                       backend=backend)
        num_blocks = max_reqs * (max_kv // bs + 1)  # (every batch fits, whatever its lengths)
        shape = layer.kv_cache_physical_shape(num_blocks)
        cache = torch.randn(shape, generator=g, device="cuda")
        cache = cache.to(torch.float8_e4m3fn) if cache_dtype == "fp8_e4m3" else cache.to(getattr(torch, dtype))
        layers.append((layer, cache, H, Hkv, D, getattr(torch, dtype), bs, num_blocks))
    attnkit.device_errors()


    def one_batch(i):
        """Batch i: a random mixed batch through the layer, two sampled requests against the
        reference. Returns (requests checked, failures); its tensors die with the call."""
        layer, cache, H, Hkv, D, dt, bs, num_blocks = layers[rnd.randrange(len(layers))]
        n = rnd.randint(1, max_reqs)
        q_lens, kv_lens = [], []
        for _ in range(n):
            kind = rnd.random()
            if kind < 0.6:
                q = 1
                kv = rnd.randint(1, 2000)
            elif kind < 0.8:
                q = rnd.randint(2, 300)
                kv = q
            else:
                q = rnd.randint(2, 200)
                kv = q + rnd.randint(1, 1500)
            q_lens.append(q)
            kv_lens.append(kv)
        order = sorted(range(n), key=lambda r: q_lens[r])  # (decodes first, whatever a backend's threshold)
        q_lens = [q_lens[r] for r in order]
        kv_lens = [kv_lens[r] for r in order]
        blocks = [-(-kv // bs) for kv in kv_lens]
        ids = torch.randperm(num_blocks, generator=g, device="cuda")[:sum(blocks)].to(torch.int32).cpu()
        width = max(blocks)
        table = torch.zeros(n, width, dtype=torch.int32)
        at = 0
        for r, nb in enumerate(blocks):
            table[r, :nb] = ids[at:at + nb]
            at += nb
        cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32)
        seq = torch.tensor(kv_lens, dtype=torch.int32)
        slots = torch.cat([table[r, torch.arange(kv - q, kv) // bs].long() * bs + torch.arange(kv - q, kv) % bs
                           for r, (q, kv) in enumerate(zip(q_lens, kv_lens))])
        T = int(cu[-1])
        qt = torch.randn(T, H, D, generator=g, device="cuda").to(dt)
        found, n_checked = [], 0
        try:
            md = layer.build_metadata(cu, seq, table, slots)
            out = layer.forward(qt, None, None, cache, md)
            for r in rnd.sample(range(n), min(2, n)):
                q0, q1 = int(cu[r]), int(cu[r + 1])
                # (the request's own blocks only: the reference widens what it is given to float64)
                own = table[r, :blocks[r]].cuda().long()
                kc, vc = (cache[own, 0], cache[own, 1])
                exp = torch_attention(qt[q0:q1], kc, vc, torch.tensor([0, q1 - q0], dtype=torch.int32), seq[r:r + 1],
                                      torch.arange(blocks[r], dtype=torch.int32, device="cuda").view(1, -1),
                                      causal=True)[0]
                atol, rtol = tol(dt)
                bound = atol + rtol * exp.abs()
                if kc.dtype == torch.float8_e4m3fn:
                    # (its prefills run the hopper kernel's fp8 GEMMs: Q quantised, and P rounded to
                    # e4m3 before P V, each weight within 2^-4 relative, so an output is within 2^-4
                    # of the attention over |V|: a row that weighs a few large values, as these short
                    # requests over N(0, 1) values do, errs by up to ~0.15)
                    cu1 = torch.tensor([0, q1 - q0], dtype=torch.int32)
                    tab1 = torch.arange(blocks[r], dtype=torch.int32, device="cuda").view(1, -1)
                    over_abs = torch_attention(qt[q0:q1], kc, vc.to(torch.float64).abs(), cu1, seq[r:r + 1], tab1,
                                               causal=True)[0]
                    bound = 2 * bound + 2.0 ** -4 * over_abs
                a = out[q0:q1].double()
                if not torch.isfinite(a).all() or ((a - exp).abs() > bound).any():
                    worst = float((a - exp).abs().max()) if torch.isfinite(a).all() else float("nan")
                    found.append(f"batch {i} ({layer.backend}, H {H}/{Hkv}, D {D}, {kc.dtype}, block {bs}) "
                                 f"request {r} of q {q_lens} kv {kv_lens}: max |error| {worst}")
                n_checked += 1
        except Exception as ex:  # (an error is a failure too: every batch here is valid)
            found.append(f"batch {i}: {type(ex).__name__}: {ex}")
        return n_checked, found

    def memory():  # (after the batches' tensors are gone: one_batch's locals die with it)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0], _rss_bytes()

    def live_blocks():  # PyTorch's live device blocks (address, bytes), less the layers' own buffers
        held = {int(w.data_ptr()) for lay in layers for w in (lay[0]._own_workspace, lay[0]._device_buffer)
                if w is not None}
        return {(b["address"], b["size"]) for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
                if b["state"] == "active_allocated" and b["address"] not in held}

    def workspaces():
        return [0 if lay[0]._own_workspace is None else int(lay[0]._own_workspace.numel()) for lay in layers]

    def grown(before_blocks, before_ws):  # what differs between the warm-up's end and now
        now = live_blocks()
        new, gone = sorted(now - before_blocks, key=lambda x: -x[1]), sorted(before_blocks - now, key=lambda x: -x[1])
        return (f"{len(new)} blocks new ({sum(x[1] for x in new)} B; largest {[x[1] for x in new[:6]]}), "
                f"{len(gone)} gone ({sum(x[1] for x in gone)} B); workspaces {before_ws} -> {workspaces()} B")

    failures, checked = [], 0
    warmup = min(50, n_batches // 2)
    before = None
    for i in range(n_batches):
        if i == warmup:
            before = memory()
            before_blocks, before_ws = live_blocks(), workspaces()
        n_checked, found = one_batch(i)
        checked += n_checked
        failures += found
        if len(failures) >= 5:
            break
    torch.cuda.synchronize()
    errors = attnkit.device_errors()
    after = memory()
    print(f"soak: {n_batches} batches, {checked} requests checked, {len(failures)} failures; device allocated "
          f"{before[0]} -> {after[0]} B, driver free {before[1]} -> {after[1]} B, host RSS {before[2]} -> {after[2]} B")
    assert not failures, "\n".join(failures)
    assert errors["faults"] == 0 and errors["dropped_kv_tokens"] == 0, errors
    # No PyTorch block outlives the batches but the layers' own buffers (workspaces grow to the
    # largest batch seen, a layer first used after the warm-up makes its plans' buffer then; their
    # blocks may be larger than asked for, so allocated bytes less their sizes are not a measure).
    new_blocks = live_blocks() - before_blocks
    assert not new_blocks, f"PyTorch device blocks outlived the batches: {grown(before_blocks, before_ws)}"
    assert after[1] >= before[1] - (64 << 20), "the driver's free device memory fell by more than 64 MB"
    assert after[2] <= before[2] + (64 << 20), "the host's resident set grew by more than 64 MB"


@needs_cuda
@pytest.mark.parametrize("interleave", [1, 16])
def test_cuda_dcp_decode_shards_merge_to_the_unsharded_result(interleave):
    # Decode context parallelism on the GPU (flash_attn): two ranks each hold their shard of
    # every request's keys (token t on rank (t // interleave) % 2, one of them empty for a short
    # request) in their own cache; each rank's forward gives its partial and LSE; merge_states of
    # the two is the unsharded attention.
    H, Hkv, D, bs, N = 8, 2, 128, 16, 2
    g = torch.Generator(device="cpu").manual_seed(interleave)
    kv_lens = [300, 7, 1000, 33, 1]
    keys = [torch.randn(n, Hkv, D, generator=g).to(torch.bfloat16).cuda() for n in kv_lens]
    vals = [torch.randn(n, Hkv, D, generator=g).to(torch.bfloat16).cuda() for n in kv_lens]
    n = len(kv_lens)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    q = torch.randn(n, H, D, generator=g).to(torch.bfloat16).cuda()
    parts = []
    for rank in range(N):
        layer = attnkit.AttentionLayer(H, Hkv, D, "bfloat16", block_size=bs, lse=True, device="cuda",
                                       backend="flash_attn")
        mine = [[t for t in range(m) if (t // interleave) % N == rank] for m in kv_lens]
        blocks = [max(1, -(-len(m) // bs)) for m in mine]
        table = torch.zeros(n, max(blocks), dtype=torch.int32)
        at = 0
        for r, b in enumerate(blocks):
            table[r, :b] = torch.arange(at, at + b)
            at += b
        cache = torch.zeros(layer.kv_cache_physical_shape(at), dtype=torch.bfloat16, device="cuda")
        for r, m in enumerate(mine):
            if m:
                slots = torch.tensor([int(table[r, j // bs]) * bs + j % bs for j in range(len(m))], dtype=torch.int64,
                                     device="cuda")
                idx = torch.tensor(m, device="cuda")
                attnkit.write_kv(keys[r][idx], vals[r][idx], cache, slots, layout="NHD")
        md = layer.build_metadata(qsl, torch.tensor(kv_lens, dtype=torch.int32), table,
                                  torch.full((n,), -1, dtype=torch.int64), dcp=(N, rank, interleave))
        parts.append(layer.forward(q, None, None, cache, md, return_lse=True))
    out, lse = attnkit.merge_states(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    for r in range(n):
        K = keys[r].double().repeat_interleave(H // Hkv, dim=1).transpose(0, 1)  # [H, L, D]
        V = vals[r].double().repeat_interleave(H // Hkv, dim=1).transpose(0, 1)
        s = (q[r].double().unsqueeze(1) @ K.transpose(1, 2)).squeeze(1) / math.sqrt(D)  # [H, L]
        exp_lse = torch.logsumexp(s, dim=1)
        exp_out = (torch.softmax(s, dim=1).unsqueeze(1) @ V).squeeze(1)  # [H, D]
        assert_close_t(out[r], exp_out, *tol(torch.bfloat16), f"dcp out, request {r}")
        assert_close_t(lse[:, r], exp_lse, 2e-3, 2e-3, f"dcp lse, request {r}")
    # A causal shard with a longer query: refused, saying why.
    with pytest.raises(attnkit.AttnkitError, match="causal DCP shard"):
        layer.build_metadata(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([40], dtype=torch.int32),
                             torch.zeros(1, 2, dtype=torch.int32), torch.full((2,), -1, dtype=torch.int64),
                             dcp=(N, 0, interleave))
