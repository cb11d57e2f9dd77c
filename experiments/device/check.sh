#!/usr/bin/env bash
# The device check: localspec on a GPU beside llama.cpp's own tools, in one run.
#
#   bash experiments/device/check.sh prepare   # here: the carry folder .device/ (under 64 MiB)
#   bash experiments/device/check.sh cuda      # on the GPU machine: build, make models, measure
#   bash experiments/device/check.sh cpu       # the same run on this CPU, with small models
#
# prepare needs the real default pair (MODELS, default $LOCALSPEC_TEST_HOME/models or
# .test-cache/models) and pip (the llama-cpp-python sdist from its cache; SDIST=FILE gives
# it). cuda and cpu need only the carry folder, this checkout, cmake, a C++ compiler (and
# nvcc for cuda) and Python 3 with numpy and jinja2: one cmake build of llama.cpp as shared
# libraries for this one backend (CUDA_ARCH, default 90: H100 and H200), with llama-bench,
# llama-speculative-simple and llama-quantize from the same build; localspec's
# bindings load that build's libllama (LLAMA_CPP_LIB_PATH), so nothing is compiled twice.
# Models of the real shapes with random weights are made from the carried metadata
# (experiments/device/shapes.py), then experiments/device/check.py measures and writes
# device_check.json and device_check.md under OUT (default .device/out-MODE). DEPTH, TOKENS
# and THREADS change the prompt's length, the tokens decoded and the threads (all cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
DEVICE=${DEVICE_DIR:-.device}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2> /dev/null || echo 2)}
started=$(date +%s)

say() { echo "[$(($(date +%s) - started)) s] $*"; }

case "$MODE" in
    prepare)
        models=${MODELS:-${LOCALSPEC_TEST_HOME:-.test-cache}/models}
        exec "$PY" experiments/device/carry.py --out "$DEVICE" --models "$models" \
            ${SDIST:+--sdist "$SDIST"}
        ;;
    cuda)
        backend=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}"
            -DGGML_CUDA_FA_ALL_QUANTS=OFF)
        ;;
    cpu)
        backend=(-DGGML_CUDA=OFF)
        ;;
    *)
        echo "usage: $0 prepare|cuda|cpu" >&2
        exit 2
        ;;
esac
if [ ! -f "$DEVICE/llama.cpp/CMakeLists.txt" ]; then
    echo "error: no carry folder at $DEVICE: run '$0 prepare' first" >&2
    exit 1
fi
OUT=${OUT:-$DEVICE/out-$MODE}
if [ "$MODE" = cpu ]; then  # small models on a small CPU: a shorter run of the same steps
    DEPTH=${DEPTH:-256}
    TOKENS=${TOKENS:-64}
fi
BUILD=$DEVICE/build-$MODE
WORK=${WORK:-$DEVICE/models-$MODE}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
mkdir -p "$OUT"
# The build's logs go with the results, whatever happens.
trap 'cp "$DEVICE"/cmake-"$MODE".log "$DEVICE"/build-"$MODE".log "$OUT"/ 2> /dev/null || true' EXIT

# What this Python lacks of localspec's and gguf's imports comes from the carried wheels,
# checked before the build so that a missing one costs seconds, not a build.
SITE=$DEVICE/site-$MODE
NEEDS="numpy, jinja2, pydantic, gguf, diskcache, filelock, platformdirs"
if ! "$PY" -c "import $NEEDS" 2> /dev/null; then
    say "unpacking the carried wheels"
    "$PY" - "$DEVICE/wheels" "$SITE" << 'EOF'
import sys, zipfile, pathlib
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
EOF
fi
export PYTHONPATH="$PWD:$PWD/$DEVICE/bindings:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import $NEEDS" || { echo "error: $PY cannot import all of: $NEEDS" >&2; exit 1; }

say "configuring llama.cpp ($MODE)"
# The AMX flags as scripts/setup.sh sets them: llama.cpp's AMX kernels crash on some
# virtual machines whose CPUs report AMX.
cmake -S "$DEVICE/llama.cpp" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_RPC=OFF \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__ \
    "${backend[@]}" > "$DEVICE/cmake-$MODE.log"
say "building"
cmake --build "$BUILD" -j"$JOBS" --target llama llama-bench llama-speculative-simple \
    llama-quantize > "$DEVICE/build-$MODE.log"
BIN=$(cd "$BUILD/bin" && pwd)
ls "$BIN"/llama-bench "$BIN"/llama-speculative-simple "$BIN"/llama-quantize \
    "$BIN"/libllama.* > /dev/null

export LLAMA_CPP_LIB_PATH=$BIN
"$PY" -c "import llama_cpp, localspec.backend.device_greedy; print('bindings on', llama_cpp.llama_cpp._lib._name)"

say "measuring"
"$PY" experiments/device/check.py --mode "$MODE" --bin "$BIN" --shapes "$DEVICE/shapes" \
    --work "$WORK" --out "$OUT" ${DEPTH:+--depth "$DEPTH"} ${TOKENS:+--tokens "$TOKENS"} \
    ${THREADS:+--threads "$THREADS"}
rm -rf "$WORK"
say "done: $OUT/device_check.json and device_check.md"
