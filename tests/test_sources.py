"""Which files `datastore add` reads: .gitignore (nested, negated, a work tree's parents),
version-control directories, binary, non-UTF-8, empty and oversized files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.errors import InputError
from localspec.storage import sources
from localspec.storage.sources import scan


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def found(found_scan) -> list[str]:
    return [Path(s.path).relative_to(found_scan.roots[0]).as_posix() for s in found_scan]


def test_gitignore_nested_and_negated(tmp_path):
    write(
        tmp_path,
        {
            ".gitignore": "*.log\nbuild/\n/top.txt\n",
            "top.txt": "ignored: anchored to the root",
            "a.py": "print(1)",
            "x.log": "log",
            "build/out.py": "built",
            "pkg/.gitignore": "!keep.log\nsecret.py\n",
            "pkg/keep.log": "kept: negated deeper",
            "pkg/other.log": "log",
            "pkg/secret.py": "s",
            "pkg/top.txt": "kept: the root's pattern is anchored",
            "pkg/mod.py": "x = 1",
        },
    )
    result = scan([tmp_path], 1 << 20)
    assert found(result) == [
        ".gitignore",
        "a.py",
        "pkg/.gitignore",
        "pkg/keep.log",
        "pkg/mod.py",
        "pkg/top.txt",
    ]
    # top.txt, x.log, build/ (not entered: one entry), pkg/other.log, pkg/secret.py
    assert result.skipped == {sources.SKIP_IGNORED: 5}


def test_an_ignored_directory_is_not_entered_so_nothing_in_it_comes_back(tmp_path):
    write(tmp_path, {".gitignore": "out/\n!out/keep.py\n", "out/keep.py": "x", "a.py": "y"})
    assert found(scan([tmp_path], 1 << 20)) == [".gitignore", "a.py"]


def test_version_control_directories_are_skipped(tmp_path):
    write(tmp_path, {".git/config": "[core]", ".hg/x": "x", ".svn/y": "y", "a.py": "z"})
    assert found(scan([tmp_path], 1 << 20)) == ["a.py"]


def test_binary_non_utf8_empty_and_oversized_files_are_skipped(tmp_path):
    write(
        tmp_path,
        {
            "bin.dat": b"abc\0def",
            "latin.txt": "caf\xe9".encode("latin-1"),
            "empty.txt": "  \n",
            "big.txt": "x" * 101,
            "ok.txt": "\ufeffhello",
            "exact.txt": "y" * 100,
        },
    )
    result = scan([tmp_path], 100)
    texts = {Path(s.path).name: s.text for s in result}
    assert texts == {"ok.txt": "hello", "exact.txt": "y" * 100}  # byte-order mark dropped
    assert result.skipped == {
        sources.SKIP_BINARY: 1,
        sources.SKIP_NOT_UTF8: 1,
        sources.SKIP_EMPTY: 1,
        sources.SKIP_TOO_LARGE: 1,
    }


def test_a_nul_byte_after_the_probe_is_not_binary_but_must_decode(tmp_path):
    write(tmp_path, {"late.txt": b"a" * sources.BINARY_PROBE + b"\0"})
    assert [s.text[-1] for s in scan([tmp_path], 1 << 20)] == ["\0"]


def test_a_named_file_is_read_even_if_ignored(tmp_path):
    write(tmp_path, {".gitignore": "*.log\n", "x.log": "wanted"})
    result = scan([tmp_path / "x.log"], 1 << 20)
    assert [s.text for s in result] == ["wanted"]


def test_parents_gitignore_applies_inside_a_work_tree(tmp_path):
    write(
        tmp_path, {".git/HEAD": "ref", ".gitignore": "*.tmp\n", "src/a.py": "a", "src/b.tmp": "b"}
    )
    result = scan([tmp_path / "src"], 1 << 20)
    assert found(result) == ["a.py"] and result.skipped == {sources.SKIP_IGNORED: 1}
    # Outside a git work tree, a parent's .gitignore means nothing.
    (tmp_path / ".git" / "HEAD").unlink()
    (tmp_path / ".git").rmdir()
    assert found(scan([tmp_path / "src"], 1 << 20)) == ["a.py", "b.tmp"]


def test_a_directory_named_though_ignored_by_its_parents_is_read(tmp_path):
    write(tmp_path, {".git/HEAD": "ref", ".gitignore": "vendor/\n", "vendor/lib.py": "v"})
    assert found(scan([tmp_path / "vendor"], 1 << 20)) == ["lib.py"]


def test_files_are_read_once_and_paths_are_absolute(tmp_path, monkeypatch):
    write(tmp_path, {"d/a.py": "a"})
    monkeypatch.chdir(tmp_path)
    result = list(scan(["d", "d/a.py", str(tmp_path / "d")], 1 << 20))
    assert [s.path for s in result] == [str(tmp_path / "d" / "a.py")]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_symlinked_directories_and_special_files_are_not_followed(tmp_path):
    write(tmp_path, {"real/a.py": "a", "tree/b.py": "b"})
    (tmp_path / "tree" / "loop").symlink_to(tmp_path / "tree")
    (tmp_path / "tree" / "link.py").symlink_to(tmp_path / "tree" / "b.py")
    (tmp_path / "tree" / "out.py").symlink_to(tmp_path / "real" / "a.py")  # out of the tree
    os.mkfifo(tmp_path / "tree" / "pipe")
    result = scan([tmp_path / "tree"], 1 << 20)
    assert found(result) == ["b.py", "link.py"]
    assert result.skipped == {sources.SKIP_SPECIAL: 1, sources.SKIP_OUTSIDE: 1}


def test_a_missing_path_is_an_input_error_before_anything_is_read(tmp_path):
    write(tmp_path, {"a.py": "a"})
    with pytest.raises(InputError, match="no such file or directory: .*nope"):
        scan([tmp_path, tmp_path / "nope"], 1 << 20)
    with pytest.raises(InputError):
        scan([], 1 << 20)
