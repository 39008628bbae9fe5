"""The package as shipped: the extension links no PyTorch library and imports no framework (one
build serves every PyTorch version), and `python -m attnkit demo` runs the CLI's demo."""

import os
import struct
import subprocess
import sys

import attnkit
from attnkit import _attnkit


def elf_needed(path):
    """DT_NEEDED entries of a 64-bit little-endian ELF shared object (read directly, so the
    test needs neither readelf nor ldd)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        sh_type, = struct.unpack_from("<I", data, off + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, off + 0x18)
        sh_link, = struct.unpack_from("<I", data, off + 0x28)
        sections.append((sh_type, sh_offset, sh_size, sh_link))
    SHT_DYNAMIC, DT_NEEDED = 6, 1
    needed = []
    for sh_type, off, size, link in sections:
        if sh_type != SHT_DYNAMIC:
            continue
        strtab_off = sections[link][1]
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                end = data.index(b"\0", strtab_off + val)
                needed.append(data[strtab_off + val:end].decode())
    return needed


def test_extension_links_no_pytorch():
    needed = elf_needed(_attnkit.__file__)
    assert any(n.startswith("libc.so") for n in needed), f"ELF parse found no libc in {needed}"
    framework_libs = [n for n in needed if any(t in n for t in ("torch", "c10", "python", "cupy", "jax"))]
    assert not framework_libs, f"the extension must not link {framework_libs}"


def run_python(code):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_import_and_cpu_call_import_no_framework():
    code = (
        "import sys, numpy as np, attnkit\n"
        "q = np.ones((1, 2, 16), np.float32)\n"
        "c = np.ones((1, 2, 16, 1, 16), np.float32)\n"
        "attnkit.flash_attn_varlen_func(q, c[:, 0], c[:, 1], 1, np.array([0, 1], np.int32), 3,\n"
        "    seqused_k=np.array([3], np.int32), block_table=np.zeros((1, 1), np.int32), causal=True)\n"
        "bad = [m for m in ('torch', 'cupy', 'jax') if m in sys.modules]\n"
        "print('imported:', bad)\n"
        "sys.exit(1 if bad else 0)\n")
    r = run_python(code)
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_m_attnkit_demo_runs_the_cli_demo():
    r = subprocess.run([sys.executable, "-m", "attnkit", "demo", "--steps", "2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "attnkit demo" in r.stdout and "done: 2 steps" in r.stdout, r.stdout


def test_python_m_attnkit_lists_commands_and_reports_bad_flags():
    r = subprocess.run([sys.executable, "-m", "attnkit", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "demo" in r.stdout
    r = subprocess.run([sys.executable, "-m", "attnkit", "demo", "--steps", "zero"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    r = subprocess.run([sys.executable, "-m", "attnkit", "nosuch"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_public_names():
    for name in attnkit.__all__:
        assert hasattr(attnkit, name), name
