"""llama.cpp is initialised on first use, once: importing the backend leaves it alone, the
first model load initialises it, and concurrent first uses initialise it only once. Each
check runs in a fresh interpreter, where nothing has touched llama.cpp yet."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

ROOT = Path(__file__).resolve().parent.parent

# Counts llama_backend_init calls and log-callback installs from the child's first import on.
COUNTING = """
import json, sys, threading
import llama_cpp
calls = {"init": 0, "log_set": 0}
real_init, real_log_set = llama_cpp.llama_backend_init, llama_cpp.llama_log_set
def init():
    calls["init"] += 1
    real_init()
def log_set(callback, data):
    calls["log_set"] += 1
    real_log_set(callback, data)
llama_cpp.llama_backend_init, llama_cpp.llama_log_set = init, log_set
"""


def _run(body: str, *args: str) -> dict:
    code = COUNTING + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_backend_leaves_llama_cpp_uninitialised():
    seen = _run(
        """
        import localspec.backend.llama, localspec.backend.devices, localspec.backend.rpc
        import localspec.backend.quantize, localspec.backend.compat
        from localspec.backend import runtime
        print(json.dumps({**calls, "flag": runtime.backend_initialised()}))
        """
    )
    assert seen == {"init": 0, "log_set": 0, "flag": False}


def test_the_first_load_initialises_llama_cpp_once(tiny_pair):
    target, draft, _ = tiny_pair
    seen = _run(
        """
        from localspec.backend.llama import LlamaModel, LoadOptions
        from localspec.backend import runtime
        options = LoadOptions(n_ctx=64, n_threads=1)
        first = LlamaModel(sys.argv[1], options)
        after_first = dict(calls, flag=runtime.backend_initialised())
        second = LlamaModel(sys.argv[2], options)
        first.close(); second.close()
        print(json.dumps({"first": after_first, "second": calls}))
        """,
        str(target),
        str(draft),
    )
    assert seen["first"] == {"init": 1, "log_set": 1, "flag": True}
    assert seen["second"] == {"init": 1, "log_set": 1}


def test_concurrent_first_uses_initialise_once():
    seen = _run(
        """
        from localspec.backend.runtime import ensure_backend
        threads = [threading.Thread(target=ensure_backend) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps(calls))
        """
    )
    assert seen == {"init": 1, "log_set": 1}


def test_a_first_use_without_log_capture_leaves_llama_cpp_python_logging():
    """Quantization and the RPC worker keep llama-cpp-python's printing logger; a later
    model load still captures the lines it explains its failures with."""
    seen = _run(
        """
        from localspec.backend.runtime import ensure_backend
        ensure_backend(capture_log=False)
        uncaptured = dict(calls)
        ensure_backend()
        ensure_backend()
        print(json.dumps({"uncaptured": uncaptured, "then": calls}))
        """
    )
    assert seen["uncaptured"] == {"init": 1, "log_set": 0}
    assert seen["then"] == {"init": 1, "log_set": 1}
