"""Keeping a server's clients apart: what the worker does before another client's job.

``keep_apart(history)`` is the worker's ``on_client`` (serve/worker.py). Before the first
job of a client other than the last one's it empties both models' caches (no prompt's
prefix is reused for another client, so ``cache_n`` says nothing of what others asked;
what they held goes to the prompt cache's memory as the last client's own, restored only
for that client's prompts),
starts the drafters again from what the session restored at start (nothing learned from
another client's answers carries over), and gives the client its own history of answers
when the server keeps them (``--history``): ``history/<fingerprint>-<client>`` in the
datastores, kept and drafted from by that client alone. Histories the server was told to
share (``--store history``) stay attached for every client: docs/serve.md (Security) says
that every client can then probe them through its timings.
"""

from __future__ import annotations

from localspec.serve.worker import OnClient
from localspec.session.session import Session
from localspec.storage.answers import KeptAnswers
from localspec.storage.library import Library, vocabulary_fingerprint

KEYLESS = "local"  # the history's name for the clients of a server without keys


def keep_apart(history: bool) -> OnClient:
    def begin_client(session: Session, client: str) -> None:
        session.forget_context(client or "")
        session.restart_learning()
        own = []
        if history:
            fingerprint = vocabulary_fingerprint(session.target)
            own = [KeptAnswers(Library(), fingerprint, client or KEYLESS)]
        session.own_answers(own)

    return begin_client
