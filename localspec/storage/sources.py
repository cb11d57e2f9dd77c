"""The files ``localspec datastore add`` indexes, found under the paths the user names.

``scan(paths, max_bytes)`` checks that every path exists (``InputError`` otherwise, before
anything is read) and returns a ``Scan``. Iterating it yields one ``Source`` (absolute path,
text) per indexable file, directories walked in name order; ``Scan.skipped`` counts the
files left out, by reason (``SKIP_*``), as the walk goes.

- A file named on the command line is indexed whatever ``.gitignore`` says: naming it is
  asking for it. It is still skipped when binary, not UTF-8, empty or over ``max_bytes``.
- Inside a directory, ``.gitignore`` files apply as git applies them: each one's patterns
  (pathspec's gitwildmatch) relative to its own directory, a deeper file's decision over a
  shallower one's, negations included, and an ignored directory is not entered, so nothing
  under it can be re-included. When the named directory lies inside a git work tree, the
  ``.gitignore`` files of its parents up to the work tree's root apply too (unless they
  ignore the named directory itself, which was then asked for by name).
- Version-control directories (``.git``, ``.hg``, ``.svn`` ...) are never entered, symbolic
  links to directories are not followed, and only regular files are read. A symbolic link to
  a file is read only when the file it leads to lies under one of the paths given: a link
  out of the tree (to a key or a credentials file) is skipped, and counted as such.
- The walk keeps its own stack, so a tree of any depth is walked (no recursion limit).
- Binary: a NUL byte in the first 8 KiB; not UTF-8: the bytes do not decode strictly. A
  UTF-8 byte-order mark is dropped.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import GitIgnoreSpec

from localspec.errors import InputError

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", "CVS"})
BINARY_PROBE = 8192

SKIP_IGNORED = "ignored by .gitignore"
SKIP_BINARY = "binary"
SKIP_NOT_UTF8 = "not UTF-8"
SKIP_TOO_LARGE = "over the size limit"
SKIP_EMPTY = "empty"
SKIP_UNREADABLE = "unreadable"
SKIP_SPECIAL = "not a regular file"
SKIP_OUTSIDE = "links to files outside the paths given"

# Each entry: the directory a .gitignore sits in, and its patterns.
Rules = list[tuple[Path, GitIgnoreSpec]]


@dataclass(frozen=True)
class Source:
    path: str  # absolute
    text: str


@dataclass
class Scan:
    """The files under ``roots``; iterate to read them (see the module docstring)."""

    roots: list[Path]
    max_bytes: int
    skipped: Counter[str] = field(default_factory=Counter)

    def __iter__(self) -> Iterator[Source]:
        seen: set[str] = set()
        inside = [Path(os.path.realpath(root)) for root in self.roots]
        for root in self.roots:
            found = self._read(root) if not root.is_dir() else self._walk(root, inside)
            for source in found:
                if source.path not in seen:  # one file named twice, or inside a named dir
                    seen.add(source.path)
                    yield source

    def _walk(self, root: Path, inside: list[Path]) -> Iterator[Source]:
        """The files under ``root`` in name order, depth first, without recursion."""
        rules = _parent_rules(root) + _rules_in(root)
        stack: list[tuple[Iterator[os.DirEntry], Rules]] = [(self._entries(root), rules)]
        while stack:
            entries, rules = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            path = Path(entry.path)
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and entry.name in VCS_DIRS:
                continue
            if is_ignored(path, is_dir, rules):
                self.skipped[SKIP_IGNORED] += 1
            elif is_dir:
                stack.append((self._entries(path), rules + _rules_in(path)))
            elif entry.is_symlink() and path.is_dir():
                continue  # not followed: it may loop, or lead out of the tree
            elif entry.is_symlink() and not _under(Path(os.path.realpath(path)), inside):
                self.skipped[SKIP_OUTSIDE] += 1
            else:
                yield from self._read(path)

    def _entries(self, directory: Path) -> Iterator[os.DirEntry]:
        try:
            return iter(sorted(os.scandir(directory), key=lambda e: e.name))
        except OSError:
            self.skipped[SKIP_UNREADABLE] += 1
            return iter(())

    def _read(self, path: Path) -> Iterator[Source]:
        text, reason = read_text(path, self.max_bytes)
        if reason:
            self.skipped[reason] += 1
        else:
            yield Source(str(path), text)


def scan(paths: Sequence[str | Path], max_bytes: int) -> Scan:
    """The files under ``paths``; ``InputError`` names the first path that does not exist."""
    if not paths:
        raise InputError("no path given", "name files or directories to index")
    roots = []
    for given in paths:
        path = Path(os.path.abspath(Path(given).expanduser()))
        if not path.exists():
            raise InputError(f"no such file or directory: {given}", "check the path")
        roots.append(path)
    return Scan(roots, max_bytes)


def read_text(path: Path, max_bytes: int) -> tuple[str, str]:
    """``(text, "")`` for an indexable file, else ``("", reason)``."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return "", SKIP_SPECIAL  # a FIFO would block the read
        if info.st_size > max_bytes:
            return "", SKIP_TOO_LARGE
        data = path.read_bytes()
    except OSError:
        return "", SKIP_UNREADABLE
    if b"\0" in data[:BINARY_PROBE]:
        return "", SKIP_BINARY
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "", SKIP_NOT_UTF8
    text = text.removeprefix("\ufeff")
    if not text.strip():
        return "", SKIP_EMPTY
    return text, ""


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def is_ignored(path: Path, is_dir: bool, rules: Rules) -> bool:
    """What the deepest ``.gitignore`` with a matching pattern decides (git's precedence)."""
    decision = None
    for base, spec in rules:
        relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
        result = spec.check_file(relative)
        if result.include is not None:
            decision = result.include
    return bool(decision)


def _rules_in(directory: Path) -> Rules:
    try:
        lines = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [(directory, GitIgnoreSpec.from_lines(lines.splitlines()))]


def _parent_rules(root: Path) -> Rules:
    """The ``.gitignore`` rules of ``root``'s parents inside its git work tree, if any."""
    if (root / ".git").exists():
        return []  # a work tree's root: the rules of a repository around it do not apply
    parents = []
    for parent in root.parents:
        parents.append(parent)
        if (parent / ".git").exists():
            break
    else:
        return []  # not inside a git work tree: only the tree's own files apply
    rules: Rules = []
    for parent in reversed(parents):
        rules += _rules_in(parent)
    return [] if is_ignored(root, True, rules) else rules
