#!/usr/bin/env bash
# Create .venv and install localspec with its test tools, with llama.cpp built for the GPU
# this machine can use. Safe to run again: it only installs what is missing.
# llama-cpp-python compiles llama.cpp from source the first time (about 6 minutes on
# 2 cores for the CPU, longer with a GPU backend); pip caches the built wheel.
#
# The backend: CUDA when nvcc (on PATH, $CUDACXX, or $CUDA_HOME/bin, default
# /usr/local/cuda) and an NVIDIA driver are found; Metal on macOS (llama.cpp's default
# there); else the CPU. LOCALSPEC_BACKEND=cpu|cuda|vulkan|metal chooses. llama.cpp's RPC
# backend is built in every case. LOCALSPEC_SETUP_DRY_RUN=1 prints the choice and the CMake
# options and stops there: no venv, nothing installed.
#
# Runs under macOS's bash 3.2 too.
set -euo pipefail
case $0 in
    */*) cd "${0%/*}/.." ;;
    *) cd .. ;; # bash setup.sh, from scripts/
esac

say() { printf '%s\n' "$*"; }
die() {  # die STATUS MESSAGE...
    local status=$1
    shift
    printf 'scripts/setup.sh: %s\n' "$*" >&2
    exit "$status"
}

# --- which backend ---------------------------------------------------------------------

NVIDIA_DRIVER_FILE=${LOCALSPEC_NVIDIA_DRIVER_FILE:-/proc/driver/nvidia/version} # tests move it
CUDA_HOME_DIR=${CUDA_HOME:-/usr/local/cuda}

NVCC=""
NVCC_VERSION=""
find_nvcc() {
    if [ -n "${CUDACXX:-}" ] && [ -x "$CUDACXX" ]; then
        NVCC=$CUDACXX
    elif command -v nvcc > /dev/null 2>&1; then
        NVCC=$(command -v nvcc)
    elif [ -x "$CUDA_HOME_DIR/bin/nvcc" ]; then
        NVCC=$CUDA_HOME_DIR/bin/nvcc
    else
        return 1
    fi
    local out re='release ([0-9]+\.[0-9]+)'
    out=$("$NVCC" --version 2> /dev/null || true)
    if [[ $out =~ $re ]]; then
        NVCC_VERSION=${BASH_REMATCH[1]}
    else
        NVCC_VERSION="(version unknown)"
    fi
}

nvidia_driver() {
    { command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; } ||
        [ -e "$NVIDIA_DRIVER_FILE" ]
}

# Sets BACKEND (cpu, cuda, vulkan, metal), WHY (the line to print) and GPU_ARGS.
choose_backend() {
    local os requested=${LOCALSPEC_BACKEND:-}
    os=$(uname -s)
    GPU_ARGS=""
    case $requested in
        "" | cpu | cuda | vulkan | metal) ;;
        *) die 2 "LOCALSPEC_BACKEND=$requested is not a backend: choose cpu, cuda, vulkan or metal" ;;
    esac
    if [ -z "$requested" ]; then
        if [ "$os" = Darwin ]; then
            BACKEND=metal
            WHY="building llama.cpp for Metal (macOS: llama.cpp's default; LOCALSPEC_BACKEND=cpu|vulkan to choose)"
        elif find_nvcc && nvidia_driver; then
            BACKEND=cuda
            WHY="building llama.cpp for CUDA (nvcc $NVCC_VERSION and an NVIDIA driver found)"
            GPU_ARGS="-DGGML_CUDA=ON"
        elif [ -n "$NVCC" ]; then
            BACKEND=cpu
            WHY="building llama.cpp for the CPU (nvcc $NVCC_VERSION found but no NVIDIA driver; LOCALSPEC_BACKEND=cuda|vulkan to choose)"
        elif nvidia_driver; then
            BACKEND=cpu
            WHY="building llama.cpp for the CPU (an NVIDIA driver but no nvcc found: install the CUDA toolkit to build for CUDA; LOCALSPEC_BACKEND=cuda|vulkan to choose)"
        else
            BACKEND=cpu
            WHY="building llama.cpp for the CPU (no GPU toolkit found; LOCALSPEC_BACKEND=cuda|vulkan to choose)"
        fi
    else
        BACKEND=$requested
        case $requested in
            cpu)
                WHY="building llama.cpp for the CPU (LOCALSPEC_BACKEND=cpu)"
                if [ "$os" = Darwin ]; then
                    GPU_ARGS="-DGGML_METAL=OFF"
                fi
                ;;
            cuda)
                find_nvcc || die 1 "LOCALSPEC_BACKEND=cuda needs the CUDA toolkit, and nvcc is" \
                    "neither on PATH nor in $CUDA_HOME_DIR/bin (set CUDA_HOME to where it is" \
                    "installed, or CUDACXX to its nvcc)"
                if ! nvidia_driver; then
                    case " ${CMAKE_ARGS:-} " in
                        *CMAKE_CUDA_ARCHITECTURES*) ;;
                        *) die 1 "LOCALSPEC_BACKEND=cuda: no NVIDIA driver found, so llama.cpp" \
                            "cannot ask the GPU which architecture to build for; name it, e.g." \
                            "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=89 for an RTX 40xx (or =native" \
                            "when the GPU is there after all)" ;;
                    esac
                fi
                WHY="building llama.cpp for CUDA (LOCALSPEC_BACKEND=cuda; nvcc $NVCC_VERSION)"
                GPU_ARGS="-DGGML_CUDA=ON"
                ;;
            vulkan)
                command -v glslc > /dev/null 2>&1 || die 1 "LOCALSPEC_BACKEND=vulkan needs the" \
                    "Vulkan SDK: its headers, loader and glslc shader compiler, which is not on" \
                    "PATH (Debian/Ubuntu: apt install libvulkan-dev glslc)"
                WHY="building llama.cpp for Vulkan (LOCALSPEC_BACKEND=vulkan)"
                GPU_ARGS="-DGGML_VULKAN=ON"
                ;;
            metal)
                [ "$os" = Darwin ] || die 2 "LOCALSPEC_BACKEND=metal builds only on macOS; on" \
                    "$os choose cpu, cuda or vulkan"
                WHY="building llama.cpp for Metal (LOCALSPEC_BACKEND=metal)"
                ;;
        esac
    fi
    # nvcc found outside PATH: tell CMake where it is.
    if [ "$BACKEND" = cuda ] && [ "${CUDACXX:-}" != "$NVCC" ] && ! command -v nvcc > /dev/null 2>&1; then
        export CUDACXX=$NVCC
    fi
}

choose_backend
# llama.cpp's RPC backend, for --rpc (a target split across machines) and `localspec worker`.
CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=ON${GPU_ARGS:+ $GPU_ARGS}"
export CMAKE_ARGS=${CMAKE_ARGS# }
# llama.cpp's AMX kernels crash on some virtual machines whose CPUs report AMX; build the
# CPU backend without them (AVX-512 and the other native kernels stay on).
export CFLAGS="${CFLAGS:-} -U__AMX_INT8__"
export CXXFLAGS="${CXXFLAGS:-} -U__AMX_INT8__"

say "$WHY"
if [ "${LOCALSPEC_SETUP_DRY_RUN:-0}" != 0 ]; then
    say "backend=$BACKEND"
    say "CMAKE_ARGS=$CMAKE_ARGS"
    [ -z "${CUDACXX:-}" ] || say "CUDACXX=$CUDACXX"
    exit 0
fi

# --- install -----------------------------------------------------------------------------

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
LOG=$PWD/.venv/setup.log # pip's whole output, shown when it fails
: > "$LOG"

minutes() {  # 348 -> "5 min 48 s"
    if [ "$1" -ge 60 ]; then
        printf '%d min %d s' $(($1 / 60)) $(($1 % 60))
    else
        printf '%d s' "$1"
    fi
}

# Says when pip starts compiling llama.cpp and how long it took; everything goes to $LOG.
watch_pip() {
    local line start="" cores estimate
    cores=$(getconf _NPROCESSORS_ONLN 2> /dev/null || echo 2)
    estimate=$(((12 + cores - 1) / cores)) # about 12 core-minutes for the CPU backend
    while IFS= read -r line; do
        printf '%s\n' "$line" >> "$LOG"
        case $line in
            *"Building wheel for llama"[-_]"cpp"[-_]"python"*": started"*)
                start=$SECONDS
                case $BACKEND in
                    cpu | metal) say "compiling llama.cpp: about $estimate min on $cores cores, once (pip keeps the result)" ;;
                    *) say "compiling llama.cpp for $NAME: longer than a CPU build's $estimate min on $cores cores, once (pip keeps the result)" ;;
                esac
                ;;
            *"Building wheel for llama"[-_]"cpp"[-_]"python"*": finished with status 'done'"*)
                if [ -n "$start" ]; then
                    say "compiled llama.cpp in $(minutes $((SECONDS - start)))"
                fi
                ;;
        esac
    done
    return 0
}

pip_install() {  # pip_install ARGS...: quiet unless it fails
    local status=0
    .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 | watch_pip || status=$?
    if [ "$status" != 0 ]; then
        say "pip install $* failed (exit $status); the end of its output:" >&2
        tail -n 40 "$LOG" >&2
        die 1 "pip's whole output: $LOG"
    fi
}

# Which ggml backends the installed llama-cpp-python has; fails unless it has the RPC
# backend and the chosen GPU backend (and, for LOCALSPEC_BACKEND=cpu, no GPU backend).
CHECK_BUILD='
import sys
backend, only_cpu = sys.argv[1], sys.argv[2] == "1"
names = {"cuda": ("CUDA",), "vulkan": ("Vulkan",), "metal": ("MTL", "Metal")}
try:
    from localspec.backend.devices import compiled_backends

    have = compiled_backends()
except Exception as err:
    print(f"a library that does not load ({type(err).__name__}: {err})")
    sys.exit(1)
ok = "RPC" in have and (backend == "cpu" or any(n in have for n in names[backend]))
if only_cpu:
    ok = ok and not any(n in have for n in names["cuda"] + names["vulkan"])
print(", ".join(have) or "no backend")
sys.exit(0 if ok else 1)
'
# LOCALSPEC_BACKEND=cpu on Linux: a build with a GPU backend is rebuilt without it. (On
# macOS llama-cpp-python builds Metal whatever CMake is told; --gpu-layers 0 leaves it idle.)
only_cpu=0
if [ "${LOCALSPEC_BACKEND:-}" = cpu ] && [ "$(uname -s)" != Darwin ]; then
    only_cpu=1
fi
check_build() {
    .venv/bin/python -c "$CHECK_BUILD" "$BACKEND" "$only_cpu" 2>> "$LOG"
}
case $BACKEND in
    cpu) NAME="the CPU" wanted="RPC backend" ;;
    cuda) NAME=CUDA wanted="CUDA and RPC backends" ;;
    vulkan) NAME=Vulkan wanted="Vulkan and RPC backends" ;;
    metal) NAME=Metal wanted="Metal and RPC backends" ;;
esac
if [ "$only_cpu" = 1 ]; then
    wanted="RPC backend and no GPU backend"
fi

say "installing localspec and its dependencies into .venv (pip's output: .venv/setup.log)"
pip_install --upgrade pip
pip_install -e ".[dev,bench]"

# pip's wheel cache does not know which CMake options built a wheel: one built earlier for
# another backend, or without the RPC backend, would be reused. Drop it and build again.
if ! have=$(check_build); then
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
    say "llama-cpp-python $version here has $have, not the $wanted: building it again"
    .venv/bin/python -m pip cache remove 'llama_cpp_python*' > /dev/null 2>&1 || true
    pip_install --force-reinstall --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version"
    have=$(check_build) || die 1 "llama-cpp-python $version was built again but has $have," \
        "not the $wanted (CMAKE_ARGS=$CMAKE_ARGS; pip's output: $LOG)"
fi
.venv/bin/localspec --help > /dev/null
say "done: localspec is installed in .venv, llama.cpp with $have (activate it with: source .venv/bin/activate)"
