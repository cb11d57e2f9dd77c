"""Replays run the real engine over a recorded answer: the same choices as a live run."""

from __future__ import annotations

import pytest

from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import RoundCompleted
from localspec.core.params import GenerationParams
from localspec.core.replay import DraftChoices, VirtualClock, replay, replay_ngram_simple
from tests.fakes import FakeModel, TimedFake, plain_greedy

CPU = CostProfile(
    plain_s=0.036,
    verify_s={1: 0.082, 3: 0.104, 4: 0.116, 8: 0.2, 15: 0.212, 31: 0.457, 63: 0.45},
)
FLAT = CostProfile(plain_s=1.0, verify_s={1: 1.5, 8: 1.6, 16: 1.65, 32: 1.8, 64: 2.0})


def rounds_of(events) -> list[tuple]:
    return [(r.drafter, r.drafted, r.accepted, r.reason, r.branches) for r in events]


@pytest.mark.parametrize("costs", [CPU, FLAT])
@pytest.mark.parametrize("seed", [0, 5])
def test_a_replay_makes_the_live_engines_choices(costs, seed):
    # Seed 0's answer cycles (its drafts copy it); seed 5's never repeats.
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
    params = GenerationParams(max_tokens=80)
    clock = VirtualClock()
    target = TimedFake(clock, costs, seed=seed, window=2)
    answer = plain_greedy(FakeModel(seed=seed, window=2), prompt, 80)
    live: list[RoundCompleted] = []
    decoder = SpecDecoder(target, None, costs, clock=clock)
    run_to_completion(
        decoder.generate(prompt, params),
        lambda e: live.append(e) if isinstance(e, RoundCompleted) else None,
    )
    replayed = replay([t + 1000 for t in prompt], [t + 1000 for t in answer], costs, params)
    assert replayed.token_ids == [t + 1000 for t in answer]  # its own ids, given back
    assert rounds_of(replayed.rounds) == rounds_of(live)
    assert replayed.seconds == pytest.approx(sum(r.seconds for r in live))
    if seed == 0:
        assert any(r.drafted for r in live)  # the comparison covers drafting rounds


def test_a_replay_prices_every_round_at_the_given_costs():
    prompt = list(range(100, 160)) + [5, 6]
    answer = list(range(100, 150)) + [7, 8, 9] + list(range(120, 160))
    replayed = replay(prompt, answer, CPU, GenerationParams(max_tokens=200))
    assert replayed.token_ids == answer
    assert replayed.seconds == pytest.approx(sum(CPU.verify(r.drafted) for r in replayed.rounds))
    assert any(r.drafter == "ngram" and r.accepted > 20 for r in replayed.rounds)
    with pytest.raises(ValueError):
        replay(prompt, answer, CPU, GenerationParams(temperature=0.5))


def test_a_replay_drafts_from_a_prediction_as_auto_does():
    prompt = [5, 6, 7]
    answer = list(range(100, 160))
    prediction = tuple(range(100, 160))  # ids the prompt and the answer may not hold
    with_it = replay(prompt, answer, CPU, GenerationParams(max_tokens=60, prediction=prediction))
    without = replay(prompt, answer, CPU, GenerationParams(max_tokens=60))
    assert with_it.token_ids == without.token_ids == answer
    assert any(r.drafter == "prediction" and r.accepted > 10 for r in with_it.rounds)
    assert with_it.seconds < without.seconds / 2
    unknown = replay(prompt, answer, CPU, GenerationParams(max_tokens=60, prediction=(999,) * 8))
    assert unknown.token_ids == answer


GPU = CostProfile(
    plain_s=1.0, verify_s={1: 1.05, 4: 1.1, 8: 1.2, 16: 1.4, 63: 2.5}, draft_step_s=0.1
)


def _answer_and_prompt(seed: int = 5) -> tuple[list[int], list[int]]:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
    return prompt, plain_greedy(FakeModel(seed=seed, window=2), prompt, 80)


def test_a_draft_that_guesses_the_answer_is_chosen_where_drafts_are_cheap():
    prompt, answer = _answer_and_prompt()
    params = GenerationParams(max_tokens=80)
    alone = replay(prompt, answer, GPU, params)
    right = DraftChoices([*answer, 0], [0.95] * (len(answer) + 1))
    drafted = replay(prompt, answer, GPU, params, draft=right)
    assert drafted.token_ids == alone.token_ids == answer
    by_model = [r for r in drafted.rounds if r.drafter == "model"]
    assert by_model and sum(r.accepted for r in by_model) > len(answer) // 2
    assert drafted.seconds < alone.seconds / 2


def test_a_draft_that_never_guesses_right_costs_draft_steps_and_is_left():
    prompt, answer = _answer_and_prompt()
    params = GenerationParams(max_tokens=80, drafter="model")
    wrong = DraftChoices([9999] * (len(answer) + 1), [0.99] * (len(answer) + 1))
    replayed = replay(prompt, answer, GPU, params, draft=wrong)
    assert replayed.token_ids == answer
    assert all(r.accepted == 0 for r in replayed.rounds)
    # Every round drafted (fixed policy), each draft running on past its wrong first token
    # at the confidence it had there, and every draft step was priced.
    left = len(answer)
    for r in replayed.rounds:  # as long as max_tokens leaves room for
        assert r.drafted == min(params.draft_max, left - 1)
        left -= 1
    plain = len(answer) * GPU.plain_s
    assert replayed.seconds > plain


def test_ngram_simple_replay_drafts_a_repeated_stretch():
    text = list(range(100, 180))
    prompt = text + [7, 8]
    answer = text[:60]
    seconds, done, drafts = replay_ngram_simple(prompt, answer, CPU)
    assert done == 60 and drafts and drafts[0][1] > 0
    assert seconds < 60 * CPU.plain_s
