#!/usr/bin/env bash
# Build llama.cpp's llama-speculative-simple, llama-bench, llama-simple and llama-server from
# the llama-cpp-python sdist that localspec uses, so `localspec bench --native-bin` compares
# against the same llama.cpp sources (its native-bench mode runs the llama-bench beside
# llama-speculative-simple; llama-simple is the leanest one-shot run, llama-server the
# server to set beside `localspec serve`).
#
#   scripts/build_native.sh DIR      # DIR/build/bin/llama-speculative-simple and llama-bench
#
# Needs cmake and a C++ compiler; takes several minutes on 2 cores. Nothing is written
# outside DIR. VERSION (default 0.3.36) picks another llama-cpp-python release.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$(mkdir -p "$1" && cd "$1" && pwd)
VERSION=${VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

for tool in cmake c++; do
    if ! command -v "$tool" > /dev/null; then
        echo "error: $tool is not installed (e.g. apt-get install cmake g++)" >&2
        exit 1
    fi
done

SRC="$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
        -d "$DIR/sdist" "llama-cpp-python==$VERSION"
    tar -xzf "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
fi

# llama.cpp's AMX kernels crash on some virtual machines whose CPUs report AMX: build the
# CPU backend without them, as scripts/setup.sh does for llama-cpp-python.
cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__
cmake --build "$DIR/build" --target llama-speculative-simple llama-bench llama-simple llama-server llama-completion -j"$JOBS"

BIN="$DIR/build/bin/llama-speculative-simple"
BENCH="$DIR/build/bin/llama-bench"
"$BIN" --help > /dev/null
"$BENCH" --help > /dev/null
echo "built $BIN"
echo "  and $BENCH"
echo "use them with: localspec bench --native-bin $BIN"
echo "(its native-bench mode runs the llama-bench beside llama-speculative-simple)"
