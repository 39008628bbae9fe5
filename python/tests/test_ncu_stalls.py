"""tools/ncu_stalls.py, the reader of an Nsight Compute source page (SASS with stall samples):
on a synthetic page with a known split, the totals, the regions (runs of one execution count)
and the opcode breakdown of the regions that hold at least 2% of the samples."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "ncu_stalls.py"
COLS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
        "stall_wait", "stall_math_pipe_throttle"]


def write_page(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])  # (ncu's first line names the kernel)
        w.writerow(COLS)
        for addr, src, samples, executed, wait, math in rows:
            w.writerow([f"0x{addr:05x}", src, samples, executed, wait, math])


def run(path):
    out = subprocess.run([sys.executable, str(TOOL), str(path)], capture_output=True, text=True, check=True)
    return out.stdout


def test_regions_and_opcodes(tmp_path):
    # A loop of 4 instructions (exec 100: 900 of 1000 samples) between two one-off ones.
    rows = [
        (0x10, "MOV R1, R2", 40, 1, 40, 0),
        (0x20, "FMNMX R3, R4, R5, !PT", 200, 100, 200, 0),
        (0x30, "MUFU.EX2 R6, R6", 300, 100, 0, 300),
        (0x40, "@!P2 MUFU.EX2 R7, R7", 300, 100, 0, 300),
        (0x50, "FADD R8, R6, R7", 100, 100, 100, 0),
        (0x60, "EXIT", 60, 1, 60, 0),
    ]
    page = tmp_path / "sass.csv"
    write_page(page, rows)
    text = run(page)
    assert "6 instructions, 1000 stall samples" in text
    assert "math_pipe_throttle" in text and "60.0%" in text  # 600 of 1000
    # The loop is one region of 4 instructions and 90% of the samples; its opcodes: MUFU 60%
    # (2 instructions, the predicated one included), FMNMX 20%, FADD 10%.
    loop = [line for line in text.splitlines() if "exec        100" in line]
    assert len(loop) == 1 and "4 instructions" in loop[0] and "90.0%" in loop[0]
    ops = text.splitlines()[text.splitlines().index(loop[0]) + 1]
    assert "opcodes" in ops
    assert "MUFU 60.0 (2)" in ops and "FMNMX 20.0 (1)" in ops and "FADD 10.0 (1)" in ops
    assert ops.index("MUFU") < ops.index("FMNMX") < ops.index("FADD")  # by samples


def test_no_table(tmp_path):
    page = tmp_path / "empty.csv"
    page.write_text("no,table\n")
    out = subprocess.run([sys.executable, str(TOOL), str(page)], capture_output=True, text=True)
    assert out.returncode == 1 and "no source table" in out.stdout
