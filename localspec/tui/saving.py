"""What the chat records about how it runs, and checks when a saved conversation resumes.

``chat_settings(session, params)`` is the ``ChatSettings`` a conversation file keeps: the
loaded models (description and file) and the sampling settings. ``model_mismatch(session,
settings)`` is a one-line warning when a resumed conversation was held with other models
than the ones loaded now ("" when they are the same); a role with no model loaded (no draft
with ``--drafter ngram``) never differs. ``same_file`` compares paths as resolved.
"""

from __future__ import annotations

from pathlib import Path

from localspec.core.params import GenerationParams
from localspec.storage.conversations import ChatSettings
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
