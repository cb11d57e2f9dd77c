"""The README stays short, keeps its Quick start, and every link between it and docs/ holds."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), the target up to a space or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif match.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercased, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of a Markdown file (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """The link targets of a Markdown file, outside code blocks and inline code."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of a file: a missing file or heading."""
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: and the like
            continue
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(root)}:{number}: {target}"
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading with the anchor #{anchor}")
    return problems


def quick_start_commands() -> list[str]:
    """The commands of the Quick start's code block, each split at `&&` and `|`."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the Quick start has no bash code block"
    commands = []
    for line in block.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            commands += [part.strip() for part in re.split(r"&&|\|", line) if part.strip()]
    return commands


def ci_commands() -> list[str]:
    """The set-up and test commands .ci/run runs."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if re.match(r"^\s*(bash scripts/|\.venv/bin/)", line)]


def test_the_experiments_readme_names_every_experiment():
    """Each file under experiments/ is named in its README (``device/x.py`` as written
    there), so none is left without the claim it checks."""
    folder = ROOT / "experiments"
    readme = (folder / "README.md").read_text()
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    unnamed = [f for f in files if f != "README.md" and "__pycache__" not in f]
    unnamed = [f for f in unnamed if f"`{f}" not in readme]
    assert files and unnamed == []


def test_the_readme_fits_on_a_few_screens():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_docs_pages_exist_and_the_readme_links_every_one():
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in links(README)
        if target.partition("#")[0]
    }
    docs = sorted(DOCS.glob("*.md"))
    assert docs, "docs/ has no pages"
    assert [page.name for page in docs if page.resolve() not in linked] == []


@pytest.mark.parametrize("path", pages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(path):
    assert broken_links(path) == []


def test_the_quick_start_keeps_the_commands_ci_and_users_run():
    ran = ci_commands()
    assert "bash scripts/setup.sh" in ran
    tests = [line for line in ran if line.startswith(".venv/bin/python -m pytest")]
    assert tests, ".ci/run does not run the tests with .venv/bin/python -m pytest"
    commands = quick_start_commands()
    assert commands.count("bash scripts/setup.sh") == 2  # set up for the answer, and the tests
    # The README's test command is CI's, less pytest's output options (-q).
    test_command = [word for word in shlex.split(tests[0]) if not word.startswith("-q")]
    assert " ".join(test_command) in commands
    assert any(command.startswith(".venv/bin/localspec complete") for command in commands), (
        "the Quick start does not answer a prompt with the default pair"
    )


def test_ci_checks_the_style_and_the_types_before_the_tests():
    """``.ci/run`` runs ruff and mypy as ``pyproject.toml`` configures them (mypy's
    ``files``: the package), before the test command."""
    ran = ci_commands()
    checks = [".venv/bin/ruff check .", ".venv/bin/ruff format --check localspec tests"]
    checks.append(".venv/bin/mypy")
    assert all(check in ran for check in checks), ran
    first_test = next(i for i, line in enumerate(ran) if "-m pytest" in line)
    assert all(ran.index(check) < first_test for check in checks)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["mypy"]["files"] == ["localspec"]


def test_the_glossary_defines_the_words_the_pages_lean_on():
    terms = anchors(DOCS / "glossary.md")
    for term in (
        "draft-target-and-draft-model", "round", "offer", "copy-and-a-copy-under-way", "resync",
        "passed-over-draft", "ceiling", "tokens-per-pass", "cold-and-warm", "exact-mode",
    ):  # fmt: skip
        assert term in terms


# The link check must be able to fail: a missing file, a missing anchor.


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## Exact mode\n\n## `--gpu-layers` and placement\n\n## Exact mode\n",
        encoding="utf-8",
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/page.md#exact-mode) [ok](docs/page.md#--gpu-layers-and-placement)\n"
        "[ok](docs/page.md#exact-mode-1) [ok](#here) [web](https://example.com/x)\n"
        "## Here\n"
        "```\n[in code](docs/missing.md)\n```\n"
        "`[inline](docs/missing.md)`\n"
        "[gone](docs/missing.md) [no anchor](docs/page.md#exact-mode-2)\n",
        encoding="utf-8",
    )
    assert broken_links(readme, root=tmp_path) == [
        "README.md:8: docs/missing.md: no such file",
        "README.md:8: docs/page.md#exact-mode-2: no heading with the anchor #exact-mode-2",
    ]


def test_slugs_follow_github():
    assert slug("Drafting without a second model: `self` and `lookahead`") == (
        "drafting-without-a-second-model-self-and-lookahead"
    )
    assert slug("Predicted outputs, and a question asked again") == (
        "predicted-outputs-and-a-question-asked-again"
    )
    assert slug("A draft from the target's own layers") == "a-draft-from-the-targets-own-layers"
    assert slug("Short steps (a stand-in for a GPU), and GPUs") == (
        "short-steps-a-stand-in-for-a-gpu-and-gpus"
    )
