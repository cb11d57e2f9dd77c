#!/usr/bin/env bash
# Create .venv and install localspec with its test tools. Safe to run again: it only
# installs what is missing. llama-cpp-python compiles llama.cpp from source the first time
# (about 6 minutes on 2 cores); pip caches the built wheel for later installs.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# llama.cpp's AMX kernels crash on some virtual machines whose CPUs report AMX; build the
# CPU backend without them (AVX-512 and the other native kernels stay on).
export CFLAGS="${CFLAGS:-} -U__AMX_INT8__"
export CXXFLAGS="${CXXFLAGS:-} -U__AMX_INT8__"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev,bench]"
.venv/bin/localspec --help > /dev/null
echo "localspec is installed in .venv (activate it with: source .venv/bin/activate)"
