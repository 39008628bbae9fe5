#!/usr/bin/env bash
# Configures and builds attnkit into ${BUILD_DIR:-build}. CUDA kernels are built when nvcc is
# found (ATTNKIT_CUDA=OFF in the environment turns them off); TARGETS limits what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cuda_flag=()
[ "${ATTNKIT_CUDA:-ON}" = OFF ] && cuda_flag=(-DATTNKIT_CUDA=OFF)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}" ${CMAKE_ARGS:-}
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$JOBS" ${TARGETS:+--target $TARGETS}
echo "build: $(( $(date +%s) - start )) s with $JOBS jobs"
