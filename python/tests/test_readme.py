"""The README's Python examples run as written (the Python section of README.md once merged
there, else python/README-python.md)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_section():
    readme = ROOT / "README.md"
    if readme.exists():
        text = readme.read_text()
        m = re.search(r"^## Python\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        if m and "```python" in m.group(1):
            return m.group(1)
    own = ROOT / "python" / "README-python.md"
    if not own.exists():
        pytest.skip("no README in this checkout (installed package only)")
    return own.read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", python_section(), re.S)
    assert len(blocks) >= 3, "expected the varlen, FlashInfer and native examples"
    scope = {}
    exec(compile("\n".join(blocks), "README python examples", "exec"), scope)
    out, lse = scope["out"], scope["lse"]
    assert out.shape == (4, 8, 64) and lse.shape == (8, 4)
    assert scope["s"].backend != "reference"
