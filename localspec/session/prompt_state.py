"""A pair's prompts computed once: restored from the prompt cache before an answer, kept after.

``PromptState`` is what a ``Session`` (each lane's) does with ``storage.prompt_cache``:

- ``restore(target, draft, prompt)``, before the engine evaluates the prompt: where a saved
  entry of this pair shares a longer prefix with the prompt than the target's cache does,
  and reading it costs less than evaluating that much, both models' sequences are restored
  from it (the draft model's where the entry has its part and it is loaded); the engine then
  evaluates only the rest. Returns the ``Restored`` the answer's ``PrefillDone`` reports.
- ``keep(target, draft, prefill_s)``, after an answer: the target's sequence (the prompt and
  the answer) and the draft model's are saved, in the tiers this session keeps, where the
  tokens new to the cache are worth it: at least ``MIN_TOKENS``, and for the disk, their
  evaluation (``prefill_s`` a token, measured on this machine) costing at least
  ``WORTH`` times a write and a read of their state at the disk's measured rate.
- ``stash(target, draft)``: a server's lane about to take another client's prompt, or a
  prompt its cache shares little with, keeps what it holds in memory first.

``prompt_key`` binds entries to what made them: the model files (path, size, times, inode),
the runtime recipe (exact mode's cache type and kernels, flash attention, where the layers
run) and llama.cpp's and localspec's versions. Entries made under any other key are never
found. ``owner`` is the client of a server (a key's fingerprint), "" elsewhere.

With ``--exact`` a restored state is bitwise the one the cold evaluation computed and the
rest is evaluated by batch-invariant kernels, so the answer is token for token the cold one.
Without it the kernels' sums depend on how tokens were batched, so a warm answer can part
from a cold one where two tokens' logits nearly tie, as any answer after a cached prefix can.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec import __version__
from localspec.backend.llama import LlamaLane
from localspec.core.cached_model import common_prefix_length
from localspec.core.events import Restored
from localspec.errors import BackendError
from localspec.models.paths import prompt_cache_dir
from localspec.session.loading import DraftSlot
from localspec.session.sizes import default_bounds
from localspec.storage.prompt_cache import (
    DISK,
    MEMORY,
    DiskTier,
    Entry,
    MemoryTier,
    PromptCache,
    Saved,
    as_tokens,
)

MIN_TOKENS = 64  # a shorter prompt is evaluated in less time than a restore's bookkeeping
MIN_GAIN = 64  # a restore must spare at least this many tokens (a chat template's head is ~20)
# Saved to disk only where evaluating the tokens costs this many times a write and a read.
WORTH = 2.0


def file_identity(path: Path | None) -> list[Any]:
    if path is None:
        return []
    st = Path(path).stat()
    return [str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def prompt_key(path: Path | None, recipe: dict[str, Any]) -> str:
    """The key of one model's saved states: its file and the runtime that fills its cache."""
    made = {
        "file": file_identity(path), "recipe": recipe, "localspec": __version__,
    }  # fmt: skip
    return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()


