"""`localspec models ...` through typer's CliRunner. No network: the Hub and pip are mocked."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import gguf
import pytest
from typer.testing import CliRunner

from localspec.cli.models import models_app
from localspec.models import catalog, fetch, paths
from tests.tiny_gguf import write_tiny_llama

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("no_pip")


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny.gguf", n_embd=64, n_ff=128)


@pytest.fixture
def hub(monkeypatch, tiny):
    calls: list[dict] = []

    def download(**kwargs):
        calls.append(kwargs)
        root = Path(kwargs.get("local_dir") or kwargs["cache_dir"])
        root.mkdir(parents=True, exist_ok=True)
        out = root / kwargs["filename"]
        out.write_bytes(tiny.read_bytes())
        return str(out)

    monkeypatch.setattr(fetch, "_hf_hub_download", download)
    return calls


def run(*args: str, input: str | None = None):
    return runner.invoke(models_app, list(args), input=input)


def test_list_shows_catalog_and_what_is_on_disk(tiny):
    dest = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-0.5b.gguf"
    dest.write_bytes(tiny.read_bytes())
    result = runner.invoke(models_app, ["list"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-32b", "llama-3.2-1b", "gemma-3-270m"):
        assert name in result.stdout
    assert str(dest) in result.stdout
    # Every entry says whose sha256 its downloads are checked against.
    line = next(ln for ln in result.stdout.splitlines() if "qwen2.5-coder-1.5b *" in ln)
    assert "Hub, catalog" in line
    line = next(ln for ln in result.stdout.splitlines() if "qwen2.5-coder-3b " in ln)
    assert "Hub" in line and "catalog" not in line


def test_pull_prints_the_path(hub):
    result = run("pull", "qwen2.5-coder-3b")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("qwen2.5-coder-3b.gguf")
    assert hub[0]["repo_id"] == "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF"


def test_unknown_name_is_an_error_line_and_hint_without_traceback():
    result = run("pull", "qwen-coder-7")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: unknown model 'qwen-coder-7'")
    assert "qwen2.5-coder-7b" in result.stderr
    assert "hint: " in result.stderr and "Traceback" not in result.output


def test_failed_pull_exits_nonzero_with_each_source(monkeypatch):
    def unreachable(**kwargs):
        raise ConnectionError("cannot reach huggingface.co:443")

    monkeypatch.setattr(fetch, "_hf_hub_download", unreachable)
    result = run("pull", "llama-3.2-1b")
    assert result.exit_code == 1
    assert "bartowski/Llama-3.2-1B-Instruct-GGUF" in result.stderr
    assert "cannot reach" in result.stderr and "hint:" in result.stderr


def test_path_never_downloads(tiny):
    result = run("path", "qwen2.5-coder-1.5b")
    assert result.exit_code == 1 and "localspec models pull qwen2.5-coder-1.5b" in result.stderr
    dest = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-1.5b.gguf"
    dest.write_bytes(tiny.read_bytes())
    result = run("path", "qwen2.5-coder-1.5b")
    assert result.exit_code == 0 and result.stdout.strip() == str(dest)
    assert run("path", "nonsense").exit_code == 1


def test_rm_asks_unless_yes(tiny):
    dest = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-1.5b.gguf"
    dest.write_bytes(tiny.read_bytes())
    result = run("rm", "qwen2.5-coder-1.5b", input="n\n")
    assert result.exit_code == 1 and dest.exists()
    result = run("rm", "qwen2.5-coder-1.5b", "--yes")
    assert result.exit_code == 0 and not dest.exists()
    result = run("rm", "qwen2.5-coder-1.5b", "--yes")
    assert result.exit_code == 1 and "not in localspec's cache" in result.stderr


def test_rm_never_deletes_outside_the_models_folder(tiny, tmp_path):
    """A registry naming a file elsewhere, or naming none (which became "."), deletes
    nothing: the entry is ignored and the name is unknown."""
    import json

    outside = tmp_path / "keep.gguf"
    outside.write_bytes(tiny.read_bytes())
    paths.ensure_dir(paths.models_dir())
    paths.registry_path().write_text(
        json.dumps({"evil": {"path": str(outside)}, "empty": {"base": "x"}})
    )
    for name in ("evil", "empty"):
        result = run("rm", name, "--yes")
        assert result.exit_code == 1 and "unknown model" in result.stderr
    assert outside.is_file() and Path(".").is_dir()


def test_rm_removes_every_partial_file_of_the_model(tiny):
    folder = paths.ensure_dir(paths.models_dir())
    (folder / "qwen2.5-coder-1.5b.gguf").write_bytes(tiny.read_bytes())
    stale = [
        folder / ".qwen2.5-coder-1.5b.abc.gguf.partial",
        folder / "qwen2.5-coder-1.5b.gguf.partial",
    ]
    for path in stale:
        path.write_bytes(b"GGUF")
    assert run("rm", "qwen2.5-coder-1.5b", "--yes").exit_code == 0
    assert not any(path.exists() for path in stale)


def _fake_compat(monkeypatch, compatible: bool):
    module = types.ModuleType("localspec.backend.compat")

    def check_pair(target_path, draft_path):
        assert Path(target_path).is_file() and Path(draft_path).is_file()
        reasons = [] if compatible else ["vocabulary sizes differ: 375 vs 400"]
        return types.SimpleNamespace(compatible=compatible, reasons=reasons)

    module.check_pair = check_pair
    monkeypatch.setitem(sys.modules, "localspec.backend.compat", module)


@pytest.mark.parametrize("compatible", [True, False])
def test_check_reports_and_sets_the_exit_code(monkeypatch, tmp_path, compatible):
    _fake_compat(monkeypatch, compatible)
    target = write_tiny_llama(tmp_path / "t.gguf", seed=1)
    draft = write_tiny_llama(tmp_path / "d.gguf", seed=2)
    result = run("check", str(target), str(draft))
    if compatible:
        assert result.exit_code == 0 and result.stdout.startswith("compatible")
    else:
        assert result.exit_code == 1 and "vocabulary sizes differ" in result.stderr


def test_check_with_a_missing_file_is_an_error(monkeypatch, tmp_path):
    _fake_compat(monkeypatch, True)
    result = run("check", str(tmp_path / "none.gguf"), str(tmp_path / "d.gguf"))
    assert result.exit_code == 1 and result.stderr.startswith("error: model file not found")


def test_optimize_writes_registers_and_resolves(tiny):
    result = run("optimize", str(tiny), "--type", "Q4_0")
    assert result.exit_code == 0, result.output
    out = paths.models_dir() / "tiny-q4_0.gguf"
    assert out.is_file() and out.stat().st_size < tiny.stat().st_size
    types_ = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert types_["blk.0.attn_q.weight"] == "Q4_0"
    assert catalog.resolve_model("tiny-q4_0", "target") == out.resolve()
    assert "tiny-q4_0" in run("list").stdout
    assert run("rm", "tiny-q4_0", "--yes").exit_code == 0
    assert not out.exists() and "tiny-q4_0" not in catalog.load_registry()


def test_optimize_rejects_an_unknown_type(tiny):
    result = run("optimize", str(tiny), "--type", "Q9_9")
    assert result.exit_code == 2 and "unknown quantization type" in result.stderr
