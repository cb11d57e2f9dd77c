"""What the chat records about how it runs, and checks when a saved conversation resumes.

``chat_settings(session, params)`` is the ``ChatSettings`` a conversation file keeps: the
loaded models (description and file) and the sampling settings. ``model_mismatch(session,
settings)`` is a one-line warning when a resumed conversation was held with other models
than the ones loaded now ("" when they are the same); a role with no model loaded (no draft
with ``--drafter ngram``) never differs. ``same_file`` compares paths as resolved.
``transcript_header`` heads a saved Markdown transcript. ``ChatFiles`` writes one chat's
conversation: autosaved after each answer, and saved on demand.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from localspec.core.params import GenerationParams
from localspec.storage.conversations import (
    ChatSettings,
    SavedConversation,
    autosave_path,
    write_conversation,
)
from localspec.tui.conversation import Conversation, describe_params, save_transcript
from localspec.tui.worker import ChatSession


def chat_settings(session: ChatSession | None, params: GenerationParams) -> ChatSettings:
    target_path = session.target_path if session else None
    draft_path = session.draft_path if session else None
    return ChatSettings(
        target=session.target_label if session else None,
        target_path=str(target_path) if target_path else None,
        draft=session.draft_label if session else None,
        draft_path=str(draft_path) if draft_path else None,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        seed=params.seed,
        max_tokens=params.max_tokens,
        drafter=params.drafter.value,
    )


def transcript_header(
    session: ChatSession | None, params: GenerationParams, system: str | None
) -> dict[str, str]:
    """The lines heading a saved Markdown transcript: the models, then the settings."""
    header = {"parameters": describe_params(params)}
    if system:
        header["system prompt"] = system
    if session is not None:
        header = {
            "target": session.target_label,
            "draft": session.draft_label or "none",
            **header,
        }
    return header


def model_mismatch(session: ChatSession, settings: ChatSettings) -> str:
    problems = []
    for role, label, path, saved_label, saved_path in (
        ("target", session.target_label, session.target_path, settings.target,
         settings.target_path),
        ("draft", session.draft_label, session.draft_path, settings.draft, settings.draft_path),
    ):  # fmt: skip
        if label is None and path is None:
            continue
        if saved_path and path:
            differs = not same_file(Path(saved_path), Path(path))
        else:  # a file without paths (written by hand): the descriptions decide
            differs = bool(saved_label) and saved_label != label
        if differs:
            problems.append(f"{role} {saved_label or saved_path}")
    if not problems:
        return ""
    return (
        f"This conversation was held with {' and '.join(problems)}; it goes on with the "
        "models loaded now."
    )


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


class ChatFiles:
    """Where one chat's conversation is written: after each finished answer to its one
    file in the conversations folder (``folder``; ``file`` is None until the first save),
    and on Ctrl+S as a Markdown transcript and a conversation file in ``save_dir`` (None:
    the current directory at the time of saving)."""

    def __init__(
        self,
        params: GenerationParams,
        clock: Callable[[], datetime],
        created: datetime,
        *,
        autosave: bool,
        resume_path: Path | None,
        folder: Path,
        save_dir: Path | None,
    ) -> None:
        self.params, self.clock, self.created = params, clock, created
        self.autosave_on, self.save_dir = autosave, save_dir
        # A resumed conversation goes on in its own file when it is one of the autosaved
        # ones, else in a new file there.
        self.file: Path | None = None
        if resume_path is not None and same_file(resume_path.parent, folder):
            self.file = resume_path
        self._failed = False

    def restart(self) -> None:
        """A new conversation: a new creation time, and a new file from its first answer."""
        self.created = self.clock()
        self.file = None

    def snapshot(
        self, conversation: Conversation, session: ChatSession | None, now: datetime | None = None
    ) -> SavedConversation:
        settings = chat_settings(session, self.params)
        return conversation.to_saved(settings, self.created, now or self.clock())

    def autosave(self, conversation: Conversation, session: ChatSession | None) -> str:
        """Write the conversation once it has a finished turn. Returns the problem when
        writing fails for the first time, else "" (said once, not after every answer)."""
        if not self.autosave_on or not any(turn.done for turn in conversation.turns):
            return ""
        if self.file is None:
            self.file = autosave_path(self.created)
        problem = write_conversation(self.file, self.snapshot(conversation, session))
        if not problem or self._failed:
            return ""
        self._failed = True
        return problem

    def save(self, conversation: Conversation, session: ChatSession | None) -> tuple[Path, Path]:
        """Write the transcript and the conversation file to new files; returns both paths.
        Raises ``OSError`` when either cannot be written."""
        folder = self.save_dir or Path.cwd()
        now = self.clock()
        header = transcript_header(session, self.params, conversation.system)
        saved = self.snapshot(conversation, session, now)
        return save_transcript(conversation, folder, header, saved, now)
