#!/usr/bin/env python3
"""Merges attnkit_bench's and peers.py's JSON lines into ONE markdown table (ours next to the
peers, with the ratios: ours/FLASH, ours/cuDNN, decode fraction of the measured read-only
bandwidth, fp8/bf16 decode speedup), then the prefill rows' ours / cuDNN by shape group and batch
with each group's geomean (issue 20's table), then the issues' targets against what was
measured, last.

usage: report.py results.jsonl [peers.jsonl ...] [--out table.md] [--commit SHA]
"""
import argparse
import json
import math
import re
import sys


def load(paths):
    recs = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    line = line.strip()
                    if line:
                        recs.append(json.loads(line))
        except OSError as e:
            print(f"report: cannot read {p}: {e}", file=sys.stderr)
    return recs


def fmt(x, digits=1):
    return "" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return a / b if a and b else None


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def note_number(by, section, key, pattern):
    """The number that `pattern`'s group 1 finds in our row's note (a ratio the bench measured in
    turns, e.g. "... (FA-style launch): 1.02x"), or None."""
    m = re.search(pattern, by.get((section, key), {}).get("attnkit", {}).get("note", ""))
    return float(m.group(1)) if m else None


def build(recs):
    by = {}  # (section, key) -> {impl: rec}
    order = []
    for r in recs:
        k = (r["section"], r["key"])
        if k not in by:
            by[k] = {}
            order.append(k)
        by[k][r["impl"]] = r

    def val(section, key, impl):
        r = by.get((section, key), {}).get(impl)
        return r["value"] if r and r.get("metric") != "error" else None

    def ms(section, key, impl):
        r = by.get((section, key), {}).get(impl)
        return r["ms"] if r and r.get("metric") != "error" else None

    read_bw = next((val(s, k, "attnkit") for (s, k) in order if s == "ceiling" and k.startswith("read-only")), None)
    rows = []
    head = ["section", "shape", "unit", "attnkit", "torch FLASH", "torch cuDNN", "ours/FLASH",
            "ours/cuDNN", "% of read BW", "speed x bf16", "notes"]
    for (s, k) in order:
        impls = by[(s, k)]
        ours = impls.get("attnkit")
        unit = next((r["metric"] for r in impls.values() if r.get("metric") != "error"), "error")
        a = val(s, k, "attnkit")
        fl, cu = val(s, k, "torch-FLASH"), val(s, k, "torch-cuDNN")
        frac = speed = None
        if s in ("decode", "decode-fi") and unit == "GB/s" and a and read_bw:
            frac = 100.0 * a / read_bw
        if s == "decode" and k.startswith("decode fp8"):
            speed = ratio(ms(s, k.replace("decode fp8", "decode bf16"), "attnkit"), ms(s, k, "attnkit"))
        for q in ("fp8", "nvfp4"):
            if s == "decode-fi" and k.startswith(f"decode-fi {q} "):
                speed = ratio(ms(s, k.replace(f"decode-fi {q} ", "decode-fi bf16 "), "attnkit"), ms(s, k, "attnkit"))
        notes = []
        for r in impls.values():  # each distinct note once: ours' method, the peers' GQA mode, failures
            n = r.get("note", "")
            if r.get("impl") != "attnkit" and r.get("metric") != "error":
                n = f"{r['impl']}: {n}"
            if n and n not in notes:
                notes.append(n)
        rows.append([s, k, unit, fmt(a), fmt(fl), fmt(cu), fmt(ratio(a, fl), 2), fmt(ratio(a, cu), 2),
                     fmt(frac), fmt(speed, 2), "; ".join(notes)[:200]])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]

    # Targets of issue 4, checked against this run.
    targets = []

    def pre(pattern):
        return [(k, val("prefill", k, "attnkit"), val("prefill", k, "torch-FLASH"), val("prefill", k, "torch-cuDNN"))
                for (s, k) in order if s == "prefill" and re.match(pattern, k)]

    p128 = pre(r"prefill d128 h32/\d+ causal ")
    r_fl = [ratio(a, f) for _, a, f, _ in p128]
    r_cu = [ratio(a, c) for _, a, _, c in p128]
    if any(r_fl):
        worst = min((x for x in r_fl if x), default=None)
        targets.append(f"prefill d128 causal, 16k tokens: ours/FLASH geomean {fmt(geomean(r_fl), 2)}x, min {fmt(worst, 2)}x "
                       f"(target >= 1.0x: {'met' if worst and worst >= 1.0 else 'MISSED'}); ours/cuDNN geomean {fmt(geomean(r_cu), 2)}x")
    else:
        targets.append("prefill d128 causal vs FLASH: no comparable numbers in this run")

    # Padding cost (issue 18): a head size rounded up to its kernel's dim, counted by its real
    # columns, against the next compiled dim on the same shapes (geomean over the seqlens).
    def pad_ratio(small, big):
        rs = []
        for k, a, _, _ in pre(rf"prefill d{small} h32/8 causal "):
            b = val("prefill", k.replace(f"prefill d{small} ", f"prefill d{big} ", 1), "attnkit")
            rs.append(ratio(a, b))
        return geomean(rs), min((x for x in rs if x), default=None)

    for small, big, want in ((80, 96, 0.8), (112, 128, 0.85)):
        g, lo = pad_ratio(small, big)
        if g:
            targets.append(f"prefill d{small} / d{big} causal h32/8 TFLOP/s: geomean {fmt(g, 2)}x, min {fmt(lo, 2)}x "
                           f"(target >= {want}x: {'met' if lo >= want else 'MISSED'})")

    def dec(dtype, cond):
        out = []
        for (s, k) in order:
            m = re.match(rf"decode {dtype} b(\d+) kv(\d+)", k) if s == "decode" else None
            if m and cond(int(m.group(1)), int(m.group(2))):
                out.append((k, val(s, k, "attnkit"), ms(s, k, "attnkit")))
        return out

    if read_bw:
        big = dec("bf16", lambda b, l: b >= 16 and l >= 4096)
        fr = [100.0 * v / read_bw for _, v, _ in big if v]
        if fr:
            targets.append(f"decode bf16 batch>=16 KV>=4k: {fmt(min(fr))}%..{fmt(max(fr))}% of read BW "
                           f"(target >= 85%: {'met' if min(fr) >= 85 else 'MISSED'})")
        one = dec("bf16", lambda b, l: b == 1 and l == 32768)
        if one and one[0][1]:
            f1 = 100.0 * one[0][1] / read_bw
            targets.append(f"decode bf16 batch 1 KV 32k: {fmt(f1)}% of read BW (target >= 60%: {'met' if f1 >= 60 else 'MISSED'})")
    sp = []
    for k, _, t8 in dec("fp8", lambda b, l: b >= 16 and l >= 4096):
        t16 = ms("decode", k.replace("decode fp8", "decode bf16"), "attnkit")
        if t8 and t16:
            sp.append(t16 / t8)
    if sp:
        targets.append(f"decode fp8/bf16 speedup, batch>=16 KV>=4k: {fmt(min(sp), 2)}x..{fmt(max(sp), 2)}x "
                       f"(target >= 1.7x: {'met' if min(sp) >= 1.7 else 'MISSED'})")
    # FlashInfer-style decode (issue 19).
    def fi(dtype, page, cond):
        out = []
        for (s, k) in order:
            m = re.match(rf"decode-fi {dtype} p{page} b(\d+) kv(\d+)$", k) if s == "decode-fi" else None
            if m and cond(int(m.group(1)), int(m.group(2))):
                out.append((k, val(s, k, "attnkit"), ms(s, k, "attnkit")))
        return out

    if read_bw and fi("bf16", 16, lambda b, l: True):
        big = [100.0 * v / read_bw for _, v, _ in fi("bf16", 16, lambda b, l: b >= 16 and l >= 4096) if v]
        if big:
            targets.append(f"flashinfer decode bf16 p16 batch>=16 KV>=4k: {fmt(min(big))}%..{fmt(max(big))}% of read BW "
                           f"(target >= 95%: {'met' if min(big) >= 95 else 'MISSED'})")
        one = fi("bf16", 16, lambda b, l: b == 1 and l == 32768)
        if one and one[0][1]:
            f1 = 100.0 * one[0][1] / read_bw
            targets.append(f"flashinfer decode bf16 p16 1 x 32k: {fmt(f1)}% of read BW (target >= 80%: {'met' if f1 >= 80 else 'MISSED'})")
        small = fi("bf16", 16, lambda b, l: b == 1 and l == 1024)
        if small and small[0][2]:
            us = small[0][2] * 1e3
            targets.append(f"flashinfer decode bf16 p16 1 x 1k: {fmt(us)} us per call (target <= 6 us: {'met' if us <= 6 else 'MISSED'})")
        for q, want in (("fp8", 1.85), ("nvfp4", 3.0)):  # bf16 time / quantized time, batch >= 16, KV >= 4k
            sp = []
            for k, _, tq in fi(q, 16, lambda b, l: b >= 16 and l >= 4096):
                t16 = ms("decode-fi", k.replace(f"decode-fi {q}", "decode-fi bf16"), "attnkit")
                if tq and t16:
                    sp.append(t16 / tq)
            if sp:
                targets.append(f"flashinfer decode {q}/bf16 batch>=16 KV>=4k: {fmt(min(sp), 2)}x..{fmt(max(sp), 2)}x "
                               f"(target >= {want}x: {'met' if min(sp) >= want else 'MISSED'})")
        skew = val("decode-fi", "decode-fi bf16 p16 skewed 1x32768+63x1024", "attnkit")
        if skew:
            fs = 100.0 * skew / read_bw
            targets.append(f"flashinfer decode skewed 1 x 32k + 63 x 1k: {fmt(fs)}% of read BW (target >= 85%: {'met' if fs >= 85 else 'MISSED'})")
        for (s, k) in order:
            if s == "decode-fi" and k.endswith(" eager"):
                r = note_number(by, s, k, r"graph: ([0-9.]+)x$")
                if r:
                    targets.append(f"flashinfer {k[len('decode-fi '):]}: eager / graph replay per call {fmt(r, 2)}x")
        pr = []
        for k, v, _ in fi("bf16", 128, lambda b, l: True):
            v16 = val("decode-fi", k.replace(" p128 ", " p16 "), "attnkit")
            if v and v16:
                pr.append(v / v16)
        if pr:
            targets.append(f"flashinfer decode page 128 / page 16 (bf16): {fmt(min(pr), 3)}x..{fmt(max(pr), 3)}x "
                           f"(target within 3%: {'met' if min(pr) >= 0.97 else 'MISSED'})")
        rf = [r for (s, k) in order if s == "decode-fi" and (r := note_number(by, s, k, r"\): ([0-9.]+)x$"))]
        if rf:
            targets.append(f"flashinfer decode / FlashAttention-style decode, same instances in turns: geomean "
                           f"{fmt(geomean(rf), 3)}x, range {fmt(min(rf), 2)}..{fmt(max(rf), 2)}x")
    # FlashInfer-style prefill (issue 21): the planned part against the FlashAttention-style
    # launch of the same batch in the same turns (the note's ratio).
    def fa_ratio(k):
        return note_number(by, "prefill-fi", k, r"\): ([0-9.]+)x$")

    paged = [r for (s, k) in order if s == "prefill-fi" and k.startswith("prefill-fi paged") and (r := fa_ratio(k))]
    if paged:
        targets.append(f"flashinfer paged prefill d128 16k tokens / FlashAttention-style, same batch in turns: "
                       f"{fmt(min(paged), 2)}x..{fmt(max(paged), 2)}x (target >= 1.0x: "
                       f"{'met' if min(paged) >= 1.0 else 'MISSED'})")
    skew_k = "prefill-fi skewed p16 d128 h32/8 causal 1x16384+31x512"
    if r := fa_ratio(skew_k):
        targets.append(f"flashinfer skewed prefill 1 x 16k + 31 x 512 / FlashAttention-style: {fmt(r, 2)}x "
                       f"(target >= 1.2x: {'met' if r >= 1.2 else 'MISSED'})")
    step_k = "prefill-fi engine step 64x(1 over 4096) + 2x(2048 over 8192)"
    r = note_number(by, "prefill-fi", step_k, r": ([0-9.]+)x$")
    if r:
        targets.append(f"flashinfer engine step (64 decodes + 2 chunked prefills), flash_attn forward time / "
                       f"flashinfer's: {fmt(r, 2)}x (target >= 0.95x: {'met' if r >= 0.95 else 'MISSED'})")
    plan_us = val("decode-fi", "decode-fi host plan b256 kv4096", "attnkit")
    if plan_us:
        targets.append(f"flashinfer host plan, batch 256: {fmt(plan_us)} us (target < 20 us: {'met' if plan_us < 20 else 'MISSED'})")
    groups = prefill_ratios(order, val)
    targets += prefill_targets(groups, order, by)
    if read_bw:
        targets.insert(0, f"read-only ceiling measured: {fmt(read_bw)} GB/s")
    return lines, targets, prefill_table(groups)


