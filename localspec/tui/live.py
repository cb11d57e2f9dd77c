"""What the chat counts while it answers, with no widgets in it.

``LiveStats`` folds engine events into two ``GenerationStats`` (the last answer and the whole
conversation), keeps the acceptance of recent drafting rounds for the sparkline, the last
round (its drafter and draft length) and the context budget. It does no arithmetic of its
own beyond that: rates come from ``GenerationStats``.
"""

from __future__ import annotations

from collections import deque

from localspec.core.events import PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.stats import GenerationStats

SPARK_ROUNDS = 32  # drafting rounds shown in the sparkline


class LiveStats:
    """Running figures for the panel, fed every event of every answer."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.answer = GenerationStats()
        self.chat = GenerationStats()
        self.recent: deque[float] = deque(maxlen=SPARK_ROUNDS)
        self.last_round: RoundCompleted | None = None
        self.prompt_tokens = 0  # prompt of the latest answer, the conversation so far
        self.context_tokens = 0

    def begin_answer(self) -> None:
        self.answer = GenerationStats()
        self.last_round = None

    def observe(self, event: object) -> None:
        self.answer.observe(event)
        self.chat.observe(event)
        if isinstance(event, PrefillDone):
            self.prompt_tokens = event.prompt_tokens
            self.context_tokens = event.prompt_tokens
        elif isinstance(event, TokenEmitted):
            self.context_tokens = self.prompt_tokens + self.answer.generated_tokens
        elif isinstance(event, RoundCompleted):
            self.last_round = event
            if event.drafted:
                self.recent.append(event.accepted / event.drafted)
