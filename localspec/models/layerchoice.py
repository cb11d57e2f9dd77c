"""Which of a target's layers make its best self-speculative draft, by measurement.

A target drafts for itself with some of its blocks left out (Draft & Verify, arXiv
2309.08168; SWIFT, arXiv 2410.06916, picks them by measurement, without training). Each
candidate subset is derived into a file (``derive``), loaded, and measured on this machine:

- agreement α: how often its argmax equals the target's at the same position of a
  calibration text, teacher-forced in one batch. The text is the target's own greedy
  continuation of two short prompts (code and prose), so α is the greedy acceptance rate
  per drafted token on the model's own distribution;
- step_ratio: its one-token step over the target's, timed right after it (medians of a few
  steps each).

The target's verify batches of k+1 tokens are timed too, as ``verify_ratio[k]`` (over its
plain step). ``expected_speedup`` turns these into tokens per unit of plain-decoding time
(pure, no I/O); ``pick`` keeps the best candidate. Contract of ``choose_layers``: keeps the
target loaded and loads each candidate in turn (derived into a temporary directory, each
file deleted once measured); returns every candidate's numbers and the chosen one's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.core.cached_model import CachedModel
from localspec.errors import ModelFileError, UsageError
from localspec.models.derive import Source, compact_layers, open_source, write_derived
from localspec.progress import OnProgress, ProgressKind, tell

DRAFT_LENGTHS = (1, 2, 4, 8, 16)  # k whose verify batch (k+1 tokens) is timed
CALIBRATION_TOKENS = 96  # greedy tokens the target writes after each prompt
STEP_REPEATS = 8
VERIFY_REPEATS = 3
MEASURE_CTX = 1024  # prompt, calibration tokens and the longest verify batch fit
CALIBRATION_PROMPTS = (
    'def parse_duration(text: str) -> int:\n    """Return the number of seconds in a '
    'duration such as "1h30m" or "45s"."""\n',
    "The lighthouse keeper had not seen a ship in eleven days when the storm arrived.",
)


@dataclass(frozen=True)
class Candidate:
    """One measured subset: ``expected_speedup`` at its best draft length ``draft_length``."""

    layers: tuple[int, ...]
    label: str
    agreement: float
    step_ratio: float
    expected_speedup: float
    draft_length: int


@dataclass(frozen=True)
class Choice:
    """What ``choose_layers`` measured: every candidate, the best, and the target's costs."""

    n_layers: int
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    verify_ratio: dict[int, float]
    target_step_s: float
    calibration_tokens: int
    seconds: float


# --- the pure part --------------------------------------------------------------------


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round of k greedy drafts yields on average: 1 + α + ... + α^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_draft_length(
    alpha: float, step_ratio: float, verify_ratio: Mapping[int, float]
) -> tuple[int, float]:
    """``(k, speedup)`` of the draft length k that pays best: a round of k draft steps and
    one verify batch yields ``expected_tokens`` in ``k * step_ratio + verify_ratio[k]``
    plain target steps (plain decoding: 1 token per 1.0)."""
    if not verify_ratio:
        raise ValueError("no verify costs to weigh drafts against")
    rated = {
        k: expected_tokens(alpha, k) / (k * step_ratio + cost) for k, cost in verify_ratio.items()
    }
    k = max(rated, key=lambda n: (rated[n], -n))
    return k, rated[k]


def expected_speedup(alpha: float, step_ratio: float, verify_ratio: Mapping[int, float]) -> float:
    """Best expected speedup over plain decoding of a draft with agreement ``alpha`` whose
    step costs ``step_ratio`` target steps, ``verify_ratio[k]`` being the cost of verifying
    k drafts in target steps. Below 1: drafting loses."""
    return best_draft_length(alpha, step_ratio, verify_ratio)[1]


def rate(
    layers: Sequence[int],
    label: str,
    agreement: float,
    step_ratio: float,
    verify_ratio: Mapping[int, float],
) -> Candidate:
    k, speedup = best_draft_length(agreement, step_ratio, verify_ratio)
    return Candidate(tuple(layers), label, agreement, step_ratio, speedup, k)


def pick(candidates: Sequence[Candidate]) -> Candidate:
    """The candidate with the best expected speedup (on a tie, the fewer layers)."""
    if not candidates:
        raise ValueError("no candidates to pick from")
    return max(candidates, key=lambda c: (c.expected_speedup, -len(c.layers)))


