"""bench/report.py, the tool that turns a benchmark run into bench/RESULTS.md's tables: issue 20's
prefill table (ours TFLOP/s and ours / cuDNN per shape group and batch, each group's geomean)
and its target lines, on synthetic records with known ratios."""
import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_report():
    spec = importlib.util.spec_from_file_location("attnkit_bench_report", ROOT / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rec(section, key, impl, value, note=""):
    return {"section": section, "key": key, "impl": impl, "metric": "TFLOP/s", "value": value,
            "ms": 1.0 / value, "note": note}


def records():
    out = []
    batches = ["s512x32", "s1024x16", "s2048x8", "s4096x4", "s8192x2", "s16384x1"]
    # d128 causal: ours 100 * (i + 1), cuDNN 100 * (i + 1) / r_i with known ratios r_i
    ratios = [1.2, 1.1, 0.9, 1.0, 1.05, 0.95]
    for i, b in enumerate(batches):
        key = f"prefill d128 h32/8 causal {b}"
        out.append(rec("prefill", key, "attnkit", 100.0 * (i + 1)))
        out.append(rec("prefill", key, "torch-cuDNN", 100.0 * (i + 1) / ratios[i]))
    # d64 full: one row only, and a row whose peer failed (no ratio)
    out.append(rec("prefill", "prefill d64 h32/8 full s4096x4", "attnkit", 300.0))
    out.append(rec("prefill", "prefill d64 h32/8 full s4096x4", "torch-cuDNN", 250.0))
    out.append(rec("prefill", "prefill d64 h32/8 full s8192x2", "attnkit", 310.0))
    out.append({"section": "prefill", "key": "prefill d64 h32/8 full s8192x2", "impl": "torch-cuDNN",
                "metric": "error", "value": 0.0, "ms": 0.0, "note": "FAILED"})
    out.append(rec("prefill-fp8", "prefill-fp8 d128 h32/8 causal s512x32 fp8", "attnkit", 90.0,
                   "fp8 e4m3 cache, block 16, hopper hopper_short; in turns: bf16 / fp8 time 0.924x, mma_sync fp8 / fp8 1.5x"))
    out.append(rec("prefill-fp8", "prefill-fp8 d128 h32/8 causal s16384x1 fp8", "attnkit", 600.0,
                   "fp8 e4m3 cache, block 16, hopper hopper; in turns: bf16 / fp8 time 1.100x, mma_sync fp8 / fp8 3.0x"))
    return out, ratios


def test_prefill_table_and_targets(tmp_path):
    report = load_report()
    recs, ratios = records()
    lines, targets, table = report.build(recs)
    assert table[0].startswith("| shape (paged block 16) | 512 x 32 |")
    d128 = next(line for line in table if line.startswith("| d128 h32/8 causal |"))
    cells = [c.strip() for c in d128.strip("|").split("|")]
    assert cells[1] == "100.0 (1.20)" and cells[6] == "600.0 (0.95)"
    want = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert cells[7] == f"{want:.2f}"
    d64 = next(line for line in table if line.startswith("| d64 h32/8 full |"))
    d64_cells = [c.strip() for c in d64.strip("|").split("|")]
    assert d64_cells[4] == "300.0 (1.20)" and d64_cells[5] == ""  # (the failed peer: no ratio)

    by_text = "\n".join(targets)
    assert "prefill d128 >= 4k tokens / cuDNN: 0.95x..1.05x" in by_text and "MISSED" in by_text
    assert "prefill d64 >= 4k tokens / cuDNN: 1.20x..1.20x, geomean 1.20x (target >= 1.0x: met)" in by_text
    assert "prefill d128 causal 512 x 32 and 1k x 16 / cuDNN: 1.10x..1.20x" in by_text
    assert "(target >= 1.15x: MISSED)" in by_text
    assert "prefill fp8 cache / bf16 cache (time ratio, same turns): 0.92x..1.10x" in by_text

    # The command line writes the same table into --out.
    src = tmp_path / "bench.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "table.md"
    import subprocess
    import sys
    subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), str(src), "--out", str(out)], check=True,
                   capture_output=True)
    text = out.read_text()
    assert "Prefill, ours TFLOP/s (ours / cuDNN) and the geomean per shape group:" in text
    assert d128 in text
