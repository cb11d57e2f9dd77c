"""The option groups of what drafts are copied from and what is kept between answers.

- ``StoreChoice``: the datastores to draft from, and whether answers join the history
  store (``complete``, ``chat``); ``SharedStoreChoice``: those every client of ``serve``
  drafts from; ``fields()`` gives the ``ModelOptions`` fields they set.
- ``PromptCacheChoice``: whether prompts computed once are kept, and how much;
  ``parse_size(value, name)`` reads a size as people write it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any

from localspec.errors import UsageError
from localspec.options.model import COMMAND_LINE, Option, Spelling
from localspec.session.sizes import PROMPT_CACHE_SIZE_ENV, size_in_bytes


@dataclass(frozen=True)
class StoreChoice:
    """The datastores to draft from, and whether answers join the history store."""

    store: Annotated[
        list[str] | None,
        Option(
            "--store",
            metavar="NAME",
            help="draft from this datastore (repeatable; default: every store built with the "
            "target's tokenizer, the history of answers included)",
        ),
    ] = None
    no_store: Annotated[bool, Option("--no-store", help="draft from no datastore")] = False
    no_history: Annotated[
        bool, Option("--no-history", help="do not add answers to the history store")
    ] = False

    def fields(self, spelling: Spelling = COMMAND_LINE) -> dict[str, Any]:
        """The ``ModelOptions`` fields they set: ``stores`` and ``history``."""
        if self.store and self.no_store:
            store, no_store = spelling.option("store"), spelling.option("no_store")
            raise UsageError(f"{store} and {no_store} contradict each other", "give one of them")
        stores = () if self.no_store else (tuple(self.store) if self.store else None)
        return {"stores": stores, "history": not self.no_history}


def parse_size(value: Any, name: str) -> int | None:
    """A size as people write it (``64MB``, ``2GB``, ``512KiB``, a number of bytes) in
    bytes; None stays None (the default)."""
    if value is None:
        return None
    size = size_in_bytes(str(value))
    if size is None:
        raise UsageError(f"{name} {value!r} is not a size", "give e.g. 64MB, 2GB or 0 (off)")
    return size


@dataclass(frozen=True)
class PromptCacheChoice:
    """Whether prompts computed once are kept (session/prompt_state.py), and how much."""

    prompt_cache_size: Annotated[
        str | None,
        Option(
            "--prompt-cache-size",
            metavar="SIZE",
            help="bound of each prompt cache tier, e.g. 64MB or 2GB (default: "
            f"${PROMPT_CACHE_SIZE_ENV}, else from this machine's memory and free disk)",
            read=parse_size,
        ),
    ] = None
    no_prompt_cache: Annotated[
        bool, Option("--no-prompt-cache", help="neither restore nor save prompt states")
    ] = False

    def fields(self, tiers: tuple[str, ...], spelling: Spelling = COMMAND_LINE) -> dict[str, Any]:
        """The ``ModelOptions`` fields they set, for a front end that keeps ``tiers``."""
        size = parse_size(self.prompt_cache_size, spelling.option("prompt_cache_size"))
        if size is None:
            env = os.environ.get(PROMPT_CACHE_SIZE_ENV)
            size = parse_size(env, PROMPT_CACHE_SIZE_ENV) if env else None
        off = self.no_prompt_cache or size == 0
        return {"prompt_cache_tiers": () if off else tiers, "prompt_cache_size": size}


@dataclass(frozen=True)
class SharedStoreChoice(StoreChoice):
    """The datastores every client of a server drafts from: none unless named, and the
    user's own history neither kept nor shared unless ``--store`` names it. ``--no-store``
    and ``--no-history`` say what is already so: taken, not listed."""

    store: Annotated[
        list[str] | None,
        Option(
            "--store",
            metavar="NAME",
            help="draft every client's answers from this datastore too (repeatable; every "
            "client can probe it through timings: see docs/serve.md, Security)",
        ),
    ] = None
    no_store: Annotated[bool, Option("--no-store", hidden=True)] = False
    no_history: Annotated[bool, Option("--no-history", hidden=True)] = False

    def fields(self, spelling: Spelling = COMMAND_LINE) -> dict[str, Any]:
        return {"stores": tuple(self.store or ()), "history": False}
