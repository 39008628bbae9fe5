#!/usr/bin/env python3
"""Same-run A/B of two attnkit_bench builds: bench_ab.py A1.jsonl,A2.jsonl B1.jsonl,B2.jsonl
(the runs of each build, in turns). Prints each row's median time under A and B, B / A - 1 (the
cost of what A lacks: tools/gpu-check.sh's `guards` step runs A without the device guards) and the
geomean and the worst row."""
import json
import math
import statistics
import sys


def load(paths):
    rows = {}
    for p in paths.split(","):
        with open(p) as f:
            for line in f:
                r = json.loads(line)
                if r.get("impl") == "attnkit" and r.get("ms", 0) > 0:
                    rows.setdefault((r["section"], r["key"]), []).append(r["ms"])
    return {k: statistics.median(v) for k, v in rows.items()}


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    keys = [k for k in a if k in b]
    costs = []
    print("| section | key | A ms | B ms | B / A - 1 |")
    print("|---|---|---|---|---|")
    for k in keys:
        c = b[k] / a[k] - 1
        costs.append(c)
        print(f"| {k[0]} | {k[1]} | {a[k]:.4f} | {b[k]:.4f} | {100 * c:+.2f}% |")
    if costs:
        g = math.exp(sum(math.log1p(c) for c in costs) / len(costs)) - 1
        w = max(range(len(costs)), key=lambda i: costs[i])
        print(f"\n{len(costs)} rows: geomean {100 * g:+.2f}%, worst {100 * costs[w]:+.2f}% ({keys[w][1]})")


if __name__ == "__main__":
    main()
