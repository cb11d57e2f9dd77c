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
# llama.cpp's RPC backend, for --rpc (a target split across machines) and `localspec worker`.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=ON"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev,bench]"

# pip's wheel cache does not know which CMake options built a wheel: one built earlier
# without the RPC backend would be reused. Drop it and build again in that case.
if ! .venv/bin/python -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_rpc() else 1)"; then
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
    echo "llama-cpp-python $version was built without the RPC backend; building it again"
    .venv/bin/python -m pip cache remove 'llama_cpp_python*' > /dev/null 2>&1 || true
    .venv/bin/python -m pip install --quiet --force-reinstall --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version"
fi
.venv/bin/localspec --help > /dev/null
echo "localspec is installed in .venv (activate it with: source .venv/bin/activate)"