PREFILL_BATCHES = ["s512x32", "s1024x16", "s2048x8", "s4096x4", "s8192x2", "s16384x1"]
PREFILL_KEY = re.compile(r"prefill (d(\d+) h\d+/\d+ (causal|full)) (s(\d+)x\d+)$")


def prefill_ratios(order, val):
    """{shape group ("d128 h32/8 causal"): {batch ("s4096x4"): (ours TFLOP/s, ours / cuDNN, tokens
    per request)}}, in the run's order, from the prefill section's rows with a cuDNN number."""
    groups = {}
    for (s, k) in order:
        m = PREFILL_KEY.match(k) if s == "prefill" else None
        a, cu = (val(s, k, "attnkit"), val(s, k, "torch-cuDNN")) if m else (None, None)
        if m and a and cu:
            groups.setdefault(m.group(1), {})[m.group(4)] = (a, a / cu, int(m.group(5)))
    return groups


def prefill_table(groups):
    """Issue 20's table (groups: prefill_ratios): ours TFLOP/s (ours / cuDNN) per shape group and
    batch, and the geomean of each group's ratios."""
    if not groups:
        return []
    lines = ["| shape (paged block 16) | 512 x 32 | 1k x 16 | 2k x 8 | 4k x 4 | 8k x 2 | 16k x 1 | geomean |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for g, row in groups.items():
        cells = [f"{row[b][0]:.1f} ({row[b][1]:.2f})" if b in row else "" for b in PREFILL_BATCHES]
        lines.append(f"| {g} | " + " | ".join(cells) + f" | {fmt(geomean([r for _, r, _ in row.values()]), 2)} |")
    return lines


def prefill_targets(groups, order, by):
    """Issue 20's targets against this run: ours / cuDNN at >= 4k tokens per request (head sizes
    64, 128, 256: >= 1.0x), head size 128 causal 512 x 32 and 1k x 16 (>= 1.15x), the fp8 cache
    against bf16 in the same turns (the prefill-fp8 notes' bf16 / fp8 time: >= 1.0x)."""
    out = []

    def check(what, rs, want):
        if rs:
            lo = min(rs)
            out.append(f"{what}: {fmt(lo, 2)}x..{fmt(max(rs), 2)}x, geomean {fmt(geomean(rs), 2)}x "
                       f"(target >= {want}x: {'met' if lo >= want else 'MISSED'})")

    for hd in (64, 128, 256):
        long_rows = [r for g, row in groups.items() if g.startswith(f"d{hd} ")
                     for _, r, tokens in row.values() if tokens >= 4096]
        check(f"prefill d{hd} >= 4k tokens / cuDNN", long_rows, 1.0)
    short = [row[b][1] for g, row in groups.items() if g.startswith("d128 ") and g.endswith(" causal")
             for b in ("s512x32", "s1024x16") if b in row]
    check("prefill d128 causal 512 x 32 and 1k x 16 / cuDNN", short, 1.15)
    fp8 = [r for (s, k) in order if s == "prefill-fp8" and k.endswith(" fp8")
           and (r := note_number(by, s, k, r"bf16 / fp8 time ([0-9.]+)x"))]
    check("prefill fp8 cache / bf16 cache (time ratio, same turns)", fp8, 1.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    recs = load(args.files)
    if not recs:
        print("report: no records")
        return 1
    lines, targets, table = build(recs)
    text = []
    if args.commit:
        text.append(f"Measured commit: {args.commit}\n")
    text += lines
    if table:
        text += ["", "Prefill, ours TFLOP/s (ours / cuDNN) and the geomean per shape group:", ""] + table
    text.append("")
    text.append("Targets (issues 4, 18, 19, 20, 21), this run:")
    text += [f"- {t}" for t in targets]
    body = "\n".join(text) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(body)
    print(body, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
