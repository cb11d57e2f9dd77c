"""The bench's prompts: the shipped sets, the ``apply`` set built from the standard library,
the check sets, and a user's own prompt file.

``load_prompts`` reads the shipped sets (``prompts/<category>.jsonl``, one
``{"id", "prompt", "source"}`` per line); ``load_prompt_file`` reads a user's own JSONL file
(``prompt`` required; ``id``, ``category``, ``source`` default to ``line-N``, the file's stem
and its path; an optional ``prediction`` is what mode ``auto-prediction`` drafts from, an
optional ``first`` the question mode ``auto-again`` asks before; an optional ``json_schema``
or ``tools`` makes every mode answer under that grammar: ``bench/constrained.py``). Bad sets
and files raise ``InputError``, bad choices (``--categories``, ``--limit``) ``UsageError``.

The constrained sets (``CONSTRAINED_CATEGORIES``: extraction, tool calls, schema-bound
prose), run only when named, are shipped sets whose every line carries its ``json_schema`` or
``tools``.

The check sets (``CHECK_SETS``) are prompts written to check results on text the bench was
not tuned on, run only when named: each is a file of ``prompts/`` read as a user's file is,
whose lines name their own categories (``code_completion``, ``chat_qa``...), so its records
and summary are per category as the shipped sets' are, and ``--limit`` counts per category.
Sets that hold the same prompt (``check3`` and ``check3_unrelated``) are refused together.

The ``apply`` set: small edits of whole files, in the shape of OpenAI's predicted outputs.
Each line of ``prompts/apply.jsonl`` names a module of the running Python's standard library
(source the project does not ship, 100-200 lines) and an instruction for a small change.
The prompt is the instruction and the whole file; the prediction is the file itself; the
answer is the whole new file, so a run may write as many tokens as the file has and a few
more (``BenchPrompt.answer_like_prediction``). A module this Python does not have is left
out of the set.
"""

from __future__ import annotations

import json
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from localspec.bench.constrained import CONSTRAINED_CATEGORIES, Constraint, read_constraint
from localspec.errors import InputError, UsageError

CATEGORIES = (
    "code_completion",
    "code_rewrite",
    "chat_qa",
    "summarization",
    "translation",
    "math",
)
# Prompts whose answers may reuse a corpus: run only when asked for by name, beside a store
# of that corpus (``repo_code``: this project's own source, ``localspec datastore add``).
STORE_CATEGORIES = ("repo_code",)
# Edits of whole files with the file as the prediction (the ``apply`` set below): answers of a
# thousand tokens and more, so run only when asked for by name.
PREDICTION_CATEGORIES = ("apply",)
# Prompts the bench was not tuned on (see the module docstring), run only when named:
# completions in eight languages, rewrites and prose (24 each); check3 with another of its
# prompts as each one's prediction (mode auto-prediction); follow-up questions, each with
# the ``first`` question it follows (mode auto-again).
CHECK_SETS = ("check3", "check4", "check3_unrelated", "history_followup")
PROMPT_FILE_HINT = 'one JSON object per line, e.g. {"prompt": "...", "category": "mine"}'
SOURCE = "the standard library of the Python that runs localspec"
INSTRUCTION_TAIL = "Reply with the whole new file in one Python code block, and nothing else."


