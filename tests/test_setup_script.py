"""scripts/setup.sh's choice of llama.cpp backend, through its dry run
(``LOCALSPEC_SETUP_DRY_RUN=1``): the machine's tools are small fake scripts on a PATH that
holds nothing else, and the script runs from a copy of the repository that holds only
itself, so the test sees that a dry run creates no venv and installs nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(
    BASH is None or sys.platform == "win32", reason="scripts/setup.sh is a bash script"
)

NVCC = (
    'echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
    'echo "Cuda compilation tools, release 12.4, V12.4.131"'
)
NVIDIA_SMI = 'echo "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)"'


class Machine:
    """A fake machine: ``tool(name, body)`` puts a shell script on its PATH; ``run(**env)``
    dry-runs the set-up there."""

    def __init__(self, root: Path, system: str = "Linux") -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.checkout = root / "checkout"
        (self.checkout / "scripts").mkdir(parents=True)
        shutil.copy(REPO / "scripts" / "setup.sh", self.checkout / "scripts" / "setup.sh")
        self.tool("uname", f'echo "{system}"')
        self.cuda_home = root / "no-cuda"  # where the script looks for nvcc off PATH
        self.driver_file = root / "no-driver"  # stands for /proc/driver/nvidia/version

    def tool(self, name: str, body: str, where: Path | None = None) -> Path:
        folder = where or self.bin
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        environment = {
            "PATH": str(self.bin),
            "HOME": str(self.root),
            "CUDA_HOME": str(self.cuda_home),
            "LOCALSPEC_NVIDIA_DRIVER_FILE": str(self.driver_file),
            "LOCALSPEC_SETUP_DRY_RUN": "1",
            **env,
        }
        assert BASH is not None
        done = subprocess.run(
            [BASH, str(self.checkout / "scripts" / "setup.sh")],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sorted(p.name for p in self.checkout.iterdir()) == ["scripts"], (
            "a dry run must not create a venv or install anything"
        )
        return done


def decision(done: subprocess.CompletedProcess[str]) -> tuple[str, dict[str, str]]:
    """-> (the line saying what it builds and why, {backend, CMAKE_ARGS, CUDACXX})."""
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 4, done.stdout  # the reason, then the settings
    settings = dict(line.split("=", 1) for line in lines[1:])
    return lines[0], settings


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_no_gpu_tools_builds_for_the_cpu(machine):
    why, settings = decision(machine.run())
    assert settings["backend"] == "cpu"
    assert settings["CMAKE_ARGS"] == "-DGGML_RPC=ON"
    assert why.startswith("building llama.cpp for the CPU (no GPU toolkit found")
    assert "LOCALSPEC_BACKEND=" in why


def test_nvcc_and_a_driver_build_for_cuda(machine):
    machine.tool("nvcc", NVCC)
    machine.tool("nvidia-smi", NVIDIA_SMI)
    why, settings = decision(machine.run())
    assert settings["backend"] == "cuda"
    assert settings["CMAKE_ARGS"].split() == ["-DGGML_RPC=ON", "-DGGML_CUDA=ON"]
    assert "CUDACXX" not in settings  # nvcc is on PATH: CMake finds it
    assert why == "building llama.cpp for CUDA (nvcc 12.4 and an NVIDIA driver found)"


def test_nvcc_in_cuda_home_and_the_driver_file_build_for_cuda(machine):
    nvcc = machine.tool("nvcc", NVCC, where=machine.cuda_home / "bin")
    machine.driver_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module 550.54\n")
    _, settings = decision(machine.run())
    assert settings["backend"] == "cuda"
    assert "-DGGML_CUDA=ON" in settings["CMAKE_ARGS"].split()
    assert settings["CUDACXX"] == str(nvcc)  # off PATH: CMake is told where it is


def test_nvcc_without_a_driver_builds_for_the_cpu_and_says_why(machine):
    machine.tool("nvcc", NVCC)
    why, settings = decision(machine.run())
    assert settings["backend"] == "cpu"
    assert settings["CMAKE_ARGS"] == "-DGGML_RPC=ON"
    assert "nvcc 12.4 found but no NVIDIA driver" in why


def test_a_driver_without_nvcc_builds_for_the_cpu_and_says_why(machine):
    machine.tool("nvidia-smi", NVIDIA_SMI)
    why, settings = decision(machine.run())
    assert settings["backend"] == "cpu"
    assert "no nvcc" in why


def test_a_broken_nvidia_smi_is_no_driver(machine):
    machine.tool("nvcc", NVCC)
    machine.tool("nvidia-smi", 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    _, settings = decision(machine.run())
    assert settings["backend"] == "cpu"


def test_vulkan_when_asked(machine):
    machine.tool("glslc", 'echo "glslc 2024.0"')
    machine.tool("nvcc", NVCC)
    machine.tool("nvidia-smi", NVIDIA_SMI)
    why, settings = decision(machine.run(LOCALSPEC_BACKEND="vulkan"))
    assert settings["backend"] == "vulkan"
    assert settings["CMAKE_ARGS"].split() == ["-DGGML_RPC=ON", "-DGGML_VULKAN=ON"]
    assert why == "building llama.cpp for Vulkan (LOCALSPEC_BACKEND=vulkan)"


def test_vulkan_without_its_sdk_is_an_error_before_any_build(machine):
    done = machine.run(LOCALSPEC_BACKEND="vulkan")
    assert done.returncode == 1
    assert "glslc" in done.stderr and done.stdout == ""


def test_cpu_when_asked_even_with_cuda_there(machine):
    machine.tool("nvcc", NVCC)
    machine.tool("nvidia-smi", NVIDIA_SMI)
    why, settings = decision(machine.run(LOCALSPEC_BACKEND="cpu"))
    assert settings["backend"] == "cpu"
    assert settings["CMAKE_ARGS"] == "-DGGML_RPC=ON"
    assert why == "building llama.cpp for the CPU (LOCALSPEC_BACKEND=cpu)"


def test_cuda_when_asked_without_nvcc_is_an_error(machine):
    machine.tool("nvidia-smi", NVIDIA_SMI)
    done = machine.run(LOCALSPEC_BACKEND="cuda")
    assert done.returncode == 1
    assert "nvcc" in done.stderr and done.stdout == ""


def test_cuda_when_asked_without_a_driver_needs_the_architecture(machine):
    machine.tool("nvcc", NVCC)
    done = machine.run(LOCALSPEC_BACKEND="cuda")
    assert done.returncode == 1
    assert "CMAKE_CUDA_ARCHITECTURES" in done.stderr
    _, settings = decision(
        machine.run(LOCALSPEC_BACKEND="cuda", CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=89")
    )
    assert settings["backend"] == "cuda"
    assert settings["CMAKE_ARGS"].split() == [
        "-DCMAKE_CUDA_ARCHITECTURES=89",
        "-DGGML_RPC=ON",
        "-DGGML_CUDA=ON",
    ]


def test_metal_on_linux_is_an_error(machine):
    done = machine.run(LOCALSPEC_BACKEND="metal")
    assert done.returncode == 2
    assert "macOS" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("value", ["bogus", "CUDA", "gpu"])
def test_an_unknown_backend_is_an_error_with_exit_2(machine, value):
    done = machine.run(LOCALSPEC_BACKEND=value)
    assert done.returncode == 2
    assert f"LOCALSPEC_BACKEND={value} is not a backend" in done.stderr
    assert "cpu, cuda, vulkan or metal" in done.stderr
    assert done.stdout == ""


def test_the_users_cmake_args_are_kept(machine):
    _, settings = decision(machine.run(CMAKE_ARGS="-DGGML_BLAS=ON"))
    assert settings["CMAKE_ARGS"].split() == ["-DGGML_BLAS=ON", "-DGGML_RPC=ON"]


def test_macos_keeps_llama_cpps_metal_default(tmp_path):
    mac = Machine(tmp_path, system="Darwin")
    why, settings = decision(mac.run())
    assert settings["backend"] == "metal"
    assert settings["CMAKE_ARGS"] == "-DGGML_RPC=ON"  # Metal is on by default there
    assert why.startswith("building llama.cpp for Metal")
    _, settings = decision(mac.run(LOCALSPEC_BACKEND="metal"))
    assert settings["backend"] == "metal"
    assert settings["CMAKE_ARGS"] == "-DGGML_RPC=ON"


def test_cpu_on_macos_turns_metal_off(tmp_path):
    mac = Machine(tmp_path, system="Darwin")
    _, settings = decision(mac.run(LOCALSPEC_BACKEND="cpu"))
    assert settings["backend"] == "cpu"
    assert settings["CMAKE_ARGS"].split() == ["-DGGML_RPC=ON", "-DGGML_METAL=OFF"]
