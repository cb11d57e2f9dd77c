"""Prepare the device check's carry folder: what a GPU machine without network needs.

``python experiments/device/carry.py --out .device`` (``experiments/device/check.sh prepare``
runs it) writes, under 64 MiB in all:

- ``llama.cpp/``: llama-cpp-python's vendored llama.cpp (the sdist's ``vendor/llama.cpp``)
  without what the check does not build: tests, model vocabulary files, docs, media, the
  web UI's sources (llama-server builds without it), and every ggml backend but the CPU's
  and CUDA's; ``tools/`` and ``examples/`` list only the targets the check builds
  (llama-bench, llama-quantize, llama-server and the mtmd library it links;
  llama-speculative-simple);
- ``bindings/llama_cpp/``: the sdist's Python bindings (no library: they load the check's
  build through ``LLAMA_CPP_LIB_PATH``);
- ``wheels/``: Python 3.12 manylinux wheels of what localspec and gguf import that the GPU
  machine lacks (it has numpy, typer, rich, jinja2, httpx and huggingface-hub);
- ``shapes/``: the real default pair's GGUF metadata and tokenizer, without weights
  (``shapes.describe``).

The folder is git-ignored; the sdist comes from pip (its cache, where setup.sh left it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shapes as shaping  # noqa: E402

VERSION = "0.3.36"
LIMIT = 64 << 20  # what one lease carries
# Paths of vendor/llama.cpp kept whole (files or folders).
KEEP = (
    "CMakeLists.txt", "LICENSE", "cmake", "include", "src", "common", "vendor", "pocs",
    "ggml/CMakeLists.txt", "ggml/cmake", "ggml/include", "ggml/src/ggml-cpu",
    "ggml/src/ggml-cuda", "tools/llama-bench", "tools/quantize", "tools/mtmd",
    "tools/server", "examples/speculative-simple", "scripts/ui-assets.cmake",
    "tools/ui/CMakeLists.txt", "tools/ui/ui.cpp.in", "tools/ui/ui.h.in",
    "tools/ui/sources.cmake",
)  # fmt: skip
DROP_INSIDE = ("tests", "public_legacy", "themes", "webui")  # under the kept folders
TOOLS_CMAKE = """find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
add_subdirectory(mtmd)
if (LLAMA_BUILD_SERVER)
    add_subdirectory(ui)
    add_subdirectory(server)
endif()
"""
EXAMPLES_CMAKE = """find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(speculative-simple)
"""
# What the GPU machine lacks, at the versions this checkout's environment runs.
WHEELS = (
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "diskcache", "gguf", "pyyaml", "tqdm", "requests", "certifi", "idna",
    "charset-normalizer", "urllib3", "filelock", "platformdirs",
)  # fmt: skip
SHAPES = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def sdist(work: Path, given: Path | None) -> Path:
    """The extracted sdist's root."""
    archive = given
    if archive is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             ":all:", "-d", str(work), f"llama-cpp-python=={VERSION}"],
            check=True,
        )  # fmt: skip
        archive = work / f"llama_cpp_python-{VERSION}.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return work / f"llama_cpp_python-{VERSION}"


def sources(root: Path, out: Path) -> None:
    src = root / "vendor" / "llama.cpp"
    for rel in KEEP:
        path, dest = src / rel, out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, dest, ignore=shutil.ignore_patterns(*DROP_INSIDE))
        else:
            shutil.copy2(path, dest)
    for rel in ("ggml/src",):  # the files of ggml/src itself, not its other backends
        for path in (src / rel).iterdir():
            if path.is_file():
                shutil.copy2(path, out / rel / path.name)
    (out / "tools" / "CMakeLists.txt").write_text(TOOLS_CMAKE)
    (out / "examples" / "CMakeLists.txt").write_text(EXAMPLES_CMAKE)


def bindings(root: Path, out: Path) -> None:
    dest = out / "llama_cpp"
    shutil.copytree(root / "llama_cpp", dest, ignore=shutil.ignore_patterns("lib", "server"))


def wheels(out: Path) -> None:
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in WHEELS]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--platform", "manylinux2014_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--implementation", "cp", "-d", str(out),
         *pins],
        check=True,
    )  # fmt: skip


def models(folder: Path, out: Path) -> None:
    for name in SHAPES:
        shaping.save(shaping.describe(folder / f"{name}.gguf"), out / f"{name}.json.gz")


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".device"))
    parser.add_argument("--models", type=Path, required=True, help="the real pair's folder")
    parser.add_argument("--sdist", type=Path, help=f"llama_cpp_python-{VERSION}.tar.gz")
    args = parser.parse_args()
    for name in SHAPES:
        if not (args.models / f"{name}.gguf").is_file():
            print(f"error: {args.models / name}.gguf not found", file=sys.stderr)
            return 2
    if args.out.exists():
        shutil.rmtree(args.out)
    with tempfile.TemporaryDirectory() as work:
        root = sdist(Path(work), args.sdist)
        sources(root, args.out / "llama.cpp")
        bindings(root, args.out / "bindings")
    wheels(args.out / "wheels")
    (args.out / "shapes").mkdir(parents=True)
    models(args.models, args.out / "shapes")
    total = size(args.out)
    for part in sorted(args.out.iterdir()):
        print(f"{part.name:10} {size(part) / 2**20:6.1f} MiB")
    print(f"{'total':10} {total / 2**20:6.1f} MiB (limit {LIMIT >> 20} MiB)")
    return 0 if total < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
