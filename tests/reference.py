"""Each command's option reference in docs/, written from what its ``--help`` prints.

A docs page holds a command's reference between two markers, where its author placed it::

    <!-- localspec complete --help: written by python -m tests.reference; edit the command -->
    ```text
    Usage: localspec complete [OPTIONS] [FILE]
    ...
    ```
    <!-- end of localspec complete --help -->

Between them goes the command's ``--help`` as click prints it without rich's boxes, at
``WIDTH`` columns, so the text does not depend on the terminal. ``commands()`` lists every
command of the app (the leaves: ``models pull``, not ``models``), ``references(docs)``
finds the blocks, and ``problems(docs)`` says what is wrong: a command without a block, a
block twice, a block of no command, a block whose text is not the help's.
``tests/test_reference.py`` fails on any of them, so an option added without its docs fails
the tests. ``python -m tests.reference`` writes every block again (``--check``: only says
what is wrong, exit 1).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from localspec.cli.app import build_app

DOCS = Path(__file__).resolve().parent.parent / "docs"
WIDTH = 100
PROGRAM = "localspec"
BEGIN = re.compile(r"^<!-- (?P<command>localspec(?: [\w-]+)*) --help: .*-->$")
END = "<!-- end of {command} --help -->"

# click's Command and Context: typer builds its commands on click, or on its own copy of
# click (typer 0.2x), so they are read by what they do, not by their class.
Command = Any
Context = Any


def begin_marker(command: str) -> str:
    return f"<!-- {command} --help: written by python -m tests.reference; edit the command -->"


def root_command(app: typer.Typer | None = None) -> Command:
    return typer.main.get_command(app if app is not None else build_app())


def is_group(command: Command) -> bool:
    return hasattr(command, "list_commands") and hasattr(command, "get_command")


def context(command: Command, name: str, parent: Context | None = None) -> Context:
    """A context for ``command`` named ``name``, at ``WIDTH`` columns whatever the
    terminal."""
    return command.context_class(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )


def commands(root: Command | None = None) -> dict[str, str]:
    """Every command the app runs (``localspec models pull``: the leaves of its groups, and a
    group that runs without a subcommand, as ``localspec bench``), with its ``--help``, in the
    order ``--help`` lists them."""
    root = root if root is not None else root_command()
    found: dict[str, str] = {}
    for path, command, ctx in _walk(root, context(root, PROGRAM)):
        runs_alone = getattr(command, "invoke_without_command", False) and command is not root
        if not is_group(command) or runs_alone:
            found[path] = plain_help(command, ctx)
    return found


def _walk(command: Command, ctx: Context) -> Iterator[tuple[str, Command, Context]]:
    yield ctx.command_path, command, ctx
    if is_group(command):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, context(sub, name, ctx))


def plain_help(command: Command, ctx: Context) -> str:
    """The command's ``--help`` as click prints it, without rich (typer's plain mode)."""
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None  # a fresh command object: nothing else reads it
    return command.get_help(ctx).rstrip() + "\n"


def block(command: str, help_text: str) -> str:
    """A command's reference as it stands in a page, markers included."""
    return "\n".join(
        [
            begin_marker(command),
            "```text",
            help_text.rstrip("\n"),
            "```",
            END.format(command=command),
        ]
    )


@dataclass(frozen=True)
class Reference:
    """A block in a page: the command it names, its text, and where it stands."""

    page: Path
    command: str
    start: int  # offsets of the whole block, markers included, in the page's text
    end: int

    def text(self) -> str:
        return self.page.read_text(encoding="utf-8")[self.start : self.end]


def references(docs: Path = DOCS) -> list[Reference]:
    """Every block of every page, in page order; a begin marker without its end is a
    ``ValueError`` naming the page."""
    found = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        offset = 0
        for line in text.splitlines(keepends=True):
            match = BEGIN.match(line.rstrip("\n"))
            if match:
                command = match.group("command")
                end_marker = END.format(command=command)
                end = text.find(end_marker, offset)
                if end < 0:
                    raise ValueError(f"{page.name}: {command}'s block has no {end_marker}")
                found.append(Reference(page, command, offset, end + len(end_marker)))
            offset += len(line)
    return found


def problems(docs: Path = DOCS, root: Command | None = None) -> list[str]:
    """What is wrong with the references in ``docs``, one line each; empty when every
    command has exactly one block and each holds its ``--help``."""
    helps = commands(root)
    blocks = references(docs)
    found = []
    for command in helps:
        pages = [ref.page.name for ref in blocks if ref.command == command]
        if not pages:
            found.append(f"{command}: no reference in docs/ (add its block to its page)")
        elif len(pages) > 1:
            found.append(f"{command}: a reference in each of {', '.join(pages)}; keep one")
    for ref in blocks:
        if ref.command not in helps:
            found.append(f"{ref.page.name}: a reference of {ref.command}, which is no command")
        elif ref.text() != block(ref.command, helps[ref.command]):
            found.append(f"{ref.page.name}: {ref.command}'s reference is not its --help")
    return found


def write(docs: Path = DOCS, root: Command | None = None) -> list[Path]:
    """Write every block of ``docs`` again from the commands' help; the pages changed."""
    helps = commands(root)
    changed = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        pieces, last = [], 0
        for ref in (ref for ref in references(docs) if ref.page == page):
            if ref.command in helps:
                pieces += [text[last : ref.start], block(ref.command, helps[ref.command])]
                last = ref.end
        new = "".join([*pieces, text[last:]])
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python -m tests.reference [--check]", file=sys.stderr)
        return 2
    if not argv:
        for page in write():
            print(f"wrote {page.relative_to(DOCS.parent)}")
    wrong = problems()
    for line in wrong:
        print(line, file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
