"""The history of answers as a running session keeps and drafts from it, its settings read
at each use.

``KeptAnswers(library, fingerprint, client, keep=..., draft=..., named=...)`` is one
history (storage/library.py: one per tokenizer, and per client of a server):

- ``corpora()``: what to draft from for the answer about to begin. None while the history
  is off (``datastore history off``, ``LOCALSPEC_HISTORY=0``) unless ``named`` (a command's
  ``--store history``); else its corpora, opened again whenever its log changed since they
  were opened (an answer appended, a compaction, ``datastore rm history``), so a process
  that runs for days drafts from what the history holds now, never from what was forgotten.
- ``record(document)``: keep an answer, if ``keep`` and the history is on now.

Neither raises: each returns what went wrong as warnings, so that answering never fails
because of the history. ``kept_document`` is what the history keeps of an answer: the answer
after the last ``HISTORY_PROMPT_TOKENS`` tokens of its prompt, so that ``earlier_answer``
finds it when the question is asked again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from localspec.core.events import Finished, FinishReason
from localspec.storage.history import LOG_FILE, History
from localspec.storage.library import HISTORY, Library

Corpora = list[tuple[str, Any]]
HISTORY_PROMPT_TOKENS = 64  # of the prompt, kept before each answer in the history
HISTORY_MIN_TOKENS = 16  # shorter answers are not worth keeping


class KeptAnswers:
    def __init__(
        self,
        library: Library,
        fingerprint: str,
        client: str = "",
        *,
        keep: bool = True,
        draft: bool = True,
        named: bool = False,
    ) -> None:
        self.library = library
        self.fingerprint = fingerprint
        self.client = client
        self.keep = keep
        self.draft = draft
        self.named = named
        self._opened: tuple[Any, Corpora] | None = None  # the log's identity, its corpora

    @property
    def directory(self) -> Any:
        return self.library.history_dir(self.fingerprint, self.client)

    def corpora(self) -> tuple[Corpora, list[str]]:
        """``(corpora, warnings)`` for the next answer; see the module docstring."""
        if not self.draft:
            return [], []
        enabled, problem = self.library.history_setting()
        warnings = [problem] if problem else []
        if not (enabled or self.named):
            self._opened = None  # turned on again later: opened afresh
            return [], warnings
        try:
            identity = _identity(self.directory / LOG_FILE)
            if self._opened is None or self._opened[0] != identity:
                found = History(self.directory).open() if identity is not None else []
                self._opened = (identity, [(HISTORY, corpus) for corpus in found])
        except (OSError, ValueError) as err:  # filelock.Timeout is an OSError
            self._opened = None
            warnings.append(
                f"the history of answers was left out ({err}); "
                "forget it with: localspec datastore rm history"
            )
            return [], warnings
        return list(self._opened[1]), warnings

    def record(self, document: Sequence[int]) -> list[str]:
        """Keep an answer (with the end of its prompt) if the history is on; warnings."""
        if not self.keep:
            return []
        enabled, problem = self.library.history_setting()
        if not enabled:
            return [problem] if problem else []
        problem = self.library.record(self.fingerprint, document, self.client)
        return [problem] if problem else []


def _identity(path: Any) -> tuple[int, int, int, int] | None:
    """What tells one state of a log from another: the file and its size and time."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def kept_document(tokens: list[int], finished: Finished) -> list[int] | None:
    """What the history keeps of a finished answer to ``tokens``; None for a cancelled one
    or one too short to be worth keeping."""
    if finished.reason == FinishReason.CANCELLED or len(finished.token_ids) < HISTORY_MIN_TOKENS:
        return None
    # With the end of its prompt (the question and the template's turn header), so that
    # asking again matches at the answer's first token.
    return [*tokens[-HISTORY_PROMPT_TOKENS:], *finished.token_ids]


def earlier_answer(corpora: Corpora, tokens: list[int], max_tokens: int) -> tuple[int, ...]:
    """The answer the history among ``corpora`` kept for this very prompt (the same last
    ``HISTORY_PROMPT_TOKENS`` tokens: the question asked again): the one kept most often
    (else the longest) is as good a prediction as an editor's, drafted from its first
    token. Empty when there is none."""
    tail = tokens[-HISTORY_PROMPT_TOKENS:]
    for name, corpus in corpora:
        if name != HISTORY:
            continue
        match = corpus.longest_match(tail, n_max=len(tail), n_min=len(tail))
        runs = corpus.continuations(match, max_tokens) if match is not None else []
        if runs:
            return runs[0][0]
    return ()
