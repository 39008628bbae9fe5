#!/usr/bin/env bash
# README's first command: install what is missing, build, run the demo (the CPU reference
# backend on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ATTNKIT_SKIP_PYTHON=1 bash tools/setup-deps.sh
TARGETS=attnkit_cli bash tools/build.sh
./"${BUILD_DIR:-build}"/attnkit demo "$@"
