"""What this llama.cpp build can run on: its compiled backends and the devices they see.

``compiled_backends()`` names ggml's backend registries as llama.cpp loaded them ("CPU",
"RPC", "CUDA", "MTL" for Metal, "Vulkan", ...). ``devices()`` lists every device of those backends
with its type and free memory (ggml's ``ggml_backend_dev_*`` API, reached through
libllama's handle as ``backend/rpc.py`` does, so this is the registry models are loaded
into). ``gpu_devices()`` keeps the GPUs a model can be offloaded to: RPC workers are not
among them (they are used only when asked for with ``--rpc``). ``build_info()`` gathers the
rest a bug report wants (versions, CPU features), and ``gpu_hardware()`` says whether the
machine has a GPU that this build cannot use (an NVIDIA driver, or Apple Silicon), for the
notice that a CPU-only build leaves it idle.

Nothing here loads a model; everything is cheap enough to call at every start. Importing
this module loads nothing either: the CLI reads its device types at start (through the
session's placement), so llama_cpp is imported by the functions that ask it something.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from localspec.backend.runtime import ensure_backend

# enum ggml_backend_dev_type (ggml/include/ggml-backend.h)
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
GPU_TYPES = ("gpu", "igpu")
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
REBUILD_FOR_GPU = "LOCALSPEC_BACKEND={backend} bash scripts/setup.sh"


@dataclass(frozen=True)
class Device:
    """One ggml device: ``name`` as llama.cpp logs it (``CUDA0``, ``MTL0``, ``CPU``),
    ``backend`` the registry it belongs to, memory in bytes (0 where a backend does not
    say)."""

    name: str
    description: str
    kind: str  # cpu, gpu, igpu, accel, meta
    backend: str
    free: int
    total: int

    @property
    def is_gpu(self) -> bool:
        return self.kind in GPU_TYPES and self.backend != "RPC"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "type": self.kind,
            "backend": self.backend,
            "free_bytes": self.free,
            "total_bytes": self.total,
        }


@dataclass(frozen=True)
class BuildInfo:
    llama_cpp_python: str
    backends: tuple[str, ...]
    gpu_offload: bool  # a GPU backend with at least one device
    rpc: bool
    system_info: str  # llama.cpp's own line: CPU features and backends as compiled

    def to_dict(self) -> dict[str, object]:
        return {
            "llama_cpp_python": self.llama_cpp_python,
            "backends": list(self.backends),
            "gpu_offload": self.gpu_offload,
            "rpc": self.rpc,
            "system_info": self.system_info,
        }


def _lib() -> ctypes.CDLL:
    """ggml's device API through libllama's handle (see ``backend/rpc.py._ggml`` for why
    not ``llama_cpp._ggml``). Importing llama_cpp loads the backends."""
    import llama_cpp
    from llama_cpp import llama_cpp as bindings

    ensure_backend()
    lib = bindings._lib
    llama_cpp.llama_supports_gpu_offload()  # loads the dynamic backends, if any
    signatures = {
        "ggml_backend_reg_count": (ctypes.c_size_t, []),
        "ggml_backend_reg_get": (ctypes.c_void_p, [ctypes.c_size_t]),
        "ggml_backend_reg_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_count": (ctypes.c_size_t, []),
        "ggml_backend_dev_get": (ctypes.c_void_p, [ctypes.c_size_t]),
        "ggml_backend_dev_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_description": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
        "ggml_backend_dev_backend_reg": (ctypes.c_void_p, [ctypes.c_void_p]),
        "ggml_backend_dev_memory": (
            None,
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def compiled_backends() -> tuple[str, ...]:
    """ggml's backend registries in llama.cpp's order, e.g. ``("CUDA", "CPU", "RPC")``."""
    lib = _lib()
    return tuple(
        _text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
        for i in range(lib.ggml_backend_reg_count())
    )


def devices() -> list[Device]:
    """Every device the loaded backends see, with its free and total memory now."""
    lib = _lib()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        found.append(
            Device(
                name=_text(lib.ggml_backend_dev_name(dev)),
                description=_text(lib.ggml_backend_dev_description(dev)),
                kind=DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                backend=_text(lib.ggml_backend_reg_name(reg)) if reg else "",
                free=free.value,
                total=total.value,
            )
        )
    return found


def gpu_devices(found: list[Device] | None = None) -> list[Device]:
    """The GPUs a model can be offloaded to (``found``, else ``devices()``)."""
    return [d for d in (devices() if found is None else found) if d.is_gpu]


def build_info() -> BuildInfo:
    import llama_cpp

    backends = compiled_backends()
    return BuildInfo(
        llama_cpp_python=importlib.metadata.version("llama-cpp-python"),
        backends=backends,
        gpu_offload=bool(gpu_devices()),
        rpc="RPC" in backends,
        system_info=_text(llama_cpp.llama_print_system_info()).strip(),
    )


@dataclass(frozen=True)
class Hardware:
    """A GPU this machine has, whatever the build: ``backend`` is what to build for."""

    backend: str  # cuda, metal
    description: str


def gpu_hardware() -> Hardware | None:
    """An NVIDIA driver or Apple Silicon, else None. Only says a GPU exists; whether the
    build can use it is ``gpu_devices``'s answer."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Hardware("metal", "Apple Silicon GPU")
    if NVIDIA_DRIVER.is_file() or shutil.which("nvidia-smi"):
        return Hardware("cuda", "NVIDIA GPU (driver found)")
    return None
