"""llama.cpp's library is loaded before numpy in every process that may load models
(``localspec/backend/library.py`` says why): the ``localspec`` command, whichever command it
runs, and ``import localspec`` before the Python API. Read from ``python -X importtime``,
which lists modules in the order they finish importing, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIBRARY = "llama_cpp.llama_cpp"  # the bindings' module that loads the shared library


def import_order(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    names = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    return [n for n in names if n in (LIBRARY, "numpy")]


@pytest.mark.parametrize("command", ["complete", "chat", "serve", "bench", "datastore"])
def test_a_command_loads_llama_cpp_before_numpy(command):
    code = (
        "import sys\nfrom localspec.cli.app import main\n"
        f"sys.argv = ['localspec', {command!r}, '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    assert import_order(code)[:1] == [LIBRARY]


@pytest.mark.parametrize("name", ["load", "Speculator", "Stream"])
def test_the_python_api_loads_llama_cpp_before_numpy(name):
    assert import_order(f"import localspec\nlocalspec.{name}")[:1] == [LIBRARY]
