#!/usr/bin/env bash
# THE script run on a GPU machine: configure + build (CUDA, sm_90a, Release, all cores), the CPU
# tests, the GPU tests, compute-sanitizer memcheck on a reduced GPU-test filter, the Python tests
# (when the package exists), then the benchmark (attnkit_bench + bench/peers.py, merged by
# bench/report.py). Logs and the table go to $OUT when set (else build/gpu-check/). Exits
# non-zero when the build or any test fails, but always runs the benchmark and prints what
# happened: a short table last. With $OUT set (the device tool), the logs beyond the first
# few (summary.txt tests.log table.md guards.md bench.jsonl peers.jsonl) are packed into
# $OUT/rest.tar.gz, since at most 8 files come back.
#
# Environment:
#   SANITIZER_FILTER   gtest filter for memcheck (default '*Sanitizer*:*KvWrite*')
#   GPU_TEST_FILTER    gtest filter for the GPU tests (default '*')
#   GPU_SHARDS         the GPU tests and memcheck as this many GoogleTest shards in parallel
#                      processes (tools/gtest-shards.sh; default 1: one process). The binary is
#                      mostly host work; shards' kernels share the GPU by time slices
#   STEPS              comma list of build,cpu,gpu,sanitizer,demo,python,bench (default: all)
#                      and, on request only, soak: with python, the engine-path soak at
#                      SOAK_BATCHES (default 10000) batches; guards: the bench with and without the device
#                      guards in turns (build-noguards/; $LOG/guards.md), profile: Nsight Compute on one kernel of the bench,
#                      sm80: the GPU tests on a build of compute_80 code (build-sm80/,
#                      compiled for sm_90; SM80_TEST_FILTER, default GPU_TEST_FILTER; T_SM80),
#                      and patches: the bench of the tree with each of PATCHES applied, in turns
#   PATCHES            patches: unified diffs (paths; -R:PATH reverts one, e.g. the diff of the
#                      tree against a commit: the commit), each applied to a copy of the tree in
#                      build-patch-N/ whose bench (sm_90a) runs in turns with the tree's, two
#                      rounds, on BENCH_ARGS / BENCH_MATCH; $LOG/patches.md (tools/bench_ab.py)
#   PROFILE_KERNEL     profile: kernel name regex (default hopper_varlen), matched against the
#                      demangled name with its template arguments where PROFILE_DEMANGLED=1 (e.g.
#                      'HopperTmaFill' for the launches of one K/V fill)
#   PROFILE_MATCH      profile: the bench's --match while profiling (default BENCH_MATCH)
#   PROFILE_LAUNCHES   profile: which launches of it to profile, counted from 0, each N or
#                      REGEX@N (launch N of the kernels matching REGEX; distinct Ns) (default '0 30':
#                      with BENCH_ARGS='--quick --only prefill', 512 x 32 and 1 x 16k); the
#                      per-instruction stall table goes to $LOG/sass<N>.csv, read it with
#                      `python3 tools/ncu_stalls.py $LOG/sass<N>.csv`
#   BENCH_ARGS         extra arguments of attnkit_bench (e.g. --quick; --split-sweep or
#                      --decode-trace DIR for the diagnostics, with PEERS=0)
#   BENCH_MATCH        only the prefill / decode shapes whose key contains this or one of its
#                      |-separated alternatives (attnkit_bench and peers.py --match; e.g.
#                      'd128 h32/32 causal|decode' or 'fp8 b16 kv4096')
#   PEERS              1 (default) runs bench/peers.py; 0 skips it
#   PY_CUDA            ON/OFF: CUDA in the Python extension when it has to be built by pip
#                      (default ON; normally the extension is built with the CMake build above)
#   ATTNKIT_COMMIT     the commit measured (default: git rev-parse HEAD, if a repository)
#   JOBS               build jobs (default: nproc)
#   BUILD_TARGETS      build only these targets (default: all)
#   T_BUILD T_TESTS T_SANITIZER T_PYTHON T_BENCH T_PEERS T_PROFILE   per-step time limits (s)
#                      (GPU tests that run out of time skip the later GPU steps: a hang)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
LOG=${OUT:-$ROOT/build/gpu-check}
mkdir -p "$LOG"
BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-build,cpu,gpu,sanitizer,demo,python,bench}
SANITIZER_FILTER=${SANITIZER_FILTER:-'*Sanitizer*:*KvWrite*'}
GPU_TEST_FILTER=${GPU_TEST_FILTER:-'*'}
GPU_SHARDS=${GPU_SHARDS:-1}
[[ $GPU_SHARDS =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: GPU_SHARDS = '$GPU_SHARDS' must be a positive integer" >&2; exit 2; }
SHARDS=()  # the GPU test steps' command prefix: GoogleTest shards in parallel processes
[ "$GPU_SHARDS" -gt 1 ] && SHARDS=(bash "$ROOT/tools/gtest-shards.sh" "$GPU_SHARDS")
COMMIT=${ATTNKIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1

declare -a SUMMARY=()
FAILED=0
HUNG=""  # set when the GPU tests time out: the later GPU steps are skipped
GTEST_PREFIX=""  # where a GoogleTest built from source was installed (the sm80 build uses it too)
want() { [[ ",$STEPS," == *",$1,"* ]]; }
# step NAME LIMIT LOGFILE CMD...: runs CMD with a time limit, appends to LOGFILE, records status.
step() {
  local name=$1 limit=$2 logfile=$3
  shift 3
  local start rc
  start=$(date +%s)
  echo "=== $name: $*" | tee -a "$logfile"
  timeout --kill-after=10 "$limit" "$@" >>"$logfile" 2>&1
  rc=$?
  local secs=$(( $(date +%s) - start ))
  local status=ok
  [ $rc -ne 0 ] && status="FAILED (rc $rc)"
  [ $rc -eq 124 ] && status="TIMED OUT after ${limit}s"
  SUMMARY+=("$(printf '%-22s %-24s %5ss' "$name" "$status" "$secs")")
  echo "=== $name: $status in ${secs}s" | tee -a "$logfile"
  return $rc
}
# The last pytest summary line of a log, or where the interpreter crashed.
pytest_result() {
  if grep -q "Fatal Python error" "$1"; then
    echo "CRASHED ($(grep -m1 "Fatal Python error" "$1" | cut -c1-60)) in $(grep -m1 -E '^  File .*/tests/' "$1" | sed 's/^ *//' | cut -c1-120)"
  else
    grep -E '[0-9]+ (passed|failed|errors?|skipped)' "$1" | tail -1
  fi
}
# Counts lines like gtest's "[  FAILED  ] Suite.Test" into the summary line of a step.
gtest_counts() {
  local logfile=$1
  local passed failed
  passed=$(grep -c '^\[       OK \]' "$logfile" 2>/dev/null)
  failed=$(grep -c '^\[  FAILED  \] .*(.* ms)$' "$logfile" 2>/dev/null)
  echo "passed ${passed:-0}, failed ${failed:-0}"
}

echo "gpu-check: commit $COMMIT, $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
echo "gpu-check: logs in $LOG"

# ---- build ----------------------------------------------------------------------------------
BUILD_OK=1
if want build; then
  need_tests=0 tests_flag=OFF bench_flag=OFF
  if want cpu || want gpu || want sanitizer; then need_tests=1 tests_flag=ON; fi
  if want bench || want profile || want patches; then bench_flag=ON; fi
  cmake_args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=ON
              "-DATTNKIT_TESTS=$tests_flag" "-DATTNKIT_BENCH=$bench_flag"
              -DCMAKE_CUDA_ARCHITECTURES=90a
              # CMake releases that predate nvcc's C++20 flag: tell them the flag.
              -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
              -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
  # GoogleTest: the system's, else built from a source tree (Debian's googletest package
  # installs one at /usr/src/googletest; a copy may travel in .deps/googletest).
  if [ $need_tests = 1 ] && ! ls /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h >/dev/null 2>&1 &&
     ! ls /usr/lib/*/cmake/GTest /usr/local/lib/cmake/GTest >/dev/null 2>&1; then
    for src in "${GTEST_SRC:-}" "$ROOT/.deps/googletest" /usr/src/googletest; do
      [ -n "$src" ] && [ -f "$src/CMakeLists.txt" ] || continue
      step gtest 300 "$LOG/build.log" bash -c "cmake -S '$src' -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest -DBUILD_GMOCK=OFF && cmake --build /tmp/gtest-build -j $JOBS && cmake --install /tmp/gtest-build"
      cmake_args+=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
      GTEST_PREFIX=/tmp/gtest
      break
    done
  fi
  # The Python extension joins this build (it reuses the library instead of compiling it again
  # the way `pip install .` would); if its configuration fails, the rest is built without it.
  if want python && [ -f pyproject.toml ] && [ -d python/attnkit ]; then
    if ! step configure+python "${T_BUILD:-420}" "$LOG/build.log" cmake "${cmake_args[@]}" -DATTNKIT_PYTHON=ON \
         -DPython_EXECUTABLE="$(command -v python3)"; then
      FAILED=1
      step configure "${T_BUILD:-420}" "$LOG/build.log" cmake "${cmake_args[@]}" -DATTNKIT_PYTHON=OFF || BUILD_OK=0
    fi
  else
    step configure "${T_BUILD:-420}" "$LOG/build.log" cmake "${cmake_args[@]}" || BUILD_OK=0
  fi
  if [ $BUILD_OK = 1 ]; then
    # shellcheck disable=SC2086
    step build "${T_BUILD:-420}" "$LOG/build.log" cmake --build "$BUILD" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS} || BUILD_OK=0
  fi
  [ $BUILD_OK = 1 ] || { FAILED=1; tail -40 "$LOG/build.log"; }
fi

# ---- tests ----------------------------------------------------------------------------------
if want cpu; then
  if [ -x "$BUILD/tests/attnkit_tests" ]; then
    step cpu-tests "${T_TESTS:-300}" "$LOG/tests.log" "$BUILD/tests/attnkit_tests" || FAILED=1
    SUMMARY+=("  cpu-tests: $(gtest_counts "$LOG/tests.log")")
  else
    SUMMARY+=("cpu-tests              NOT BUILT"); FAILED=1
  fi
fi
if want gpu; then
  if [ -x "$BUILD/tests/attnkit_gpu_tests" ]; then
    : >"$LOG/gpu.tmp"
    step gpu-tests "${T_TESTS:-300}" "$LOG/gpu.tmp" "${SHARDS[@]}" "$BUILD/tests/attnkit_gpu_tests" --gtest_filter="$GPU_TEST_FILTER"
    rc=$?
    [ $rc -ne 0 ] && FAILED=1
    # A GPU test that runs out of time is most likely a kernel that hangs: the steps after it
    # would hang on the same kernel and spend the device time for nothing.
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      HUNG="gpu-tests ran out of time (last test started$([ "$GPU_SHARDS" -gt 1 ] && echo " by each shard"): $(grep -hE '^(\[ RUN|=== shard)' "$LOG/gpu.tmp" | awk '/^===/ {if (r != "") print r; r=""; next} {r=substr($0, 14)} END {print r}' | tr '\n' ' '))"
    fi
    SUMMARY+=("  gpu-tests: $(gtest_counts "$LOG/gpu.tmp")")
    # (the guards' fuzz counts; on a two-GPU machine the DCP combine's times: DcpTwoGpus)
    while IFS= read -r line; do SUMMARY+=("  $line"); done < <(grep -hE '^\[ (DeviceGuards|dcp-bench)' "$LOG/gpu.tmp")
    grep '^\[  FAILED  \]' "$LOG/gpu.tmp" | head -20
    cat "$LOG/gpu.tmp" >>"$LOG/tests.log"; rm -f "$LOG/gpu.tmp"
  else
    SUMMARY+=("gpu-tests              NOT BUILT"); FAILED=1
  fi
fi
# On request: the GPU tests once more on a build of compute_80 code, compiled ahead of time for
# this device (-gencode arch=compute_80,code=sm_90: what the driver's JIT makes of a 80-virtual
# build: at load, measured, no test had ended after 120 s), reported as 80-virtual: the sm80 code path
# (mma_sync generation, cp.async fills, no TMA / clusters / PDL: core/cuda_archs.h cuda_code_cc)
# on the H200.
if [[ ",$STEPS," == *",sm80,"* ]] && [ -z "$HUNG" ]; then
  if step configure-sm80 "${T_BUILD:-420}" "$LOG/build.log" cmake -S . -B build-sm80 -G Ninja \
       -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=ON -DATTNKIT_TESTS=ON -DATTNKIT_BENCH=OFF \
       -DCMAKE_CUDA_ARCHITECTURES=OFF -DCMAKE_CUDA_FLAGS=-gencode=arch=compute_80,code=sm_90 \
       -DATTNKIT_CUDA_ARCHS=80-virtual -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
       -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 ${GTEST_PREFIX:+-DCMAKE_PREFIX_PATH=$GTEST_PREFIX} &&
     step build-sm80 "${T_BUILD:-420}" "$LOG/build.log" cmake --build build-sm80 -j "$JOBS" --target attnkit_gpu_tests; then
    : >"$LOG/sm80.tmp"
    step gpu-tests-sm80 "${T_SM80:-600}" "$LOG/sm80.tmp" build-sm80/tests/attnkit_gpu_tests \
      --gtest_filter="${SM80_TEST_FILTER:-$GPU_TEST_FILTER}" || FAILED=1
    SUMMARY+=("  gpu-tests-sm80 (compute_80 code): $(gtest_counts "$LOG/sm80.tmp")")
    grep '^\[  FAILED  \]' "$LOG/sm80.tmp" | head -20
    cat "$LOG/sm80.tmp" >>"$LOG/tests.log"; rm -f "$LOG/sm80.tmp"
  else
    FAILED=1
  fi
fi
if [ -n "$HUNG" ]; then
  SUMMARY+=("memcheck, python, demo, bench SKIPPED: $HUNG")
  STEPS=build,cpu,gpu
fi
if want sanitizer; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
              /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [ -x "$BUILD/tests/attnkit_gpu_tests" ] && [ -n "$SANITIZER" ]; then
    : >"$LOG/san.tmp"
    step memcheck "${T_SANITIZER:-240}" "$LOG/san.tmp" "${SHARDS[@]}" "$SANITIZER" --tool memcheck --error-exitcode 99 \
      --print-limit 20 "$BUILD/tests/attnkit_gpu_tests" --gtest_filter="$SANITIZER_FILTER" || FAILED=1
    # (one ERROR SUMMARY per process, GPU_SHARDS of them; a process without one did not finish)
    SUMMARY+=("  memcheck ($SANITIZER_FILTER): $(grep -hoE 'ERROR SUMMARY: [0-9]+' "$LOG/san.tmp" |
      awk -v want="$GPU_SHARDS" '{n++; e+=$3} END {printf "========= ERROR SUMMARY: %d errors", e;
        if (n < want) printf " (NO SUMMARY from %d of %d processes: they did not finish)", want - n, want;
        else if (want > 1) printf " (%d processes)", want}')")
    cat "$LOG/san.tmp" >>"$LOG/tests.log"; rm -f "$LOG/san.tmp"
  else
    SUMMARY+=("memcheck               SKIPPED (no test binary or no compute-sanitizer)")
  fi
fi
if want python; then
  ext=$(ls "$BUILD"/python/_attnkit*.so 2>/dev/null | head -1)
  if [ -f pyproject.toml ] && [ -d python/tests ] && [ -n "$ext" ]; then
    # The package as installed: python/attnkit/*.py next to the extension built above.
    rm -rf /tmp/attnkit-py && mkdir -p /tmp/attnkit-py && cp -r python/attnkit /tmp/attnkit-py/ &&
      cp "$ext" /tmp/attnkit-py/attnkit/
    export PYTHONPATH=/tmp/attnkit-py${PYTHONPATH:+:$PYTHONPATH}
    # The tests that import PyTorch run in their own process, so a crash there (or one caused
    # by PyTorch being loaded) does not hide the results of the others.
    torch_tests=$(grep -l "importorskip(\"torch\")\|^import torch" python/tests/test_*.py 2>/dev/null)
    ignore=()
    for f in $torch_tests; do ignore+=(--ignore="$f"); done
    : >"$LOG/py.tmp"
    step pytest "${T_PYTHON:-300}" "$LOG/py.tmp" python3 -m pytest -q -p no:cacheprovider python/tests "${ignore[@]}" || FAILED=1
    SUMMARY+=("  pytest: $(pytest_result "$LOG/py.tmp")")
    cat "$LOG/py.tmp" >>"$LOG/tests.log"
    if [ -n "$torch_tests" ]; then
      : >"$LOG/py.tmp"
      # shellcheck disable=SC2086
      step pytest-torch "${T_PYTHON:-300}" "$LOG/py.tmp" python3 -m pytest -q -p no:cacheprovider $torch_tests || FAILED=1
      SUMMARY+=("  pytest-torch: $(pytest_result "$LOG/py.tmp")")
      cat "$LOG/py.tmp" >>"$LOG/tests.log"
    fi
    rm -f "$LOG/py.tmp"
    # On request: the soak (python/tests/test_gpu.py test_cuda_soak_engine_path) at SOAK_BATCHES
    # random mixed batches (default 10,000; the pytest run above does 300).
    if [[ ",$STEPS," == *",soak,"* ]]; then
      : >"$LOG/py.tmp"
      step soak "${T_SOAK:-600}" "$LOG/py.tmp" env ATTNKIT_SOAK="${SOAK_BATCHES:-10000}" python3 -m pytest -q -s \
        -p no:cacheprovider python/tests/test_gpu.py -k soak || FAILED=1
      SUMMARY+=("  soak: $(grep -E '^soak:' "$LOG/py.tmp" | tail -1) $(pytest_result "$LOG/py.tmp")")
      cat "$LOG/py.tmp" >>"$LOG/tests.log"; rm -f "$LOG/py.tmp"
    fi
  elif [ -f pyproject.toml ] && [ -d python/tests ]; then
    step python-build "${T_PYTHON:-420}" "$LOG/tests.log" python3 -m pip install -q --disable-pip-version-check \
      --no-build-isolation --no-deps -C cmake.define.ATTNKIT_CUDA="${PY_CUDA:-ON}" \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a . || FAILED=1
    step pytest "${T_PYTHON:-420}" "$LOG/tests.log" python3 -m pytest -q -p no:cacheprovider python/tests || FAILED=1
  else
    SUMMARY+=("python                 SKIPPED (no pyproject.toml + python/tests in this tree)")
  fi
fi

# ---- the main job on the GPU: the demo through the selector and the chosen GPU backend ---------
if want demo && [ -x "$BUILD/attnkit" ]; then
  step demo "${T_DEMO:-120}" "$LOG/demo.log" "$BUILD/attnkit" demo --steps 12 || FAILED=1
  SUMMARY+=("  demo: $(grep -m1 '^backend:' "$LOG/demo.log" | cut -c1-90) | $(grep '^done:' "$LOG/demo.log" | tail -1)")
fi

# ---- benchmark (always, even after failures) ---------------------------------------------------
if want bench; then
  if [ -x "$BUILD/bench/attnkit_bench" ]; then
    # shellcheck disable=SC2086
    step attnkit_bench "${T_BENCH:-240}" "$LOG/bench.log" "$BUILD/bench/attnkit_bench" --json "$LOG/bench.jsonl" ${BENCH_ARGS:-} \
      ${BENCH_MATCH:+--match "$BENCH_MATCH"}
  else
    SUMMARY+=("attnkit_bench          NOT BUILT")
  fi
  peer_args=()
  [[ " ${BENCH_ARGS:-} " == *" --quick "* ]] && peer_args=(--quick)
  [ -n "${BENCH_MATCH:-}" ] && peer_args+=(--match "$BENCH_MATCH")
  [ "${PEERS:-1}" = 1 ] && step peers "${T_PEERS:-180}" "$LOG/bench.log" python3 bench/peers.py --json "$LOG/peers.jsonl" "${peer_args[@]}"
  if [ -s "$LOG/bench.jsonl" ] || [ -s "$LOG/peers.jsonl" ]; then
    python3 bench/report.py "$LOG/bench.jsonl" "$LOG/peers.jsonl" --commit "$COMMIT" --out "$LOG/table.md" >/dev/null
    echo; echo "---- benchmark table (also $LOG/table.md) ----"
    sed -n '/^| section/,/^$/p' "$LOG/table.md"
  fi
fi

# bench_in_turns NAME BIN...: the bench binaries run twice, in turns (the card drifts along a run),
# on BENCH_ARGS / BENCH_MATCH, into $LOG/NAME<i>-<turn>.jsonl (i: the binary's position); then
# ab_of NAME I J: tools/bench_ab.py of binary I's runs (A) against binary J's (B).
bench_in_turns() {
  local name=$1 turn i
  shift
  local bins=("$@")
  for turn in 1 2; do
    for i in "${!bins[@]}"; do
      # shellcheck disable=SC2086
      step "bench $name$i, turn $turn" "${T_BENCH:-240}" "$LOG/$name.log" "${bins[$i]}" --json "$LOG/$name$i-$turn.jsonl" \
        ${BENCH_ARGS:-} ${BENCH_MATCH:+--match "$BENCH_MATCH"}
    done
  done
}
ab_of() { python3 tools/bench_ab.py "$LOG/$1$2-1.jsonl,$LOG/$1$2-2.jsonl" "$LOG/$1$3-1.jsonl,$LOG/$1$3-2.jsonl"; }

# ---- on request: the cost of the device-side guards (src/cuda/metadata_guard.cuh) ------------------
# A second bench built with -DATTNKIT_DEVICE_GUARDS=OFF (build-noguards/), both run twice in turns
# on BENCH_ARGS / BENCH_MATCH; tools/bench_ab.py prints each row's cost (issue 22: at most 1%).
if [[ ",$STEPS," == *",guards,"* ]] && [ -x "$BUILD/bench/attnkit_bench" ]; then
  if step configure-noguards "${T_BUILD:-420}" "$LOG/build.log" cmake -S . -B build-noguards -G Ninja \
       -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=ON -DATTNKIT_TESTS=OFF -DATTNKIT_BENCH=ON -DATTNKIT_DEVICE_GUARDS=OFF \
       -DATTNKIT_CUDA_ARCHS=90a -DCMAKE_CUDA_ARCHITECTURES=90a &&
     step build-noguards "${T_BUILD:-420}" "$LOG/build.log" cmake --build build-noguards -j "$JOBS" --target attnkit_bench; then
    bench_in_turns guards build-noguards/bench/attnkit_bench "$BUILD/bench/attnkit_bench"
    ab_of guards 0 1 >"$LOG/guards.md" 2>&1
    SUMMARY+=("  guards cost: $(tail -1 "$LOG/guards.md")")
  else
    FAILED=1
  fi
fi

# ---- on request: patched copies of the tree in turns with it (PATCHES) ------------------------------
# How a kernel change is measured against the code without it: same machine, same run, in turns
# (the card drifts by a few percent along a run).
if [[ ",$STEPS," == *",patches,"* ]] && [ -x "$BUILD/bench/attnkit_bench" ]; then
  n=0
  bins=("$BUILD/bench/attnkit_bench") specs=(tree)
  for spec in ${PATCHES:-}; do
    n=$((n + 1))
    rev=""; file=$spec
    [[ $spec == -R:* ]] && { rev=-R; file=${spec#-R:}; }
    dir=build-patch-$n
    rm -rf "$dir" && mkdir -p "$dir/tree"
    git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dir/tree" 2>/dev/null
    if step "patch $n ($spec)" 60 "$LOG/build.log" patch $rev -p1 -s -d "$dir/tree" -i "$ROOT/$file" &&
       step "configure patch $n" "${T_BUILD:-420}" "$LOG/build.log" cmake -S "$dir/tree" -B "$dir/build" -G Ninja \
         -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=ON -DATTNKIT_TESTS=OFF -DATTNKIT_BENCH=ON \
         -DATTNKIT_CUDA_ARCHS=90a -DCMAKE_CUDA_ARCHITECTURES=90a &&
       step "build patch $n" "${T_BUILD:-420}" "$LOG/build.log" cmake --build "$dir/build" -j "$JOBS" --target attnkit_bench; then
      bins+=("$dir/build/bench/attnkit_bench") specs+=("$spec")
    else
      FAILED=1
    fi
  done
  bench_in_turns variant "${bins[@]}"
  : >"$LOG/patches.md"
  for ((i = 1; i < ${#bins[@]}; ++i)); do
    { echo "## variant $i: ${specs[$i]} (A = the tree, B = the patched copy; B / A - 1 of the time)"
      ab_of variant 0 "$i"
      echo; } >>"$LOG/patches.md" 2>&1
    SUMMARY+=("  variant $i (${specs[$i]}): $(tail -2 "$LOG/patches.md" | head -1)")
  done
fi

# ---- on request: Nsight Compute source-level profile of one kernel of the bench -------------------
if [[ ",$STEPS," == *",profile,"* ]] && [ -x "$BUILD/bench/attnkit_bench" ] && command -v ncu >/dev/null; then
  PROFILE_MATCH=${PROFILE_MATCH:-${BENCH_MATCH:-}}
  for entry in ${PROFILE_LAUNCHES:-0 30}; do
    # (an entry REGEX@N: launch N of the kernels matching REGEX instead of PROFILE_KERNEL)
    if [[ "$entry" == *@* ]]; then kre=${entry%@*}; n=${entry##*@}; else kre=${PROFILE_KERNEL:-hopper_varlen}; n=$entry; fi
    # shellcheck disable=SC2086
    step "profile launch $entry" "${T_PROFILE:-180}" "$LOG/profile$n.txt" ncu -k "regex:$kre" \
      ${PROFILE_DEMANGLED:+--kernel-name-base demangled} \
      --launch-skip "$n" --launch-count 1 --section SourceCounters --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section LaunchStats --section Occupancy --import-source no --export "$LOG/p$n" \
      "$BUILD/bench/attnkit_bench" ${BENCH_ARGS:-} ${PROFILE_MATCH:+--match "$PROFILE_MATCH"} || FAILED=1
    if [ -f "$LOG/p$n.ncu-rep" ]; then
      ncu -i "$LOG/p$n.ncu-rep" --page source --csv --print-source sass >"$LOG/sass$n.csv" 2>&1
      ncu -i "$LOG/p$n.ncu-rep" --page details >>"$LOG/profile$n.txt" 2>&1
      rm -f "$LOG/p$n.ncu-rep"
      SUMMARY+=("  profile launch $n: $(grep -E 'Duration' "$LOG/profile$n.txt" | head -1 | tr -s ' ')")
    fi
  done
fi

# ---- the short table, last -----------------------------------------------------------------------
{
  echo
  echo "==== gpu-check summary (commit $COMMIT) ===="
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  if [ -s "$LOG/table.md" ]; then
    echo "shape | unit | attnkit | FLASH | cuDNN | ours/FLASH | ours/cuDNN | % read BW | x bf16"
    grep -E '^\| (ceiling|kv_write|merge) |^\| prefill \| prefill d128 h32/8 causal |^\| decode \| decode (bf16|fp8) b(1|16|256) kv(4096|32768) ' \
      "$LOG/table.md" | cut -d'|' -f3-11
    # (issue 20's table: each shape group's geomean of ours / cuDNN)
    sed -n '/^Prefill, ours/,/^Targets/p' "$LOG/table.md" | awk -F'|' '$2 ~ /^ d[0-9]/ {gsub(/^ +| +$/, "", $2);
      gsub(/ /, "", $9); out = out (out ? "; " : "") $2 " " $9} END {if (out) print "prefill ours/cuDNN geomeans: " out}'
    sed -n '/^Targets/,$p' "$LOG/table.md"
  fi
  [ $FAILED = 0 ] && echo "RESULT: no failures in the steps run ($STEPS)" || echo "RESULT: FAILURES (see $LOG/tests.log, $LOG/build.log)"
} | tee "$LOG/summary.txt"
# The device tool brings back at most 8 files from $OUT: the ones read first stay as they are,
# every other log goes into one archive (rest.tar.gz).
if [ -n "${OUT:-}" ]; then
  keep=" summary.txt tests.log table.md guards.md bench.jsonl peers.jsonl rest.tar.gz "
  rest=()
  for f in "$LOG"/*; do
    [ -f "$f" ] || continue
    [[ "$keep" == *" $(basename "$f") "* ]] || rest+=("$(basename "$f")")
  done
  if [ ${#rest[@]} -gt 0 ] && tar -czf "$LOG/rest.tar.gz" -C "$LOG" "${rest[@]}"; then
    (cd "$LOG" && rm -f "${rest[@]}")
  fi
fi
exit $FAILED
