"""The ``apply`` prompt set: small edits of whole files, in the shape of OpenAI's predicted
outputs.

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
from pathlib import Path
from typing import Any

from localspec.errors import InputError

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
