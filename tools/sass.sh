#!/usr/bin/env bash
# SASS of one CUDA source of the library without a GPU: compiles it to an sm_90a cubin with the
# build's flags and disassembles it with nvdisasm (from PyPI's nvidia-cuda-nvdisasm wheel,
# fetched once into build/nvdisasm). Prints, for every kernel whose mangled name matches REGEX,
# its registers / spills (ptxas) and its instruction mix; with -s, the whole SASS of the
# matching kernels goes to stdout instead of the mix.
#
# Usage: tools/sass.sh [-s] SOURCE.cu [REGEX]
#   tools/sass.sh src/flash_attn/varlen_hd128_bf16.cu 'Li64ELi3ELi3E.*Fp8FormatE0'   # fp8 e4m3 decode
#   tools/sass.sh -s src/flash_attn/hopper_hd128_bf16.cu | grep -c HGMMA
# Why: ptxas register reuse and spills, predicated dead code (e.g. both fp8 conversions) and the
# copy instructions per tile were all found in SASS; reading it here costs no device time.
set -euo pipefail
cd "$(dirname "$0")/.."
whole=0
if [ "${1:-}" = -s ]; then whole=1; shift; fi
src=${1:?usage: tools/sass.sh [-s] SOURCE.cu [REGEX]}
regex=${2:-.}
tooldir=build/nvdisasm
nvdisasm=$(find "$tooldir" -name nvdisasm -type f 2>/dev/null | head -1 || true)
if [ -z "$nvdisasm" ]; then
  mkdir -p "$tooldir"
  python3 -m pip download -q --no-deps nvidia-cuda-nvdisasm -d "$tooldir" >&2
  python3 -c "import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]).extractall(sys.argv[1])" "$tooldir"
  nvdisasm=$(find "$tooldir" -name nvdisasm -type f | head -1)
  chmod +x "$nvdisasm"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvcc -DATTNKIT_SM90A_BUILT=1 -DATTNKIT_WITH_CUDA=1 -Iinclude -Isrc -Itests -O3 -DNDEBUG -std=c++20 \
  --expt-relaxed-constexpr -arch=sm_90a -cubin -Xptxas -v "$src" -o "$out/k.cubin" 2>"$out/ptxas.txt"
"$nvdisasm" -c "$out/k.cubin" >"$out/k.sass"
python3 - "$out" "$regex" "$whole" <<'EOF'
import collections, re, sys
out, regex, whole = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3] == "1"
# ptxas: "Compiling entry function 'NAME'" ... "Used N registers" / "N bytes spill stores"
info, name = {}, None
for line in open(f"{out}/ptxas.txt"):
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        name = m.group(1)
    m = re.search(r"(\d+) bytes spill stores", line)
    if m and name:
        info.setdefault(name, {})["spill"] = int(m.group(1))
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        info.setdefault(name, {})["regs"] = int(m.group(1))
funcs, cur = {}, None
for line in open(f"{out}/k.sass"):
    m = re.match(r"^\.text\.(\S+):", line)
    if m:
        cur = m.group(1)
        funcs[cur] = []
        continue
    if cur and re.search(r"/\*[0-9a-f]{4,}\*/", line):
        funcs[cur].append(line.rstrip())
for fn, lines in funcs.items():
    if not regex.search(fn):
        continue
    if whole:
        print(f"// {fn}")
        print("\n".join(lines))
        continue
    ops = collections.Counter()
    for l in lines:
        body = re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", l)
        toks = body.split()
        if not toks:
            continue
        op = toks[1] if toks[0].startswith("@") and len(toks) > 1 else toks[0]
        ops[op.split(".")[0]] += 1
    i = info.get(fn, {})
    print(f"{fn}\n  {len(lines)} instructions, {i.get('regs', '?')} registers, {i.get('spill', '?')} bytes spilled")
    print("  " + ", ".join(f"{k} {v}" for k, v in ops.most_common(16)))
EOF
