"""tools/bench_ab.py, the same-run A/B of two bench builds (tools/gpu-check.sh's patches and guards
steps): each row's B / A - 1 of the median time, the geomean per group of rows (the key without
its batch token) and, last, the geomean and the worst row, on synthetic runs with known costs."""
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ["s512x32", "s1024x16", "s2048x8"]


def write_run(path, ms_of):
    with open(path, "w") as f:
        for group in ("prefill d128 h32/8 causal", "prefill d256 h32/8 causal"):
            for b in BATCHES:
                key = f"{group} {b}"
                f.write(json.dumps({"section": "prefill", "key": key, "impl": "attnkit", "ms": ms_of(key)}) + "\n")
                f.write(json.dumps({"section": "prefill", "key": key, "impl": "cudnn", "ms": 1.0}) + "\n")


def test_groups_and_overall(tmp_path):
    # B costs +10% on every d128 row and -10% on the d256 rows but one (+0%); turns differ by noise
    # the median of two turns keeps (the mean of the two).
    cost = {f"prefill d128 h32/8 causal {b}": 0.10 for b in BATCHES}
    cost.update({f"prefill d256 h32/8 causal {b}": -0.10 for b in BATCHES})
    cost["prefill d256 h32/8 causal s2048x8"] = 0.0
    a = [tmp_path / "a1.jsonl", tmp_path / "a2.jsonl"]
    b = [tmp_path / "b1.jsonl", tmp_path / "b2.jsonl"]
    write_run(a[0], lambda k: 0.99)
    write_run(a[1], lambda k: 1.01)
    write_run(b[0], lambda k: 0.99 * (1 + cost[k]))
    write_run(b[1], lambda k: 1.01 * (1 + cost[k]))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_ab.py"), f"{a[0]},{a[1]}", f"{b[0]},{b[1]}"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert "| prefill | prefill d128 h32/8 causal | 3 | +10.00% | +10.00% | +10.00% |" in lines
    g256 = (0.9 * 0.9) ** (1 / 3) - 1
    assert f"| prefill | prefill d256 h32/8 causal | 3 | {100 * g256:+.2f}% | -10.00% | +0.00% |" in lines
    overall = math.exp((3 * math.log(1.1) + 2 * math.log(0.9)) / 6) - 1
    assert lines[-1].startswith(f"6 rows: geomean {100 * overall:+.2f}%, worst +10.00% (prefill d128 h32/8 causal")
    assert "cudnn" not in out  # only attnkit's rows are compared
