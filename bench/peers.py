#!/usr/bin/env python3
"""The peers of attnkit_bench's prefill rows: PyTorch SDPA with its FLASH (FlashAttention-2) and
cuDNN backends on the same shapes (16k tokens per batch as seqlen 512..16k, 32 query heads with 8
KV heads and MHA, head sizes 64/128/256, causal and not, bf16; head sizes 80/96/112/512 GQA causal),
K/V contiguous (not paged).
Tensors are [batch, seq, heads, dim] viewed as [batch, heads, seq, dim] (the varlen layout).
GQA runs through enable_gqa=True where the backend takes it, else K/V are expanded with
repeat_interleave before timing; the note of each row says which. FLOPs are counted as in
attnkit_bench (4*tokens*seqlen*dim*heads, halved for causal). Writes JSON lines like the bench.

usage: peers.py [--json out.jsonl] [--quick] [--match SUBSTR]
"""
import argparse
import json
import sys

TOKENS, HEADS = 16384, 32


def key(hd, hkv, causal, seqlen, batch):
    return f"prefill d{hd} h{HEADS}/{hkv} {'causal' if causal else 'full'} s{seqlen}x{batch}"


def time_ms(torch, fn, warmup=1, reps=5):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    samples.sort()
    return samples[len(samples) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--match", default="", help="only the shapes whose key contains this or one of its |-separated alternatives")
    args = ap.parse_args()
    out = open(args.json, "w") if args.json else None

    def emit(rec):
        print(f"{rec['section']:<9} {rec['key']:<44} {rec['impl']:<12} {rec['value']:10.2f} "
              f"{rec['metric']:<8} {rec['ms']:9.4f} ms  {rec['note']}", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # no torch: say so in the table
        emit(dict(section="prefill", key="all prefill shapes", impl="torch", metric="error", value=0,
                  ms=0, note=f"FAILED: cannot import torch: {e}"))
        return 0
    if not torch.cuda.is_available():
        emit(dict(section="prefill", key="all prefill shapes", impl="torch", metric="error", value=0,
                  ms=0, note="FAILED: torch sees no CUDA device"))
        return 0
    print(f"peers: torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"cuDNN {torch.backends.cudnn.version()}", flush=True)
    backends = [("torch-FLASH", SDPBackend.FLASH_ATTENTION), ("torch-cuDNN", SDPBackend.CUDNN_ATTENTION)]
    head_sizes = [128] if args.quick else [64, 80, 96, 112, 128, 192, 256, 512]
    torch.manual_seed(0)
    for hd in head_sizes:
        for hkv in (8, 32):
            for causal in (True, False):
                if (args.quick or hd % 64 != 0 or hd > 256) and (hkv != 8 or not causal):
                    continue
                seqlen = 512
                while seqlen <= TOKENS:
                    batch = TOKENS // seqlen
                    k_name = key(hd, hkv, causal, seqlen, batch)
                    if not any(alt in k_name for alt in args.match.split("|")):
                        seqlen *= 2
                        continue
                    q = torch.randn(batch, seqlen, HEADS, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                    k = torch.randn(batch, seqlen, hkv, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                    v = torch.randn(batch, seqlen, hkv, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                    flops = 4.0 * TOKENS * seqlen * hd * HEADS * (0.5 if causal else 1.0)
                    for impl, backend in backends:
                        rec = dict(section="prefill", key=k_name, impl=impl, metric="TFLOP/s", value=0.0, ms=0.0)
                        try:
                            with sdpa_kernel(backend):
                                mode = "MHA"
                                if hkv != HEADS:
                                    try:
                                        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                                        torch.cuda.synchronize()
                                        kk, vv, gqa = k, v, True
                                        mode = "GQA via enable_gqa=True"
                                    except RuntimeError:
                                        kk = k.repeat_interleave(HEADS // hkv, dim=1)
                                        vv = v.repeat_interleave(HEADS // hkv, dim=1)
                                        gqa = False
                                        mode = "GQA via repeat_interleave (outside timing)"
                                else:
                                    kk, vv, gqa = k, v, False
                                if gqa:
                                    fn = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=True)
                                else:
                                    fn = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
                                ms = time_ms(torch, fn)
                            rec.update(value=flops / ms / 1e9, ms=ms, note=f"SDPA, contiguous K/V, {mode}")
                        except Exception as e:
                            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                            rec.update(metric="error", note=f"FAILED: {msg[:160]}")
                        emit(rec)
                    del q, k, v
                    seqlen *= 2
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
