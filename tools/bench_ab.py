#!/usr/bin/env python3
"""Same-run A/B of two attnkit_bench builds: bench_ab.py A1.jsonl,A2.jsonl B1.jsonl,B2.jsonl
(the runs of each build, in turns). Prints each row's median time under A and B, B / A - 1 (the
cost of what A lacks: tools/gpu-check.sh's `guards` step runs A without the device guards), the
geomean per group of rows (a row's key without its batch token, e.g. "prefill d128 h32/8
causal": a change that helps one head dim and costs another shows there) and, last, the geomean
and the worst row."""
import json
import math
import re
import statistics
import sys

BATCH = re.compile(r"^s\d+x\d+$")  # the batch token of a row's key (seq_len x requests)


def load(paths):
    rows = {}
    for p in paths.split(","):
        with open(p) as f:
            for line in f:
                r = json.loads(line)
                if r.get("impl") == "attnkit" and r.get("ms", 0) > 0:
                    rows.setdefault((r["section"], r["key"]), []).append(r["ms"])
    return {k: statistics.median(v) for k, v in rows.items()}


def group_of(key):
    return " ".join(tok for tok in key.split() if not BATCH.match(tok))


def geomean(costs):
    return math.exp(sum(math.log1p(c) for c in costs) / len(costs)) - 1


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
        groups = {}
        for k, c in zip(keys, costs):
            groups.setdefault((k[0], group_of(k[1])), []).append(c)
        print("\n| section | group | rows | geomean B / A - 1 | min | max |")
        print("|---|---|---|---|---|---|")
        for (section, group), cs in groups.items():
            if len(cs) > 1:
                print(f"| {section} | {group} | {len(cs)} | {100 * geomean(cs):+.2f}% | {100 * min(cs):+.2f}% | "
                      f"{100 * max(cs):+.2f}% |")
        g = geomean(costs)
        w = max(range(len(costs)), key=lambda i: costs[i])
        print(f"\n{len(costs)} rows: geomean {100 * g:+.2f}%, worst {100 * costs[w]:+.2f}% ({keys[w][1]})")


if __name__ == "__main__":
    main()
