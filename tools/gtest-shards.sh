#!/usr/bin/env bash
# Runs a GoogleTest command as N processes at once, shard i of N each (GTEST_TOTAL_SHARDS /
# GTEST_SHARD_INDEX: GoogleTest's own split of the selected tests), and prints their outputs one
# after the other, each under a "=== shard i/N" line. Exit status: 0 when every shard passed, else
# the first failing shard's (GoogleTest 1, compute-sanitizer's --error-exitcode, 124 when killed).
#
# Usage: tools/gtest-shards.sh N CMD [ARGS...]
#   tools/gtest-shards.sh 4 build/tests/attnkit_gpu_tests --gtest_filter='*:-*Timing*'
#   tools/gtest-shards.sh 4 compute-sanitizer --tool memcheck build/tests/attnkit_gpu_tests
# Why: the GPU test binary spends most of its time on the host (inputs, the CPU reference, byte
# compares), one core of the GPU machine's 16; the shards' kernels share the GPU by time slices
# (no co-residency is assumed by any kernel). tools/gpu-check.sh uses it where GPU_SHARDS > 1.
# A TERM (gpu-check.sh's step time limit) stops every shard and still prints what they wrote.
set -uo pipefail
n=${1:?usage: tools/gtest-shards.sh N CMD [ARGS...]}
shift
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gtest-shards: N = '$n' must be a positive integer" >&2; exit 2; }
[ $# -ge 1 ] || { echo "gtest-shards: no command" >&2; exit 2; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/gtest-shards.XXXXXX")
pids=()
finish() {
  local rc=$1
  for ((i = 0; i < n; ++i)); do
    echo "=== shard $i/$n (exit ${codes[$i]:-killed})"
    cat "$dir/$i.log" 2>/dev/null
  done
  rm -rf "$dir"
  exit "$rc"
}
codes=()
trap 'kill "${pids[@]}" 2>/dev/null; wait; finish 124' TERM INT
for ((i = 0; i < n; ++i)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$@" >"$dir/$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < n; ++i)); do
  wait "${pids[$i]}"
  codes[$i]=$?
  [ $rc -eq 0 ] && [ "${codes[$i]}" -ne 0 ] && rc=${codes[$i]}
done
finish "$rc"
