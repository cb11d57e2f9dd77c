"""The chat history behind the TUI, with no widgets in it.

A ``Conversation`` is a list of ``Turn``s (a user message and the answer it got). It decides
what the model sees: ``messages()`` returns the chat-template messages of every turn still in
the context, then the new user message. A turn leaves the model's context (but stays in the
transcript) when its answer is empty (stopped before the first token) or when it was dropped
to make room. ``turns_to_drop`` finds how many of the oldest turns must go for a prompt to
fit; ``save_transcript`` writes the Markdown transcript and the JSON conversation to new,
timestamped files; ``last_code_block`` finds what Ctrl+O copies. ``to_saved`` and
``from_saved`` convert to and from the JSON file format (``storage.conversations``), which
holds finished turns only, without their stats (a resumed turn starts with none).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from markdown_it import MarkdownIt

from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.storage.conversations import (
    ChatSettings,
    SavedConversation,
    SavedMessage,
    write_conversation,
)

Message = dict[str, str]

_turn_ids = itertools.count(1)


@dataclass
class Turn:
    user: str
    answer: str = ""
    finish: str | None = None  # a FinishReason value, "error", or None while generating
    stats: GenerationStats = field(default_factory=GenerationStats)  # the answer's
    dropped: bool = False  # left out of the context to make room
    id: int = field(default_factory=lambda: next(_turn_ids))

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def in_context(self) -> bool:
        return self.done and not self.dropped and bool(self.answer)


def turn_messages(turn: Turn) -> list[Message]:
    return [
        {"role": "user", "content": turn.user},
        {"role": "assistant", "content": turn.answer},
    ]


def build_messages(system: str | None, turns: list[Turn], user: str) -> list[Message]:
    """Chat-template messages: the system prompt, the given turns, then the new message."""
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    for turn in turns:
        messages.extend(turn_messages(turn))
    messages.append({"role": "user", "content": user})
    return messages


def turns_to_drop(
    system: str | None,
    turns: list[Turn],
    user: str,
    count_tokens: Callable[[list[Message]], int],
    limit: int,
) -> tuple[int, int] | None:
    """Fewest oldest turns to drop so that the prompt fits in ``limit`` tokens.

    Returns ``(dropped, prompt_tokens)``, or None when even the new message alone does not fit.
    Counting is a tokenization of the whole prompt, so the search is linear from the fewest
    drops: conversations that overflow usually need only one or two turns dropped.
    """
    for dropped in range(len(turns) + 1):
        n = count_tokens(build_messages(system, turns[dropped:], user))
        if n <= limit:
            return dropped, n
    return None


class Conversation:
    """Turns of one chat, oldest first; the last one may still be generating."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system
        self.turns: list[Turn] = []

    @property
    def pending(self) -> Turn | None:
        if self.turns and not self.turns[-1].done:
            return self.turns[-1]
        return None

    def context_turns(self) -> list[Turn]:
        return [t for t in self.turns if t.in_context]

    def messages(self, user: str) -> list[Message]:
        return build_messages(self.system, self.context_turns(), user)

    def start(self, user: str) -> Turn:
        if self.pending is not None:
            raise RuntimeError("the previous answer has not finished")
        turn = Turn(user=user)
        self.turns.append(turn)
        return turn

    def finish(self, answer: str, reason: str, stats: GenerationStats | None = None) -> Turn:
        turn = self.pending
        if turn is None:
            raise RuntimeError("no answer is being generated")
        turn.answer = answer
        turn.finish = reason
        turn.stats = stats if stats is not None else GenerationStats()
        return turn

    def discard_pending(self) -> Turn | None:
        """Forget the turn being generated (its prompt never reached the model)."""
        turn = self.pending
        if turn is not None:
            self.turns.pop()
        return turn

    def drop_oldest(self, n: int) -> list[Turn]:
        """Take the ``n`` oldest turns still in context out of it; returns them."""
        dropped = self.context_turns()[:n]
        for turn in dropped:
            turn.dropped = True
        return dropped

    def clear(self) -> None:
        self.turns.clear()

    def last_done(self) -> Turn | None:
        """The last turn, when its answer has finished."""
        return self.turns[-1] if self.turns and self.turns[-1].done else None

    def remove_last(self) -> Turn:
        """Take the last, finished turn out of the conversation (to answer it again)."""
        if self.last_done() is None:
            raise RuntimeError("no finished turn to remove")
        return self.turns.pop()

    def to_saved(
        self, settings: ChatSettings, created: datetime, updated: datetime
    ) -> SavedConversation:
        messages: list[SavedMessage] = []
        for turn in self.turns:
            if turn.done:  # an answer still being written is saved once it finishes
                messages.append(SavedMessage(role="user", content=turn.user))
                messages.append(
                    SavedMessage(
                        role="assistant",
                        content=turn.answer,
                        finish=turn.finish,
                        dropped=turn.dropped,
                    )
                )
        return SavedConversation(
            created=created,
            updated=updated,
            system=self.system,
            settings=settings,
            messages=messages,
        )

    @classmethod
    def from_saved(cls, saved: SavedConversation, system: str | None = None) -> Conversation:
        """The conversation of a file; ``system`` replaces its system prompt when given."""
        conversation = cls(system if system is not None else saved.system)
        for user, answer in saved.exchanges():
            conversation.turns.append(
                Turn(
                    user=user,
                    answer=answer.content,
                    finish=answer.finish or "eos",
                    dropped=answer.dropped,
                )
            )
        return conversation

    def to_markdown(self, header: dict[str, str], now: datetime) -> str:
        lines = [f"# localspec chat, {now:%Y-%m-%d %H:%M:%S}", ""]
        lines += [f"- {key}: {value}" for key, value in header.items()]
        for turn in self.turns:
            lines += ["", "## You", "", turn.user, "", "## Assistant", ""]
            lines.append(turn.answer if turn.answer else "_(no answer)_")
            note = answer_note(turn)
            if note:
                lines += ["", f"_{note}_"]
        return "\n".join(lines).rstrip() + "\n"


