"""Every command's options are in docs/, as its ``--help`` lists them (``tests.reference``).

A command added without a reference in its page, or an option added, removed or reworded
without writing the references again (``python -m tests.reference``), fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import typer

from tests import reference

HELPS = reference.commands()


def test_every_command_has_one_reference_holding_its_help():
    assert reference.problems() == [], "write them again: .venv/bin/python -m tests.reference"


def test_the_references_cover_every_command_of_the_app():
    """Leaves of every group, none hidden: the models and datastore subcommands, not the
    groups themselves."""
    assert {"localspec complete", "localspec models pull", "localspec datastore add"} <= set(HELPS)
    assert "localspec models" not in HELPS
    documented = {ref.command for ref in reference.references()}
    assert documented == set(HELPS)


def test_a_reference_is_the_plain_help_at_a_fixed_width():
    text = HELPS["localspec complete"]
    assert text.startswith("Usage: localspec complete [OPTIONS] [")
    assert "--rpc-timeout" in text and "--system" in text and "--rpc-split" in text
    assert "│" not in text  # rich's boxes stay in the terminal
    assert max(len(line) for line in text.splitlines()) <= reference.WIDTH


def _undocumented_option() -> Any:
    """A new option, ``--undocumented``, built by typer as it builds the app's."""
    extra = typer.Typer()

    @extra.command()
    def command(undocumented: bool = typer.Option(False, help="new")) -> None:
        """Takes the option."""

    return next(p for p in typer.main.get_command(extra).params if p.name == "undocumented")


def test_an_option_added_without_docs_fails():
    root = reference.root_command()
    complete = root.get_command(reference.context(root, reference.PROGRAM), "complete")
    complete.params.append(_undocumented_option())
    assert "--undocumented" in reference.commands(root)["localspec complete"]
    assert reference.problems(root=root) == [
        "complete.md: localspec complete's reference is not its --help"
    ]


def test_a_command_without_a_reference_and_a_reference_of_no_command_fail(tmp_path):
    (tmp_path / "page.md").write_text(
        "# A page\n\n"
        + reference.block("localspec complete", HELPS["localspec complete"])
        + "\n\n"
        + reference.block("localspec gone", "Usage: localspec gone\n")
        + "\n",
        encoding="utf-8",
    )
    found = reference.problems(tmp_path)
    assert "page.md: a reference of localspec gone, which is no command" in found
    assert "localspec chat: no reference in docs/ (add its block to its page)" in found
    assert not any(line.startswith("localspec complete") for line in found)
    assert not any("complete's reference" in line for line in found)


def test_writing_fills_the_blocks_and_leaves_the_prose(tmp_path):
    prose = "# complete\n\nSome words.\n\n## Options\n\n"
    stale = (
        reference.begin_marker("localspec complete")
        + "\nold text\n"
        + reference.END.format(command="localspec complete")
    )
    page = tmp_path / "complete.md"
    page.write_text(prose + stale + "\n\nAfter.\n", encoding="utf-8")
    assert reference.write(tmp_path) == [page]
    written = page.read_text(encoding="utf-8")
    expected = reference.block("localspec complete", HELPS["localspec complete"])
    assert written == prose + expected + "\n\nAfter.\n"
    assert reference.write(tmp_path) == []  # written once, nothing to change


def test_a_block_without_its_end_is_refused(tmp_path):
    (tmp_path / "page.md").write_text(
        reference.begin_marker("localspec chat") + "\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match="page.md: localspec chat's block has no"):
        reference.references(tmp_path)
