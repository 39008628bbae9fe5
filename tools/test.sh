#!/usr/bin/env bash
# README's second command: install what is missing, build everything (the CUDA kernels too when
# nvcc is present: a compile check on machines without a GPU), run the C++ tests through CTest
# and the Python tests through pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}"
if [ -f pyproject.toml ]; then
  # The extension is built CPU-only here: its CUDA path is the library compiled above.
  python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
    -C cmake.define.ATTNKIT_CUDA=OFF .
  set +e
  python3 -m pytest -q python/tests
  rc=$?
  set -e
  [ $rc -eq 5 ] && { echo "pytest collected no tests"; rc=1; }
  exit $rc
fi
