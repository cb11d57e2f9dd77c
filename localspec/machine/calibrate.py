"""Measure what speculation costs on this machine for a loaded pair.

``measure_costs`` times, on the models themselves and as greedy decoding asks them (their
greedy choices, on the device where the backend makes them there): a plain target step (one
token), a target batch verifying k drafts (k+1 tokens, a choice after every one) for every
k in ``DRAFT_SIZES`` (each k up to 16, then the long sizes n-gram copies use, up to 64), and a
draft-model step. The minimum over repetitions is kept: interference from other work only
ever adds time. Results feed ``core.costs.CostProfile``; ``CostCache`` keeps them per model
pair, thread count and machine so later runs skip the measurement. A cached entry that is
unreadable or holds impossible values counts as missing (``load_checked`` says why, for a
warning); saving is best effort. ``measuring(key)`` is a lock per key, held while measuring.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from localspec.core.cached_model import CachedModel
from localspec.core.costs import CostProfile
from localspec.models.resources import cpu_name
from localspec.progress import OnProgress, ProgressKind, tell
from localspec.statefiles import STATE_ERRORS, read_json, remove_json, write_json


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# Draft lengths whose verify batch is measured: every short one (the curve is not monotonic
# on CPUs, so none is guessed), then the long drafts of n-gram copies, sized so that the
# batch (drafts + 1) is 20, 24, 32, 48 or 64 tokens: kernels favour multiples of 8 and 16.
DRAFT_SIZES = (*range(1, 17), 19, 23, 31, 47, 63)
LONG_SWEEPS = 2  # long batches take most of the time and vary less between runs
PLAIN_REPEATS = 4  # plain steps per sweep: every verify cost is weighed against this one


def measure_costs(
    target: CachedModel,
    draft: CachedModel | None,
    context: Sequence[int],
    *,
    sizes: Sequence[int] = DRAFT_SIZES,
    sweeps: int = 3,
) -> CostProfile:
    """``context``: a few dozen real tokens; the measurement appends copies of them.

    Every size is measured once per sweep, sweeps interleaved, keeping each size's
    minimum: a burst of other work then spoils one sample of many sizes rather than every
    sample of one size, and the minimum discards it. Sizes that would not fit the target's
    context after ``context`` are left out.
    """
    base = list(context)
    room = getattr(target, "n_ctx", len(base) + max(sizes) + 1) - len(base) - 1
    sizes = [k for k in sizes if k <= room]
    k_max = max(sizes, default=0)
    extra = (base * (k_max // max(len(base), 1) + 2))[: k_max + 1]

    def step(model: CachedModel, n: int) -> float:
        # As greedy decoding asks: the target's choices, the draft's with its confidence.
        model.forward(base, 0)
        confident = model is draft
        return _timed(lambda: model.greedy(base + extra[:n], n, confidence=confident))

    step(target, 4)  # warm-up: first batches allocate and choose kernels
    draft_prefill = None
    if draft is not None:
        step(draft, 2)
        draft.truncate(0)
        draft_prefill = _timed(lambda: draft.forward(base, 0)) / len(base)
    best: dict[int, float] = {}
    draft_best = float("inf")
    for sweep in range(sweeps):
        for k in (*[0] * PLAIN_REPEATS, *sizes):
            if k > 16 and sweep >= LONG_SWEEPS:
                continue
            t = step(target, k + 1)
            best[k] = min(best.get(k, float("inf")), t)
        if draft is not None:
            draft_best = min(draft_best, *(step(draft, 1) for _ in range(3)))
    target.truncate(0)
    if draft is not None:
        draft.truncate(0)
    plain = best.pop(0)
    return CostProfile(
        plain_s=plain,
        verify_s=best,
        draft_step_s=draft_best if draft is not None else None,
        draft_prefill_s=draft_prefill,
    )


def fastest_of(a: CostProfile, b: CostProfile) -> CostProfile:
    """Each cost the smaller of two measurements: other work only ever adds time."""

    def low(x: float | None, y: float | None) -> float | None:
        return y if x is None else x if y is None else min(x, y)

    return CostProfile(
        plain_s=min(a.plain_s, b.plain_s),
        verify_s={k: min(v, b.verify_s.get(k, v)) for k, v in a.verify_s.items()},
        draft_step_s=low(a.draft_step_s, b.draft_step_s),
        draft_prefill_s=low(a.draft_prefill_s, b.draft_prefill_s),
    )


def looks_disturbed(costs: CostProfile) -> bool:
    """A batch of k+1 tokens cannot really be much cheaper than one token; if it measured
    so, other work was competing for the cores while measuring."""
    return any(t < 0.8 * costs.plain_s for t in costs.verify_s.values())


def machine_key(*parts: object) -> str:
    """A stable key for a pair on this machine: file identities, settings, CPU."""
    raw = json.dumps([cpu_name(), *[str(p) for p in parts]])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def file_identity(path: Path | None) -> str:
    """The file as its path, size, times and inode (as the header cache's stamp): a model
    swapped in place, its mtime put back, is another file with costs of its own."""
    if path is None:
        return "none"
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


class CostCache:
    """JSON files, one per key, under a directory the caller chooses."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> CostProfile | None:
        return self.load_checked(key)[0]

    def load_checked(self, key: str) -> tuple[CostProfile | None, str]:
        """The profile, or None and why (empty when nothing was measured): measure again."""
        path = self.path(key)
        data, problem = read_json(path)
        if data is None:
            return None, problem and f"ignoring cached step costs: {problem}"
        try:
            return CostProfile.from_dict(data), ""
        except STATE_ERRORS as err:
            return None, f"ignoring cached step costs {path}: impossible values ({err})"

    @contextlib.contextmanager
    def measuring(self, key: str, on_progress: OnProgress | None = None) -> Iterator[None]:
        """Held while ``key``'s costs are measured: a second process that would measure the
        same pair waits (saying so), then reads what the first saved, rather than
        measuring on a machine the first keeps busy. Without a folder to lock in, it does
        not wait (saving will say why it failed)."""
        lock = FileLock(str(self.directory / f"{key}.lock"), mode=0o600)
        held: FileLock | None = lock
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=0)
        except Timeout:  # before OSError, which it is
            tell(on_progress, "waiting for another localspec measuring this pair's costs",
                 ProgressKind.WAIT)  # fmt: skip
            lock.acquire()
        except OSError:
            held = None
        try:
            yield
        finally:
            if held is not None:
                held.release()

    def save(self, key: str, costs: CostProfile) -> str:
        """Best effort: returns "" or why the measurement could not be saved."""
        return write_json(self.path(key), costs.to_dict())

    def forget(self) -> int:
        """Delete every cached measurement; returns how many there were."""
        return remove_json(self.directory)
