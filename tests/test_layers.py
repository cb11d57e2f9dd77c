"""The import contract: each layer imports only from the layers below it.

Layers, lowest first: ``errors`` and ``progress`` (values every layer may use); ``core``,
and beside it ``environment`` (the environment variables the front ends read);
``statefiles`` (how every layer above the core writes and reads its small files);
``backend``; ``models`` (which uses the backend only to measure drafts it derives from a
target; the backend never imports it); ``storage`` (what is kept on disk: datastores, the
history of answers, learned state, conversations; nothing in it needs a loaded model);
``machine`` (this machine's facts: where layers go, its measured step costs, the target
its GPU suggests); ``session`` (a loaded pair); ``options`` (the front ends' contract: the
option groups they all take, and how a value is checked and worded); the front ends
``api`` (the Python API), ``bench``, ``tui`` and ``serve`` (none imports another); ``cli``,
which mounts them all.
Every import in every module counts, including the ones inside functions. The core also
stays free of I/O-heavy and UI libraries, checked both in its source and in a fresh
interpreter.

No two modules import each other, directly or through others, even inside a function: an
import cycle hides which of them is the lower one. Imports under ``if TYPE_CHECKING:`` only
name types for the type checker, never run, and take no part in a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "localspec"
RANK = {
    "errors": 0,
    "progress": 0,
    "core": 1,
    "environment": 1,
    "statefiles": 2,
    "backend": 3,
    "models": 4,
    "storage": 5,
    "machine": 6,
    "session": 7,
    "options": 8,
    "api": 9,
    "bench": 9,
    "tui": 9,
    "serve": 9,
    "cli": 10,
}
# Third-party libraries a layer must not import.
FORBIDDEN = {
    "core": {"textual", "typer", "rich", "llama_cpp", "huggingface_hub", "jinja2"},
    "backend": {"textual", "typer", "huggingface_hub"},
    "models": {"textual", "typer", "llama_cpp"},
    "storage": {"textual", "typer", "llama_cpp"},
    "machine": {"textual", "typer"},
    "session": {"textual", "typer"},
    "options": {"textual", "typer"},
    # A script's API draws nothing on the terminal.
    "api": {"textual", "typer", "rich"},
}
MODULES = sorted(
    p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
    for p in PACKAGE.rglob("*.py")
)


def layer_of(module: str) -> str | None:
    """``core.engine`` -> ``core``; top-level modules other than ``errors``, ``progress``
    and ``environment`` have no layer."""
    head = module.split(".")[0]
    return head if head in RANK else None


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if node.module == "localspec":
                found += [f"localspec.{alias.name}" for alias in node.names]
    return found


def _type_checking_only(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` (full names) that ``path`` imports when it runs: at its top
    or in a function, not under ``if TYPE_CHECKING:``. ``from a import b`` imports ``a.b``
    when that is a module, else ``a``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            assert isinstance(node, ast.If)
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found & modules


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` (``localspec.core``, ``localspec.core.events``...) and the
    modules of the package it imports when it runs."""
    paths = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {module: run_imports(path, set(paths)) - {module} for module, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def violations(module: str) -> list[str]:
    path = PACKAGE / (module.replace(".", "/") + ".py")
    mine = layer_of(module)
    bad = []
    for name in imports_of(path):
        root = name.split(".")[0]
        if root == "localspec":
            other = layer_of(name.removeprefix("localspec.")) if name != "localspec" else None
            if mine is None or other is None or other == mine:
                continue
            if RANK[other] >= RANK[mine]:
                bad.append(f"{module} imports {name} ({other} is not below {mine})")
        elif mine in FORBIDDEN and root in FORBIDDEN[mine]:
            bad.append(f"{module} imports {name} ({mine} must not use {root})")
    return bad


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_only_from_lower_layers(module):
    assert violations(module) == []


def test_every_module_belongs_to_a_layer():
    loose = [m for m in MODULES if layer_of(m) is None and m not in ("__init__", "__main__")]
    assert loose == []


def test_no_modules_import_each_other():
    assert cycles(import_graph(PACKAGE)) == []


def test_the_cycle_check_catches_a_cycle_even_inside_a_function(tmp_path):
    """Three modules in a ring (one import inside a function) are a cycle; an import under
    ``if TYPE_CHECKING:`` is not."""
    fake = tmp_path / "localspec"
    (fake / "core").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "core" / "__init__.py").write_text("")
    (fake / "core" / "a.py").write_text("from localspec.core import b\n")
    (fake / "core" / "b.py").write_text("import localspec.core.c\n")
    (fake / "core" / "c.py").write_text("def f():\n    from localspec.core.a import x\n")
    (fake / "core" / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from localspec.core import e\n"
    )
    (fake / "core" / "e.py").write_text("from localspec.core.d import y\n")
    graph = import_graph(fake)
    assert graph["localspec.core.a"] == {"localspec.core.b"}
    assert graph["localspec.core.d"] == set()
    assert cycles(graph) == [["localspec.core.a", "localspec.core.b", "localspec.core.c"]]


def test_the_checker_catches_a_leak(tmp_path, monkeypatch):
    """The contract test itself can fail: a core module importing a front end is caught."""
    fake = tmp_path / "localspec"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "leaky.py").write_text(
        "import llama_cpp\n\ndef f():\n    from localspec.tui.app import ChatApp\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = violations("core.leaky")
    assert any("localspec.tui.app" in v for v in found)
    assert any("llama_cpp" in v for v in found)


def test_the_api_is_a_front_end_below_the_cli(tmp_path, monkeypatch):
    """``localspec/api/`` is a layer of its own: it may use the session, not the CLI's
    helpers (typer) nor another front end."""
    assert layer_of("api.speculator") == "api"
    fake = tmp_path / "localspec"
    (fake / "api").mkdir(parents=True)
    (fake / "api" / "speculator.py").write_text(
        "import typer\nfrom localspec.session.open import open_session\n"
        "from localspec.cli.groups import option_groups\nfrom localspec.serve import app\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = violations("api.speculator")
    assert len(found) == 3
    assert any("localspec.cli.groups" in v for v in found)
    assert any("localspec.serve" in v for v in found)
    assert any("typer" in v for v in found)


def test_core_loads_no_front_end_or_backend_library():
    core = [m for m in MODULES if layer_of(m) == "core"]
    forbidden = sorted(FORBIDDEN["core"])
    code = (
        "import sys\n"
        + "".join(f"import localspec.{m}\n" for m in core)
        + f"print(','.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
