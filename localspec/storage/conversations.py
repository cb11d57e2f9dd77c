"""Chat conversations as JSON files: the format, reading with validation, and the list of
recent ones.

A file holds ``SavedConversation``: ``format`` ("localspec-chat") and ``version``
(``FORMAT_VERSION``), the system prompt, the settings needed to continue (models as
resolved, sampling, max tokens), created/updated timestamps and the messages (user and
assistant alternating, starting with a user message; only finished answers are saved).

``read_conversation(path)`` returns the validated conversation or raises ``InputError``
with a one-line reason (missing, unreadable, not JSON, another format, a newer version,
invalid fields). ``write_conversation`` writes atomically (``statefiles.write_json``) and returns
"" or why it failed. Autosaved conversations live in ``models.paths.conversations_dir()``,
one file per conversation named from its start time (``autosave_path``); ``recent(n)``
lists the newest first (by file time), skipping files that do not read, and
``resolve_resume`` turns ``last``, an index of that list or a path into a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from localspec.errors import InputError, validation_problem
from localspec.models.paths import conversations_dir
from localspec.statefiles import write_json

FORMAT = "localspec-chat"
FORMAT_VERSION = 1
RECENT = 20  # how many conversations --recent lists


class ChatSettings(BaseModel):
    """What a conversation ran with, so that it can go on the same way."""

    model_config = ConfigDict(extra="forbid")

    target: str | None = None  # the model's description, as the chat showed it
    target_path: str | None = None  # the file it was loaded from
    draft: str | None = None
    draft_path: str | None = None
    temperature: float = Field(0.0, ge=0.0)
    top_k: int = Field(40, ge=0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, lt=1.0)
    seed: int | None = Field(None, ge=0)
    max_tokens: int = Field(1024, ge=1)
    drafter: str = "auto"


class SavedMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str
    # Assistant messages only: how the answer ended (a FinishReason value or "error"), and
    # whether it had been dropped from the model's context to make room.
    finish: str | None = None
    dropped: bool = False


class SavedConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["localspec-chat"] = "localspec-chat"
    version: int = FORMAT_VERSION
    created: datetime
    updated: datetime
    system: str | None = None
    settings: ChatSettings = Field(default_factory=ChatSettings)
    messages: list[SavedMessage] = Field(default_factory=list)

    @model_validator(mode="after")
    def _alternating(self) -> SavedConversation:
        for i, message in enumerate(self.messages):
            expected = "user" if i % 2 == 0 else "assistant"
            if message.role != expected:
                raise ValueError(f"message {i + 1} should be from the {expected}")
        if len(self.messages) % 2:
            raise ValueError("the last user message has no answer")
        return self

    def exchanges(self) -> list[tuple[str, SavedMessage]]:
        """(user text, assistant message) pairs, oldest first."""
        m = self.messages
        return [(m[i].content, m[i + 1]) for i in range(0, len(m), 2)]


def autosave_path(created: datetime, folder: Path | None = None) -> Path:
    """A new file for a conversation started at ``created``: never an existing one."""
    folder = folder or conversations_dir()
    stem = f"chat-{created:%Y%m%d-%H%M%S}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        path, n = folder / f"{stem}-{n}.json", n + 1
    return path


def write_conversation(path: Path, conversation: SavedConversation) -> str:
    return write_json(path, conversation.model_dump(mode="json"))


def _unreadable(path: Path, why: str) -> InputError:
    return InputError(
        f"cannot resume {path}: {why}", "localspec chat --recent lists the saved conversations"
    )


def read_conversation(path: Path) -> SavedConversation:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _unreadable(path, "no such file") from None
    except IsADirectoryError:
        raise _unreadable(path, "it is a directory") from None
    except UnicodeDecodeError:
        raise _unreadable(path, "not UTF-8 text") from None
    except OSError as err:
        raise _unreadable(path, err.strerror or str(err)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _unreadable(path, f"not JSON ({err.msg}, line {err.lineno})") from None
    except RecursionError:
        raise _unreadable(path, "not JSON (nested too deeply)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _unreadable(path, "not a localspec conversation file")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise _unreadable(
            path, f"format version {version!r}; this localspec reads version {FORMAT_VERSION}"
        )
    try:
        return SavedConversation.model_validate(data)
    except ValidationError as err:
        where, msg = validation_problem(err)
        raise _unreadable(path, f"damaged ({where or 'file'}: {msg})") from None


@dataclass(frozen=True)
class RecentConversation:
    path: Path
    conversation: SavedConversation

    @property
    def turns(self) -> int:
        return len(self.conversation.messages) // 2

    def first_line(self, width: int = 50) -> str:
        messages = self.conversation.messages
        lines = messages[0].content.strip().splitlines() if messages else []
        line = lines[0].strip() if lines else ""
        return line if len(line) <= width else line[: width - 1] + "…"


def recent(limit: int = RECENT, folder: Path | None = None) -> list[RecentConversation]:
    """The newest readable conversations in ``folder``, newest first (by file time, which
    every autosave updates)."""
    folder = folder or conversations_dir()
    try:
        paths = [p for p in folder.glob("*.json") if p.is_file()]
    except OSError:
        return []
    paths.sort(key=_mtime, reverse=True)
    found: list[RecentConversation] = []
    for path in paths:
        try:
            found.append(RecentConversation(path, read_conversation(path)))
        except InputError:
            continue  # a damaged file does not hide the others
        if len(found) == limit:
            break
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def resolve_resume(value: str) -> Path:
    """``--resume``'s file: ``last`` (the newest saved), an index of ``--recent``'s list,
    or a path."""
    if value == "last" or (value.isdigit() and not Path(value).exists()):
        index = 1 if value == "last" else int(value)
        found = recent(max(index, 1))
        if index < 1 or len(found) < index:
            where = conversations_dir()
            what = "no saved conversation" if not found else f"no conversation number {index}"
            raise InputError(f"{what} in {where}", "localspec chat --recent lists them")
        return found[index - 1].path
    return Path(value).expanduser()
