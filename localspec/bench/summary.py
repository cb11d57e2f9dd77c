"""Summary statistics of a bench's run records, per category and overall, per mode.

``summarize(records, modes, greedy)`` turns records into per-category and overall figures:
decode tokens/s, mean tokens per run, the geometric mean of per-prompt ratios to ``none``
(paired on the same prompt; runs of fewer than ``MIN_RATIO_TOKENS`` tokens, or whose
reference run is that short, are left out and counted as ``short_runs``), for the engine's
modes the ratio to the fastest speculative native run of each prompt
(``ratio_to_best_native``, over all four speculative native modes), for ``none`` the ratios
to ``native-none`` and to ``native-bench`` (``ratio_to_native_none``,
``ratio_to_native_bench``), for the speculative native modes their ratio to ``native-none``
(llama.cpp's speedup over its own plain decoding) and for ``native-none`` its ratio to
``native-bench``, acceptance, mean accepted length, outside share, greedy agreement with
``none`` (identical token ids, common-prefix length), for speculative modes the lowest
per-prompt ratio to ``none`` and the same ratios timed by each run's own plain steps
(``_steady``), the share of the category's ceiling each engine mode reached
(``of_ceiling``, when ceilings are given), what a user waits for where the runs were timed
so (``wall_s`` and ``first_token_s``, their means; ``wall_to_none``; for fresh processes
``wall_to_first_native``, against the speculative llama.cpp process that ended first on
the same prompt: geometric means of per-prompt wall-time ratios, below 1 sooner), for
``auto-again`` the share of second answers that were the first one (``same_as_first``), under
a constraint the share of answers that are what it asks for (``answers_valid``), for
``auto-warm`` the first token of the process that restored the prompt against that of the
one that evaluated it (``warm_to_cold_first_token``, a geometric mean) and the share of warm
answers that were the cold one (``same_as_cold``), and the list of native runs that
overshot.
Repeated runs of a prompt and mode count once, by their median run. The result is plain
JSON data; nothing is printed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.bench.modes import (
    BASELINE,
    NATIVE_BENCH,
    NATIVE_MODES,
    NATIVE_PLAIN,
    NATIVE_SPEC_MODES,
)
from localspec.bench.records import RunRecord, as_record
from localspec.core.cached_model import common_prefix_length

MIN_RATIO_TOKENS = 64  # shorter runs give noisy tok/s: left out of the ratio means
# A run's own clock: the mean time of its plain steps, once it took this many (see ``_steady``).
MIN_PLAIN_STEPS = 16


def geometric_mean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


Key = tuple[str, str]


def _key(record: RunRecord) -> Key:
    return record.key


@dataclass(frozen=True)
class _References:
    """Per prompt, the runs others are compared with."""

    baseline: dict[Key, RunRecord]  # localspec's `none`
    best_native: dict[Key, RunRecord]  # the fastest of the NATIVE_SPEC_MODES
    native_none: dict[Key, RunRecord]
    native_bench: dict[Key, RunRecord]
    # The speculative native process that ended first (its whole wall time, load included).
    first_native: dict[Key, RunRecord]


def _references(records: list[RunRecord]) -> _References:
    best: dict[Key, RunRecord] = {}
    first: dict[Key, RunRecord] = {}
    for r in records:
        if r.mode in NATIVE_SPEC_MODES:
            held = best.get(_key(r))
            if held is None or r.decode_tokens_per_s > held.decode_tokens_per_s:
                best[_key(r)] = r
            held = first.get(_key(r))
            if r.wall_s is not None and (held is None or r.wall_s < (held.wall_s or 0)):
                first[_key(r)] = r
    return _References(
        baseline={_key(r): r for r in records if r.mode == BASELINE},
        best_native=best,
        native_none={_key(r): r for r in records if r.mode == NATIVE_PLAIN},
        native_bench={_key(r): r for r in records if r.mode == NATIVE_BENCH},
        first_native=first,
    )


def paired_runs(
    records: list[RunRecord], reference: dict[Key, RunRecord]
) -> tuple[list[tuple[RunRecord, RunRecord]], int]:
    """Each record with the reference run of the same prompt, and how many pairs were left
    out because one of the two runs is shorter than ``MIN_RATIO_TOKENS`` (too few tokens
    for a steady rate) or the reference has no rate."""
    pairs: list[tuple[RunRecord, RunRecord]] = []
    short = 0
    for r in records:
        ref = reference.get(_key(r))
        if ref is None:
            continue
        if min(r.generated_tokens, ref.generated_tokens) < MIN_RATIO_TOKENS:
            short += 1
        elif ref.decode_tokens_per_s > 0:
            pairs.append((r, ref))
    return pairs, short


def _ratio(r: RunRecord, ref: RunRecord) -> float:
    return r.decode_tokens_per_s / ref.decode_tokens_per_s


def paired_ratios(
    records: list[RunRecord], reference: dict[Key, RunRecord]
) -> tuple[list[float], int]:
    """Per-prompt tok/s ratios of ``records`` to the reference run of the same prompt, and
    how many pairs ``paired_runs`` left out as short."""
    pairs, short = paired_runs(records, reference)
    return [_ratio(r, ref) for r, ref in pairs], short


def _steady(r: RunRecord, ref: RunRecord) -> float | None:
    """The ratio of ``r`` to ``ref`` with each run timed by its own clock: its tok/s times
    the mean time of its own plain steps. A machine that ran slower during one of the two
    runs (another program, a busy host) slows its plain steps and its verify batches
    alike, so this leaves what the mode's choices did. None unless both runs took at least
    ``MIN_PLAIN_STEPS`` plain steps (a run that speculates nearly every round has no clock
    of its own)."""
    if min(r.plain_steps or 0, ref.plain_steps or 0) < MIN_PLAIN_STEPS:
        return None
    if r.plain_step_s is None or ref.plain_step_s is None:  # set wherever plain_steps is
        return None
    return _ratio(r, ref) * r.plain_step_s / ref.plain_step_s


def _lowest(pairs: list[tuple[Key, float]]) -> dict[str, Any] | None:
    if not pairs:
        return None
    (category, prompt), ratio = min(pairs, key=lambda p: p[1])
    return {"category": category, "prompt_id": prompt, "ratio": round(ratio, 4)}


def _per_prompt(records: list[RunRecord], baseline: dict[Key, RunRecord]) -> dict[str, Any]:
    """A speculative mode's worst prompt against ``none``, as measured and as its own
    clock sees it (``_steady``), and the geometric mean of the steady ratios."""
    pairs, _ = paired_runs(records, baseline)
    raw = [(_key(r), _ratio(r, ref)) for r, ref in pairs]
    steady = [(_key(r), x) for r, ref in pairs if (x := _steady(r, ref)) is not None]
    return {
        "lowest_ratio_to_none": _lowest(raw),
        "steady_ratio_to_none": _round(geometric_mean(x for _, x in steady), 4),
        "steady_prompts": len(steady),
        "lowest_steady_ratio_to_none": _lowest(steady),
    }


def _agreement(pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    return {
        "identical": round(sum(a == b for a, b in pairs) / len(pairs), 4),
        "mean_common_prefix": round(
            sum(common_prefix_length(a, b) for a, b in pairs) / len(pairs), 2
        ),
        "mean_baseline_length": round(sum(len(b) for _, b in pairs) / len(pairs), 2),
    }


def _ratio_to(records: list[RunRecord], reference: dict[Key, RunRecord]) -> float | None:
    return _round(geometric_mean(paired_ratios(records, reference)[0]), 4)


def _native_ratios(mode: str, records: list[RunRecord], refs: _References) -> dict[str, Any]:
    """A mode against llama.cpp, for the references that ran: the engine's modes against
    the best speculative native run; ``none`` against llama.cpp's plain decoding in
    llama-speculative-simple (native-none) and in llama-bench (native-bench); the native
    speculative modes against native-none (their speedup in llama.cpp's own terms), and
    native-none against native-bench (what the example's loop costs over bare decoding)."""
    out: dict[str, Any] = {}
    engine = mode not in NATIVE_MODES  # localspec's own modes, auto's variants included
    if engine and refs.best_native:
        out["ratio_to_best_native"] = _ratio_to(records, refs.best_native)
    if (mode == BASELINE or mode in NATIVE_SPEC_MODES) and refs.native_none:
        out["ratio_to_native_none"] = _ratio_to(records, refs.native_none)
    if mode in (BASELINE, NATIVE_PLAIN) and refs.native_bench:
        out["ratio_to_native_bench"] = _ratio_to(records, refs.native_bench)
    return out


def _wall_ratio(records: list[RunRecord], reference: dict[Key, RunRecord]) -> float | None:
    """The geometric mean of per-prompt wall-time ratios to the reference run (below 1:
    the answer came sooner); runs of any length count."""
    ratios = [
        r.wall_s / ref.wall_s
        for r in records
        if (ref := reference.get(_key(r))) is not None and r.wall_s and ref.wall_s
    ]
    return _round(geometric_mean(ratios), 4)


def _waiting(mode: str, records: list[RunRecord], refs: _References) -> dict[str, Any]:
    """What a user waits for: the mean wall time and time to first token of the runs, the
    wall time against ``none``'s and, for the engine's fresh processes, against the native
    speculative process that ended first on the same prompt (both as whole processes)."""
    walls = [r.wall_s for r in records if r.wall_s is not None]
    if not walls:
        return {}
    firsts = [r.first_token_s for r in records if r.first_token_s is not None]
    out: dict[str, Any] = {
        "wall_s": round(sum(walls) / len(walls), 4),
        "first_token_s": round(sum(firsts) / len(firsts), 4) if firsts else None,
    }
    if mode != BASELINE and refs.baseline:
        out["wall_to_none"] = _wall_ratio(records, refs.baseline)
    fresh = [r for r in records if r.fresh]
    if mode not in NATIVE_MODES and fresh and refs.first_native:
        out["wall_to_first_native"] = _wall_ratio(fresh, refs.first_native)
    warm = [r for r in records if r.first_token_s and r.cold_first_token_s]
    if warm:  # auto-warm: the prompt restored against evaluated, in the same run
        ratios = [r.first_token_s / r.cold_first_token_s for r in warm]  # type: ignore[operator]
        out["warm_to_cold_first_token"] = _round(geometric_mean(ratios), 4)
        out["same_as_cold"] = sum(bool(r.same_as_cold) for r in warm) / len(warm)
    return out


def _ceiling_share(
    pairs: list[tuple[RunRecord, RunRecord]], ceilings: dict[str, dict[str, Any]]
) -> float | None:
    """The geometric mean, over paired prompts, of each one's ratio to its reference over
    its category's ceiling (the most tokens per plain step a lossless method could reach at
    that category's depth)."""
    shares = [
        _ratio(r, ref) / ceilings[r.category]["ceiling_ratio"]
        for r, ref in pairs
        if r.category in ceilings
    ]
    return _round(geometric_mean(shares), 4)


def _group(
    mode: str,
    records: list[RunRecord],
    refs: _References,
    greedy: bool,
    ceilings: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    tokens = sum(r.generated_tokens for r in records)
    decode = sum(r.decode_s for r in records)
    drafted = sum(r.drafted or 0 for r in records)
    accepted = sum(r.accepted or 0 for r in records)
    # Runs that counted their rounds (native runs do not): (rounds, accepted).
    counted = [(r.rounds, r.accepted or 0) for r in records if r.rounds]
    # Runs that timed the models' compute: (compute, decode).
    timed = [(r.compute_s, r.decode_s) for r in records if r.compute_s is not None]
    runs, short = paired_runs(records, refs.baseline)
    ratios = [_ratio(r, ref) for r, ref in runs]
    rounds = sum(n for n, _ in counted)
    compute_decode = sum(d for _, d in timed)
    compute = sum(c for c, _ in timed)
    out: dict[str, Any] = {
        "prompts": len(records),
        "generated_tokens": tokens,
        "mean_tokens": round(tokens / len(records), 2),
        "decode_s": round(decode, 6),
        "decode_tokens_per_s": _round(tokens / decode if decode else None, 3),
        "ratio_to_none": _round(geometric_mean(ratios), 4),
        "short_runs": short,
        **_native_ratios(mode, records, refs),
        **_waiting(mode, records, refs),
        "acceptance_rate": _round(accepted / drafted if drafted else None, 4),
        "mean_accepted_length": _round(
            1 + sum(a for _, a in counted) / rounds if rounds else None, 4
        ),
        "outside_share": _round(1 - compute / compute_decode if compute_decode else None, 4),
        "agreement": None,
    }
    if mode != BASELINE and mode not in NATIVE_MODES and refs.baseline:
        out.update(_per_prompt(records, refs.baseline))
    pairs = [
        (mine, theirs)
        for r in records
        if _key(r) in refs.baseline
        and (mine := r.token_ids) is not None
        and (theirs := refs.baseline[_key(r)].token_ids) is not None
    ]
    if greedy and pairs:
        out["agreement"] = _agreement(pairs)
    again = [r.same_as_first for r in records if r.same_as_first is not None]
    if again:
        out["same_as_first"] = round(sum(again) / len(again), 4)
    valid = [r.answer_valid for r in records if r.answer_valid is not None]
    if valid:
        out["answers_valid"] = round(sum(valid) / len(valid), 4)
    if ceilings and mode not in NATIVE_MODES:
        out["of_ceiling"] = _ceiling_share(runs, ceilings)
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def overshoots(records: list[RunRecord]) -> list[dict[str, Any]]:
    """The runs that wrote more tokens than asked, in run order."""
    return [
        {
            "mode": r.mode,
            "category": r.category,
            "prompt_id": r.prompt_id,
            "generated_tokens": r.generated_tokens,
            "overshoot": r.overshoot,
        }
        for r in records
        if r.overshoot
    ]


def median_runs(records: list[RunRecord]) -> list[RunRecord]:
    """One record per prompt and mode: of repeated runs, the one with the median tok/s (the
    lower of the two middle ones for an even count), so every figure comes from one real run."""
    runs: dict[tuple[str, str, str], list[RunRecord]] = {}
    for r in records:
        runs.setdefault((*_key(r), r.mode), []).append(r)
    chosen = []
    for same in runs.values():  # in the order of each one's first run
        ranked = sorted(same, key=lambda r: r.decode_tokens_per_s)
        chosen.append(ranked[(len(ranked) - 1) // 2])
    return chosen


def summarize(
    records: Sequence[RunRecord | dict[str, Any]],
    modes: Sequence[str],
    greedy: bool,
    ceilings: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per category and overall, per mode; ratios are paired with ``none`` per prompt.
    Repeated runs count once each, by their median run (``median_runs``). Records read back
    from JSON are taken as they are. With ``ceilings`` (per category, as
    ``ceiling.measure_ceiling`` gives them) each engine mode also gets ``of_ceiling``."""
    records = median_runs([as_record(r) for r in records])
    refs = _references(records)
    categories = list(dict.fromkeys(r.category for r in records))
    by_cat: dict[str, dict[str, Any]] = {}
    for cat in categories:
        runs = [r for r in records if r.category == cat]
        by_cat[cat] = {
            mode: _group(mode, mine, refs, greedy, ceilings)
            for mode in modes
            if (mine := [r for r in runs if r.mode == mode])
        }
    overall = {
        mode: _group(mode, mine, refs, greedy, ceilings)
        for mode in modes
        if (mine := [r for r in records if r.mode == mode])
    }
    return {"categories": by_cat, "overall": overall, "overshoot": overshoots(records)}