def candidate_subsets(n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """``(label, layers)`` to measure: the first half, every other layer (and the last), and
    the first a plus the last b blocks at about 3/4, 1/2 and 1/3 of the layers, b a quarter
    or a half of them (SWIFT finds the middle layers the ones to skip). Proper subsets only,
    each once."""
    n = n_layers
    found: dict[tuple[int, ...], str] = {}

    def add(label: str, layers: Sequence[int]) -> None:
        kept = tuple(sorted(set(layers)))
        if 0 < len(kept) < n and kept not in found:
            found[kept] = label

    add("first half", range((n + 1) // 2))
    add("every other", [*range(0, n, 2), n - 1])
    for share in (3 / 4, 1 / 2, 1 / 3):
        size = round(n * share)
        for tail_share in (1 / 4, 1 / 2):
            last = max(1, round(size * tail_share))
            first = size - last
            if first >= 1:
                add(f"first {first} + last {last}", [*range(first), *range(n - last, n)])
    return [(label, layers) for layers, label in found.items()]


# --- measurement ----------------------------------------------------------------------


def load_derived(
    path: Path,
    options: LoadOptions,
    target: str = "TARGET",
    *,
    abort: Callable[[], bool] | None = None,
) -> LlamaModel:
    """Load a derived draft; llama.cpp's refusal is a ``ModelFileError`` that says how to
    make the file again (``target`` names the target in that hint). ``abort`` as for
    ``LlamaModel``."""
    try:
        return LlamaModel(path, options, abort=abort)
    except ModelFileError as err:
        raise ModelFileError(
            f"llama.cpp cannot load the derived draft {path}: {err.message}",
            f"derive it again: localspec models derive-draft {target} --refresh",
        ) from None


def choose_layers(
    target: Path,
    *,
    threads: int | None = None,
    on_progress: OnProgress | None = None,
    subsets: Sequence[tuple[str, Sequence[int]]] | None = None,
    calibration_tokens: int = CALIBRATION_TOKENS,
    prompts: Sequence[str] = CALIBRATION_PROMPTS,
    workdir: Path | None = None,
    source: Source | None = None,
) -> Choice:
    """Measure each subset (default ``candidate_subsets``) against ``target``; see the
    module docstring. ``workdir`` holds the candidates' temporary files; ``source`` is
    ``target`` already parsed, if the caller has it."""
    started = time.perf_counter()
    source = source or open_source(target)
    pool = list(subsets) if subsets is not None else candidate_subsets(source.n_layers)
    if not pool:
        raise UsageError(f"{target.name} has too few layers ({source.n_layers}) to leave any out")
    if not 0 < calibration_tokens <= MEASURE_CTX // 2:
        raise ValueError(f"calibration_tokens must be 1 to {MEASURE_CTX // 2}")
    options = LoadOptions(n_ctx=MEASURE_CTX, n_threads=threads, tree_seqs=0)
    tell(
        on_progress,
        f"measuring {len(pool)} subsets of {source.n_layers} layers of {target.name} "
        "as self-drafts (once per target; a minute or more)",
        ProgressKind.WAIT,
    )
    model = LlamaModel(target, options)
    try:
        tell(on_progress, "writing calibration text with the target")
        texts = _calibration(model, prompts, calibration_tokens)
        tell(on_progress, "timing the target's steps and verify batches")
        context = texts[0][0]
        target_step = _step_seconds(model, context)
        verify = _verify_ratios(model, context, target_step)
        rated = []
        with tempfile.TemporaryDirectory(prefix="selfdraft-", dir=workdir) as tmp:
            for i, (label, layers) in enumerate(pool, start=1):
                what = f"{label} (layers {compact_layers(layers)})"
                tell(on_progress, f"candidate {i}/{len(pool)}: {what}")
                path = write_derived(source, layers, Path(tmp) / f"layers-{i}.gguf")
                try:
                    agreement, ratio = _measure_draft(path, model, texts, options)
                finally:
                    path.unlink()
                rated.append(rate(layers, label, agreement, ratio, verify))
    finally:
        model.close()
    return Choice(
        n_layers=source.n_layers,
        chosen=pick(rated),
        candidates=tuple(rated),
        verify_ratio=verify,
        target_step_s=target_step,
        calibration_tokens=sum(len(seq) - start for seq, start in texts),
        seconds=time.perf_counter() - started,
    )


def _measure_draft(
    path: Path, target: LlamaModel, texts: list[tuple[list[int], int]], options: LoadOptions
) -> tuple[float, float]:
    """``(agreement, step ratio)`` of the derived file at ``path``. The target's step is
    timed again right after the draft's, so a change in the machine's load between
    candidates does not favour one of them."""
    draft = load_derived(path, options, str(target.path))
    try:
        agreement = _agreement(draft, texts)
        context = texts[0][0]
        draft_step = _step_seconds(draft, context)
    finally:
        draft.close()
    return agreement, draft_step / _step_seconds(target, context)


def _calibration(
    model: LlamaModel, prompts: Sequence[str], n_tokens: int
) -> list[tuple[list[int], int]]:
    """``(prompt + greedy continuation, prompt length)`` per prompt, written by the target."""
    texts = []
    for prompt in prompts:
        seq = model.tokenize(prompt)
        start = len(seq)
        for _ in range(n_tokens):
            token = int(np.argmax(model.forward(seq, 1, borrow=True)[0]))
            if model.is_eog(token):
                break
            seq.append(token)
        texts.append((seq, start))
    return texts


def _agreement(model: CachedModel, texts: Sequence[tuple[list[int], int]]) -> float:
    """Share of continuation positions where ``model``'s argmax is the target's token."""
    hits = total = 0
    for seq, start in texts:
        if len(seq) <= start:
            continue
        model.reset()
        # Rows for positions start-1 .. end-1; the last one predicts past the text.
        rows = model.forward(seq, len(seq) - start + 1, borrow=True)[:-1]
        hits += int(np.count_nonzero(np.argmax(rows, axis=1) == np.asarray(seq[start:])))
        total += len(seq) - start
    return hits / total if total else 0.0


def _median_seconds(model: CachedModel, context: list[int], batch: list[int], reps: int) -> float:
    """Median time of evaluating ``batch`` (logits for every token) after ``context``."""
    model.forward(context, 0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward_after(len(context), batch, len(batch), borrow=True)
        times.append(time.perf_counter() - t0)
        model.truncate(len(context))
    return statistics.median(times)


def _step_seconds(model: CachedModel, context: list[int]) -> float:
    return _median_seconds(model, context, context[-1:], STEP_REPEATS)


def _verify_ratios(model: CachedModel, context: list[int], step: float) -> dict[int, float]:
    filler = (context * (max(DRAFT_LENGTHS) // max(len(context), 1) + 2))[: max(DRAFT_LENGTHS) + 1]
    return {
        k: _median_seconds(model, context, filler[: k + 1], VERIFY_REPEATS) / step
        for k in DRAFT_LENGTHS
    }
