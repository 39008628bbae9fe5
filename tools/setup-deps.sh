#!/usr/bin/env bash
# Installs what attnkit's build and tests need, by package name, only where it is missing.
# Debian packages: cmake, ninja, g++, GoogleTest. PyPI: the Python build/test tools.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
if [ "${ATTNKIT_SKIP_PYTHON:-0}" != 1 ] && [ -f pyproject.toml ]; then
  python3 -m pip install -q --disable-pip-version-check -r python/requirements-dev.txt
fi
