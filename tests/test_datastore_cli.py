"""`localspec datastore ...` through typer's CliRunner, with a tiny GGUF model's tokenizer:
what each command prints, and one-line errors with a hint and a non-zero exit."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.storage.library import Library

runner = CliRunner()


def run(*args: str, env: dict | None = None):
    return runner.invoke(app, ["datastore", *args], env={"COLUMNS": "200", **(env or {})})


def assert_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1].startswith("hint: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / ".gitignore").write_text("*.log\n")
    (root / "src" / "a.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "notes.txt").write_text("the cat and the dog")
    (root / "run.log").write_text("ignored")
    (root / "img.bin").write_bytes(b"\x89PNG\0\0")
    (root / "big.txt").write_text("x" * 5000)
    return root


def test_add_list_stats_and_rm(tiny_pair, tree):
    target = str(tiny_pair[0])
    result = run("add", str(tree), "--target", target, "--max-file-size", "4096")
    assert result.exit_code == 0, result.output
    assert "datastore 'proj': indexed 3 files" in result.stdout
    assert "now 3 files" in result.stdout
    assert "skipped 3 files: " in result.stdout
    for reason in ("1 ignored by .gitignore", "1 binary", "1 over the size limit"):
        assert reason in result.stdout

    listed = run("list", "--target", target)
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "proj" in line and "│" in line)
    assert "3" in row and "target's" in row and str(tree) in row
    assert "history: on" in listed.stdout
    other = run("list", "--target", str(tiny_pair[2]))
    assert "other" in next(ln for ln in other.stdout.splitlines() if "proj" in ln and "│" in ln)
    unknown = run("list")  # the default target is not on this machine: nothing is fetched
    assert unknown.exit_code == 0 and "unknown" in unknown.stdout

    stats = run("stats", "proj", "--lookups", "50")
    assert stats.exit_code == 0, stats.output
    assert "proj: 3 documents" in stats.stdout
    assert "50 contexts from the store): median " in stats.stdout and "p95 " in stats.stdout

    removed = run("rm", "proj")
    assert removed.exit_code == 0 and "deleted datastore 'proj'" in removed.stdout
    assert Library().names() == []


def test_add_again_replaces_and_names_the_store(tiny_pair, tree):
    target = str(tiny_pair[0])
    assert run("add", str(tree / "src"), "--name", "code", "--target", target).exit_code == 0
    (tree / "src" / "a.py").write_text("def sub(a, b):\n    return a - b\n")
    result = run("add", str(tree / "src"), str(tree / "notes.txt"), "--name", "code",
                 "--target", target)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "indexed 2 files (1 replaced)" in result.stdout and "now 2 files" in result.stdout


def test_add_errors(tiny_pair, tree, tmp_path):
    target = str(tiny_pair[0])
    assert_error(run("add", str(tmp_path / "nope"), "--target", target), 2, "no such file")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.bin").write_bytes(b"\0")
    assert_error(run("add", str(empty), "--target", target), 2, "no indexable file", "1 binary")
    assert_error(run("add", str(tree), "--name", "history", "--target", target), 2, "invalid")
    assert run("add", str(tree), "--target", target).exit_code == 0
    assert_error(
        run("add", str(tree), "--target", str(tiny_pair[2])), 2, "another tokenizer", "--target"
    )
    assert_error(run("add", str(tree), "--target", str(tmp_path / "missing.gguf")), 1)


def test_unknown_and_damaged_stores_are_clear_errors(tiny_pair, tree):
    assert_error(run("rm", "nope"), 2, "no datastore named 'nope'", "datastore list")
    assert_error(run("stats", "nope"), 2, "no datastore named 'nope'")
    assert_error(run("stats"), 2, "no datastore yet")
    assert run("add", str(tree), "--target", str(tiny_pair[0])).exit_code == 0
    tokens = Library().root / "proj" / "tokens.npy"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    assert_error(run("stats", "proj"), 1, "damaged", "localspec datastore rm proj")
    report = run("stats")  # every store: the damaged one is a line of the report
    assert report.exit_code == 0 and "proj: datastore 'proj' is damaged" in report.stdout
    listed = run("list")
    assert listed.exit_code == 0 and "proj" in listed.stdout
    assert run("rm", "proj").exit_code == 0


def test_history_on_off_and_forget(tmp_path):
    status = run("history")
    assert status.exit_code == 0 and "history: on" in status.stdout
    off = run("history", "off")
    assert off.exit_code == 0 and "history: off" in off.stdout
    assert not Library().history_enabled()
    assert "history: off" in run("list").stdout
    on = run("history", "on", env={"LOCALSPEC_HISTORY": "0"})
    assert "LOCALSPEC_HISTORY=0" in on.stdout and Library().history_enabled()
    assert_error(run("history", "maybe"), 2, "invalid state")

    assert run("rm", "history").stdout.strip() == "no history was kept"
    Library().record("ab" * 16, [1, 2, 3, 4])
    listed = run("list")
    assert "history" in listed.stdout and "your answers (history on)" in listed.stdout
    stats = run("stats", "history", "--lookups", "10")
    assert stats.exit_code == 0 and "history (abababab): 1 documents, 4 tokens" in stats.stdout
    assert run("rm", "history").stdout.strip() == "forgot the history of answers"
    assert Library().histories() == []