@dataclass
class PromptState:
    cache: PromptCache
    key: str
    draft_key: str
    disk: bool  # whether answers are kept on disk (else in memory only)
    memory: bool  # whether answers are kept in memory
    owner: str = ""
    fallback_prefill_s: float = 0.0  # a token's evaluation before one is measured

    def restore(
        self,
        target: LlamaLane,
        draft: LlamaLane | None,
        prompt: list[int],
        warnings: list[str],
        slot: DraftSlot | None = None,
    ) -> Restored | None:
        """See the module docstring. ``slot``: the draft model's, still loading or left for
        later: the entry's draft part is restored into the model once it is loaded, so a
        draft model taken up during the answer does not evaluate the prompt again."""
        if slot is not None:
            slot.on_loaded = None
        head = prompt[:-1]  # what the engine evaluates before its first round
        held = common_prefix_length(target.cached, head)
        if len(head) - held < MIN_GAIN:
            return None
        t0 = time.perf_counter()

        def pays(common: int, nbytes: int, prefill_s: float) -> bool:
            cost = prefill_s or self.fallback_prefill_s
            return (common - held) * cost >= nbytes / self.cache.io_rate

        found = self.cache.find(self.key, self.owner, head, warnings, pays)
        if found is None or found.common - held < MIN_GAIN:
            return None
        self.stash(target, draft)
        entry = found.entry
        if not target.restore_sequence(entry.target.tokens.tolist(), entry.target.state):
            warnings.append("a saved prompt state did not fit this context: evaluated instead")
            return None
        part = entry.draft if entry.draft_key == self.draft_key else None
        if part is not None and draft is not None:
            draft.restore_sequence(part.tokens.tolist(), part.state)  # else left empty
        elif part is not None and slot is not None:
            slot.on_loaded = _restoring(part)
        seconds = time.perf_counter() - t0
        restored = found.common
        cost = entry.prefill_s or self.fallback_prefill_s
        return Restored(restored, found.tier, seconds, max(0.0, restored * cost - seconds))

    def keep(self, target: LlamaLane, draft: LlamaLane | None, prefill_s: float) -> str:
        """Save what the models hold after an answer (see the module docstring); "" or why
        it could not be saved."""
        tokens = list(target.cached)
        if len(tokens) < MIN_TOKENS or not (self.disk or self.memory):
            return ""
        prefill_s = prefill_s or self.fallback_prefill_s
        known = self.cache.known(self.key, self.owner, tokens)
        if known == len(tokens):
            return ""  # saved already
        state = target.sequence_state()
        entry = Entry(
            self.key, Saved(as_tokens(tokens), state), self._draft_part(draft, tokens),
            self.draft_key, self.owner, prefill_s,
        )  # fmt: skip
        new = len(tokens) - known
        disk = self.disk and new * prefill_s >= WORTH * 2 * entry.nbytes / self.cache.io_rate
        return self.cache.save(entry, memory=self.memory, disk=disk)

    def stash(self, target: LlamaLane, draft: LlamaLane | None) -> None:
        """Keep what the target holds in memory before it is overwritten (a server's lane)."""
        tokens = list(target.cached)
        if not self.memory or len(tokens) < MIN_TOKENS:
            return
        memory = self.cache.memory
        if memory is not None and memory.holds(self.key, self.owner, as_tokens(tokens)):
            return
        entry = Entry(
            self.key, Saved(as_tokens(tokens), target.sequence_state()),
            self._draft_part(draft, tokens), self.draft_key, self.owner,
            self.fallback_prefill_s,
        )  # fmt: skip
        self.cache.save(entry, memory=True, disk=False)

    def _draft_part(self, draft: LlamaLane | None, tokens: list[int]) -> Saved | None:
        """The draft model's sequence where it holds most of the target's tokens."""
        if draft is None or not self.draft_key or not draft.cached:
            return None
        if 2 * common_prefix_length(draft.cached, tokens) < len(tokens):
            return None
        return Saved(as_tokens(draft.cached), draft.sequence_state())


def _restoring(part: Saved) -> Callable[[LlamaLane], None]:
    def restore(model: LlamaLane) -> None:
        with contextlib.suppress(BackendError):  # a draft model's state is only a shortcut
            model.restore_sequence(part.tokens.tolist(), part.state)

    return restore


def open_prompt_state(
    tiers: tuple[str, ...],
    size: int | None,
    target: LlamaLane,
    draft_path: Path | None,
    plain_s: float | None,
) -> PromptState | None:
    """The prompt state of a pair just loaded, keeping ``tiers`` (``MEMORY``, ``DISK``)
    each bounded by ``size`` bytes (None: ``sizes.default_bounds``); None with no tier."""
    if not tiers:
        return None
    root = prompt_cache_dir()
    memory_bound, disk_bound = default_bounds(root)
    memory = MemoryTier(memory_bound if size is None else size) if MEMORY in tiers else None
    disk = DiskTier(root, disk_bound if size is None else size) if DISK in tiers else None
    recipe = target.state_recipe()
    draft_recipe = {"flash_attn": recipe["flash_attn"], "llama_cpp": recipe["llama_cpp"]}
    return PromptState(
        PromptCache(memory, disk),
        prompt_key(target.path, recipe),
        prompt_key(draft_path, draft_recipe) if draft_path is not None else "",
        disk=disk is not None,
        memory=memory is not None,
        # Until this machine's prefill is measured in an answer: a batched token costs
        # about a quarter of a plain step on a CPU (and less elsewhere, which only makes
        # the first save more cautious).
        fallback_prefill_s=plain_s / 4 if plain_s else 0.0,
    )