def answer_note(turn: Turn) -> str:
    """One line under an answer: how it ended and what it cost."""
    parts: list[str] = []
    if turn.finish == "cancelled":
        parts.append("stopped")
    elif turn.finish == "error":
        parts.append("failed")
    elif turn.finish == "length":
        parts.append("cut at the token limit")
    elif turn.finish is None:
        parts.append("generating")
    if turn.dropped:
        parts.append("dropped from the context")
    stats = turn.stats
    if stats.generated_tokens:
        parts.append(f"{stats.generated_tokens} tokens")
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
        if stats.drafted:
            parts.append(f"acceptance {stats.acceptance_rate:.0%}")
            parts.append(f"{stats.mean_accepted_length:.2f} tokens/pass")
    return " · ".join(parts)


def describe_params(params: GenerationParams) -> str:
    sampling = "greedy" if params.greedy else f"temperature {params.temperature:g}"
    return f"{sampling}, drafter {params.drafter}, at most {params.max_tokens} tokens"


def last_code_block(text: str) -> str | None:
    """The content of the last fenced code block in Markdown ``text`` (an unclosed fence
    runs to the end, as when an answer was stopped inside it); None when there is none."""
    fences = [t.content for t in MarkdownIt("commonmark").parse(text) if t.type == "fence"]
    return fences[-1] if fences else None


def transcript_stem(folder: Path, now: datetime) -> Path:
    """``folder/localspec-chat-<timestamp>``, numbered so that neither its ``.md`` nor its
    ``.json`` exists yet."""
    base = f"localspec-chat-{now:%Y%m%d-%H%M%S}"
    stem, n = folder / base, 1
    while stem.with_suffix(".md").exists() or stem.with_suffix(".json").exists():
        stem, n = folder / f"{base}-{n}", n + 1
    return stem


def save_transcript(
    conversation: Conversation,
    folder: Path,
    header: dict[str, str],
    saved: SavedConversation,
    now: datetime,
) -> tuple[Path, Path]:
    """Write the transcript to ``localspec-chat-<timestamp>.md`` in ``folder`` and the
    conversation file (``saved``) beside it as ``.json``, never over existing files; returns
    both paths. Raises ``OSError`` when either cannot be written."""
    stem = transcript_stem(folder, now)
    markdown, data = stem.with_suffix(".md"), stem.with_suffix(".json")
    markdown.write_text(conversation.to_markdown(header, now), encoding="utf-8")
    problem = write_conversation(data, saved)
    if problem:
        raise OSError(problem)
    return markdown, data
