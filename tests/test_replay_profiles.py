"""Decisions proven on more than one machine: recorded answers replayed at the cost
profiles of several kinds of machine (``tests/data/costs``: a 2-core Zen 3 without AVX-512,
a 2-core Zen 4 with AVX-512, a GPU-like machine, an NVIDIA H200 as the device check
measured it, this project's own, as ``localspec bench costs`` wrote it), and ``auto``
with a prediction held to what it must reach at each.

The answers (``tests/data/replay``) are whole-file edits, with the file in the prompt and as
the prediction, completions and prose, each also asked again with its first answer as the
prediction (a repeat drafted from the history). With a prediction, ``auto`` must reach, at
every profile, ``auto`` without it and llama.cpp's ``ngram-simple`` over the same answer, to
within ``TOLERANCE`` of the replays' estimated seconds; a repeat must also beat the fixed
n-gram policy (``--drafter ngram``). Replays are deterministic: greedy, at the profile's
costs, through the real engine (``core.replay``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from localspec.core.costs import CostProfile
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.replay import DraftChoices, Replayed, replay, replay_ngram_simple

DATA = Path(__file__).resolve().parent / "data"
TOLERANCE = 0.97  # "within a few percent": replays price every round, so 3% is a choice
PROFILES = sorted(p.stem for p in (DATA / "costs").glob("*.json"))
ANSWERS = sorted(p.stem for p in (DATA / "replay").glob("*.json"))


@cache
def profile(name: str) -> CostProfile:
    return CostProfile.from_dict(json.loads((DATA / "costs" / f"{name}.json").read_text()))


@cache
def answer(name: str) -> dict:
    return json.loads((DATA / "replay" / f"{name}.json").read_text())


def run(name: str, costs: str, **update) -> Replayed:
    a = answer(name)
    ends = frozenset(a["ends"])
    draft = DraftChoices(a["draft"]["ids"], a["draft"]["top_p"]) if a["draft"] else None
    params = GenerationParams(max_tokens=len(a["answer"])).model_copy(update=update)
    return replay(a["prompt"], a["answer"], profile(costs), params, ends.__contains__, draft=draft)


def predictions(name: str) -> list[tuple[str, tuple[int, ...]]]:
    a = answer(name)
    repeat = tuple(t for t in a["answer"] if t not in a["ends"])
    return ([("file", tuple(a["prediction"]))] if a["prediction"] else []) + [("repeat", repeat)]


def test_the_profiles_and_answers_are_there():
    assert {"zen3", "avx512", "gpu-like", "h200", "dev-busy"} <= set(PROFILES)
    kinds = {answer(n)["kind"] for n in ANSWERS}
    assert kinds >= {"edit", "completion", "prose"}
    for name in PROFILES:
        assert json.loads((DATA / "costs" / f"{name}.json").read_text())["machine"]


@pytest.mark.parametrize(("name", "costs"), [(n, c) for n in ANSWERS for c in PROFILES])
def test_a_prediction_reaches_auto_without_it_and_ngram_simple(name, costs):
    a = answer(name)
    without = run(name, costs)
    simple_s, _, _ = replay_ngram_simple(a["prompt"], a["answer"], profile(costs))
    for kind, prediction in predictions(name):
        with_it = run(name, costs, prediction=prediction)
        assert with_it.token_ids == without.token_ids  # greedy: the recorded answer
        said = f"{kind}: {with_it.seconds:.3f}s against auto's {without.seconds:.3f}s"
        assert with_it.seconds * TOLERANCE <= without.seconds, said
        assert with_it.seconds * TOLERANCE <= simple_s, f"{said}, ngram-simple's {simple_s:.3f}s"
        if kind == "repeat":  # the whole answer predicted: every fixed policy is behind
            fixed = run(name, costs, drafter=DrafterMode.NGRAM)
            assert with_it.seconds * TOLERANCE <= fixed.seconds, said


@pytest.mark.parametrize("costs", PROFILES)
def test_a_prediction_the_prompt_holds_drafts_at_least_as_much(costs):
    """The whole-file edits: with the file as the prediction, ``auto`` drafts and accepts at
    least what prompt lookup alone did from the same text in the prompt, bar a few tokens."""
    for name in ANSWERS:
        if answer(name)["kind"] != "edit":
            continue
        without = run(name, costs)
        with_it = run(name, costs, prediction=tuple(answer(name)["prediction"]))
        accepted = [sum(r.accepted for r in x.rounds) for x in (without, with_it)]
        assert accepted[1] >= TOLERANCE * accepted[0], (name, accepted)
