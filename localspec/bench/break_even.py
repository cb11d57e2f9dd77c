"""Where each drafter would pay: the verify cost under which its drafting rounds beat plain
steps, from a bench's records and the costs the cost model started from.

``break_even(records, costs)`` gives one row per mode, category and drafter that drafted,
and per mode and drafter over every category (category ``ALL``): its drafting rounds, the
mean draft length ``k``, the tokens per drafting pass ``T`` (its accepted tokens and the
target's own one, per round it drafted) and its drafting cost per drafted token ``c`` in
plain steps (``draft_step``: a drafter that runs a model pays a draft step per token; copies
and lookahead draft for free). A drafting round costs verifying ``k`` drafts plus ``k c``
plain steps of drafting and brings ``T`` tokens where plain steps bring one each, so it pays
where verifying ``k`` drafts costs less than ``T - k c`` plain steps (``pays_below``).
``verify_here`` is what verifying ``k`` drafts cost on this machine, in plain steps (between
the two whole lengths around ``k``); None without costs. A machine whose verify batches cost
less than the break-even (a GPU's, where a batch of 16 costs little more than one step)
gains from the drafter; one whose batches cost more does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from localspec.bench.records import RunRecord, as_record
from localspec.core.costs import CostProfile
from localspec.core.drafting.registry import REGISTRY
from localspec.core.stats import PLAIN
from localspec.session.pair import SELF_DRAFT

ALL = "all"  # the category of the rows pooled over every category
# Drafters that pay a draft model's step per drafted token (the draft model's drafter is
# named "self" when the draft was derived from the target).
MODEL_STEP = frozenset({*(entry.name for entry in REGISTRY if entry.uses_draft_model), SELF_DRAFT})


def _pooled(records: Sequence[RunRecord]) -> dict[tuple[str, str, str], list[int]]:
    """(mode, category, drafter) -> [rounds, drafted, accepted] of its drafting rounds, with
    the same pooled over every category."""
    pooled: dict[tuple[str, str, str], list[int]] = {}
    for record in records:
        for drafter, stats in (record.by_drafter or {}).items():
            if drafter == PLAIN or not stats.get("drafted"):
                continue
            for category in (record.category, ALL):
                totals = pooled.setdefault((record.mode, category, drafter), [0, 0, 0])
                totals[0] += stats["rounds"]
                totals[1] += stats["drafted"]
                totals[2] += stats["accepted"]
    return pooled


def verify_steps(costs: CostProfile, k: float) -> float:
    """Verifying ``k`` drafts (a mean, between two whole lengths), in plain steps."""
    low = max(1, int(k))
    w = k - low
    return ((1 - w) * costs.verify(low) + w * costs.verify(low + 1)) / costs.plain_s


def _ranks(keys: list[tuple[str, str, str]], i: int) -> dict[str, int]:
    """Each value of the keys' ``i``-th part by the order it first appears in."""
    return {value: n for n, value in enumerate(dict.fromkeys(key[i] for key in keys))}


def break_even(
    records: Sequence[RunRecord | dict[str, Any]], costs: CostProfile | None
) -> list[dict[str, Any]]:
    """The rows of the module docstring, by mode and drafter in the order they ran, each
    one's categories in that order and ``ALL`` last (left out where it would repeat the one
    category there is)."""
    pooled = _pooled([as_record(r) for r in records])
    keys = list(pooled)
    modes, categories, drafters = (_ranks(keys, i) for i in range(3))
    categories[ALL] = len(categories)
    spread = Counter((mode, drafter) for mode, category, drafter in keys if category != ALL)
    rows = []
    for key in sorted(keys, key=lambda k: (modes[k[0]], drafters[k[2]], categories[k[1]])):
        mode, category, drafter = key
        rounds, drafted, accepted = pooled[key]
        if category == ALL and spread[(mode, drafter)] == 1:
            continue  # one category: its row says it all
        k = drafted / rounds
        tokens = 1.0 + accepted / rounds
        step = 0.0
        if drafter in MODEL_STEP and costs is not None and costs.draft_step_s:
            step = costs.draft_step_s / costs.plain_s
        rows.append({
            "mode": mode, "category": category, "drafter": drafter, "rounds": rounds,
            "mean_draft": round(k, 3), "tokens_per_pass": round(tokens, 3),
            "draft_step": round(step, 3), "pays_below": round(tokens - k * step, 3),
            "verify_here": None if costs is None else round(verify_steps(costs, k), 3),
        })  # fmt: skip
    return rows