_FENCE = re.compile(r"^(`{3,})[^\n`]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def first_code_block(text: str) -> str | None:
    """The text of the first fenced code block of ``text`` (a rewrite prompt's function,
    the prediction of mode ``auto-prediction`` for a prompt that gives none)."""
    found = _FENCE.search(text)
    return found.group(2) if found else None


def stdlib_file(module: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"


def apply_prompt(row: dict[str, Any], where: str) -> tuple[str, str, str, str] | None:
    """``(id, prompt, prediction, source)`` of a line of the set; None when this Python has
    no such module."""
    try:
        module, instruction, prompt_id = row["module"], row["instruction"], str(row["id"])
    except (KeyError, TypeError):
        raise InputError(
            f"{where}: not a JSON object with id, module and instruction",
            "fix or reinstall the prompt set",
        ) from None
    path = stdlib_file(str(module))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    prompt = f"{instruction} {INSTRUCTION_TAIL}\n\n```python\n{text.rstrip()}\n```"
    return prompt_id, prompt, text, f"{SOURCE}: {path.name}"


def parse_line(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError:
        raise InputError(f"{where}: not JSON", "fix or reinstall the prompt set") from None
    if not isinstance(row, dict):
        raise InputError(f"{where}: not a JSON object", "fix or reinstall the prompt set")
    return row


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    id: str
    prompt: str
    source: str
    prediction: str | None = None  # what the answer will mostly be (mode auto-prediction)
    first: str | None = None  # the question asked before this one (mode auto-again)
    # The answer is the prediction rewritten: it may run as long as the prediction and
    # ``ANSWER_SLACK`` tokens more, whatever --max-tokens says.
    answer_like_prediction: bool = False
    constraint: Constraint | None = None  # the grammar every mode answers under

    def predicted(self) -> str | None:
        """The prediction mode ``auto-prediction`` gives: the prompt's own, else the text
        of its first code block (the function a rewrite prompt quotes)."""
        return self.prediction if self.prediction is not None else first_code_block(self.prompt)


def _prompt_file(category: str, directory: Path | None) -> Any:
    if directory is not None:
        return directory / f"{category}.jsonl"
    return resources.files("localspec.bench") / "prompts" / f"{category}.jsonl"


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError(f"invalid --limit {limit}: must be at least 1", "e.g. --limit 3")


def load_prompts(
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    directory: Path | None = None,
) -> list[BenchPrompt]:
    """The prompts of ``categories`` (all but those run when named, by default), at most
    ``limit`` per category; a check set's per each category its lines name."""
    chosen = list(dict.fromkeys(categories)) if categories else list(CATEGORIES)
    known = (
        CATEGORIES + STORE_CATEGORIES + PREDICTION_CATEGORIES + CONSTRAINED_CATEGORIES + CHECK_SETS
    )
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise UsageError(
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}",
            f"choose among {', '.join(known)}",
        )
    _check_limit(limit)
    prompts: list[BenchPrompt] = []
    for category in chosen:
        path = _prompt_file(category, directory)
        if category in CHECK_SETS:
            prompts.extend(_limited(_read_prompt_file(path), limit))
        else:
            prompts.extend(_shipped_set(category, path)[:limit])
    _check_distinct(prompts, chosen)
    return prompts


def _check_distinct(prompts: list[BenchPrompt], chosen: list[str]) -> None:
    """Runs are paired by (category, id): two sets may not give the same prompt."""
    seen: set[tuple[str, str]] = set()
    for p in prompts:
        if (p.category, p.id) in seen:
            raise UsageError(
                f"two of the categories {', '.join(chosen)} hold the prompt {p.category}/{p.id}",
                "run them in separate benches",
            )
        seen.add((p.category, p.id))


def _shipped_set(category: str, path: Any) -> list[BenchPrompt]:
    """The prompts of one shipped set, in file order."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise InputError(
            f"cannot read the prompt set {path}: {err.strerror}", "reinstall localspec"
        ) from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if category in PREDICTION_CATEGORIES:
            made = apply_prompt(parse_line(line, f"{path}, line {n}"), f"{path}, line {n}")
            if made is not None:
                prompt_id, text, prediction, source = made
                rows.append(
                    BenchPrompt(
                        category, prompt_id, text, source, prediction, answer_like_prediction=True
                    )
                )
            continue
        row = parse_line(line, f"{path}, line {n}")
        try:
            prompt = BenchPrompt(category, str(row["id"]), row["prompt"], row["source"])
        except KeyError:
            raise InputError(
                f"{path}, line {n}: not a JSON object with id, prompt and source",
                "fix or reinstall the prompt set",
            ) from None
        constrained = read_constraint(row, f"{path}, line {n}")
        if category in CONSTRAINED_CATEGORIES and constrained is None:
            raise InputError(
                f"{path}, line {n}: no json_schema or tools", "fix or reinstall the prompt set"
            )
        rows.append(replace(prompt, constraint=constrained))
    return rows


def _file_prompt(path: Any, n: int, line: str) -> BenchPrompt:
    """Line ``n`` of a user's prompt file, with the defaults filled in."""
    try:
        row = json.loads(line)
    except ValueError as err:
        raise InputError(f"{path}, line {n}: not JSON ({err})", PROMPT_FILE_HINT) from None
    if not isinstance(row, dict):
        raise InputError(f"{path}, line {n}: not a JSON object", PROMPT_FILE_HINT)
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f'{path}, line {n}: no non-empty string "prompt"', PROMPT_FILE_HINT)
    category = row.get("category", Path(path.name).stem)
    if not isinstance(category, str) or not category.strip():
        raise InputError(
            f'{path}, line {n}: "category" must be a non-empty string', PROMPT_FILE_HINT
        )
    for key in ("prediction", "first"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise InputError(f'{path}, line {n}: "{key}" must be a string', PROMPT_FILE_HINT)
    return BenchPrompt(
        category=category,
        id=str(row.get("id", f"line-{n}")),
        prompt=prompt,
        source=str(row.get("source", path)),
        prediction=row.get("prediction"),
        first=row.get("first"),
        constraint=read_constraint(row, f"{path}, line {n}"),
    )


def _read_prompt_file(path: Any) -> list[BenchPrompt]:
    """A prompt file's prompts (``path``: a ``Path``, or a check set's packaged file)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise InputError(
            f"cannot read the prompt file {path}: {err.strerror}", "check the --prompts path"
        ) from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text", PROMPT_FILE_HINT) from None
    prompts: list[BenchPrompt] = []
    seen: dict[tuple[str, str], int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompt = _file_prompt(path, n, line)
        key = (prompt.category, prompt.id)
        if key in seen:  # runs are paired by (category, id): a repeat would mix two prompts
            raise InputError(
                f"{path}, line {n}: id {prompt.id!r} repeats line {seen[key]} "
                f"in category {prompt.category!r}",
                "give every prompt of a category its own id",
            )
        seen[key] = n
        prompts.append(prompt)
    if not prompts:
        raise InputError(f"{path} holds no prompts", PROMPT_FILE_HINT)
    return prompts


def load_prompt_file(
    path: Path, categories: Sequence[str] | None = None, limit: int | None = None
) -> list[BenchPrompt]:
    """A user's own prompts (JSONL), in file order; ``categories`` filters by the file's
    categories, ``limit`` keeps at most that many per category."""
    _check_limit(limit)
    prompts = _read_prompt_file(Path(path))
    present = list(dict.fromkeys(p.category for p in prompts))
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise UsageError(
                f"{path} has no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                f"{', '.join(unknown)}",
                f"its categories: {', '.join(present)}",
            )
        prompts = [p for p in prompts if p.category in categories]
    return _limited(prompts, limit)


def _limited(prompts: list[BenchPrompt], limit: int | None) -> list[BenchPrompt]:
    """At most ``limit`` prompts per category, in order."""
    kept: list[BenchPrompt] = []
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
        if limit is None or counts[p.category] <= limit:
            kept.append(p)
    return kept
