#!/usr/bin/env python3
"""Reads the per-instruction table of an Nsight Compute source page (`ncu -i rep --page source
--csv --print-source sass`, written by tools/gpu-check.sh's profile step) and prints where the
warps of the kernel stall: the stall reasons over all samples, the instructions with the most
samples (with their top reasons and execution counts), the samples per execution count, which
separates the code of warp roles that run different loops (e.g. producer vs consumers), and the
regions of the code: runs of consecutive instructions with one execution count (a loop body, a
per-item prologue or epilogue of one role), in address order, with their samples and reasons;
a region with at least 2% of the samples also lists its opcodes by samples (e.g. how much of a
softmax waits on MUFU.EX2 against its FMNMX tree).

Usage: python3 tools/ncu_stalls.py sass30.csv [top_n]
"""
import csv
import sys
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Region:
    """Consecutive instructions with one execution count, from address `first` to `last`."""
    first: str
    exec: int
    last: str = ""
    instructions: int = 0
    samples: int = 0
    reasons: Counter = field(default_factory=Counter)
    op_samples: Counter = field(default_factory=Counter)  # samples per opcode family
    op_count: Counter = field(default_factory=Counter)  # instructions per opcode family


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None:
        print(f"{sys.argv[1]}: no source table (expected an 'Address' / 'Source' header)")
        return 1
    hdr = rows[header_at]
    ix = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[header_at + 1:] if len(r) >= len(hdr)]
    samples_col = "Warp Stall Sampling (All Samples)"
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, col):
        v = r[ix[col]].replace(",", "")
        return int(v) if v.isdigit() else 0

    total = sum(num(r, samples_col) for r in data) or 1
    print(f"{len(data)} instructions, {total} stall samples")
    by_reason = Counter({s: sum(num(r, s) for r in data) for s in stalls})
    for s, v in by_reason.most_common(8):
        print(f"  {s[6:]:<20} {100 * v / total:5.1f}%")
    print(f"top {top_n} instructions by samples:")
    for r in sorted(data, key=lambda r: -num(r, samples_col))[:top_n]:
        top = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:2]
        reasons = ", ".join(f"{name} {v}" for v, name in top if v)
        print(f"  {100 * num(r, samples_col) / total:5.1f}%  {r[ix['Address']][-5:]}  "
              f"{r[ix['Source']][:58]:<58}  exec {num(r, 'Instructions Executed')}  ({reasons})")
    per_exec = Counter()
    count = Counter()
    for r in data:
        e = num(r, "Instructions Executed")
        per_exec[e] += num(r, samples_col)
        count[e] += 1
    print("samples by execution count (one count per loop of one warp role):")
    for e, v in per_exec.most_common(8):
        print(f"  exec {e:>12}  {count[e]:5} instructions  {100 * v / total:5.1f}% of samples")
    print("regions (consecutive instructions of one execution count, >= 0.3% of samples):")
    regions = []
    for r in data:
        e = num(r, "Instructions Executed")
        if not regions or regions[-1].exec != e:
            regions.append(Region(r[ix["Address"]], e))
        g = regions[-1]
        g.last = r[ix["Address"]]
        g.instructions += 1
        g.samples += num(r, samples_col)
        for st in stalls:
            g.reasons[st] += num(r, st)
        op = opcode(r[ix["Source"]])
        g.op_samples[op] += num(r, samples_col)
        g.op_count[op] += 1
    for g in regions:
        if g.exec == 0 or g.samples < 0.003 * total:
            continue
        reasons = ", ".join(f"{st[6:]} {100 * c / total:.1f}" for st, c in g.reasons.most_common(3) if c)
        print(f"  {g.first[-5:]}-{g.last[-5:]}  exec {g.exec:>10}  {g.instructions:4} instructions  "
              f"{100 * g.samples / total:5.1f}%  ({reasons})")
        if g.samples >= 0.02 * total:
            ops = ", ".join(f"{o} {100 * c / total:.1f} ({g.op_count[o]})" for o, c in g.op_samples.most_common(6) if c)
            print(f"      opcodes, % of all samples (instructions): {ops}")
    return 0


def opcode(source: str) -> str:
    """The opcode family of one SASS line: 'MUFU' for '@!P2 MUFU.EX2 R4, R5'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


if __name__ == "__main__":
    sys.exit(main())
