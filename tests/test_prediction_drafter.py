"""The prediction drafter: drafts from the first token, finds its place again after edits,
and leaves the output the target's own."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.cached_model import common_prefix_length
from localspec.core.costs import CostProfile
from localspec.core.drafting.base import NOT_CHOSEN, Outcome
from localspec.core.drafting.copying import CopyDrafter
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.prediction import prediction_drafter
from localspec.core.drafting.tunables import RESUME_AFTER, RESYNC_MISSES
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams
from localspec.core.replay import VirtualClock
from tests.fakes import FakeModel, TimedFake, plain_greedy

RNG = np.random.default_rng(0)
PROMPT = [90, 91, 92]
PREDICTION = list(range(100, 140))


def start(prediction=PREDICTION, vocab=None) -> tuple[CopyDrafter, list[int]]:
    drafter = prediction_drafter(vocab=vocab)
    drafter.begin(PROMPT, GenerationParams(prediction=tuple(prediction)))
    return drafter, list(PROMPT)


def propose(d: CopyDrafter, committed: list[int], k: int) -> list[int]:
    return d.propose(committed, k, GenerationParams(), RNG).tokens


def answer(d: CopyDrafter, committed: list[int], tokens: list[int]) -> None:
    """Plain steps: the answer writes ``tokens`` one by one."""
    for token in tokens:
        committed.append(token)
        d.observe(committed, NOT_CHOSEN)


def drafted(d: CopyDrafter, committed: list[int], k: int, written: list[int]) -> list[int]:
    """A round drafting ``k`` tokens, after which the answer is ``written``."""
    draft = propose(d, committed, k)
    accepted = common_prefix_length(draft, written[: len(draft)])
    committed += written[: accepted + 1]
    d.observe(committed, Outcome(True, len(draft), accepted))
    return draft


def test_it_drafts_from_the_first_token_without_a_match():
    d, committed = start()
    offer = d.copy_offer(committed, 64)
    assert offer is not None and offer.available == len(PREDICTION)
    assert propose(d, committed, 5) == PREDICTION[:5]
    assert d.offer(committed, 64).drafter == "prediction"


def test_the_predictions_own_end_is_never_taken_for_the_answers_context():
    # The prediction's last tokens occur earlier in it too: the answer still starts at its
    # first token, not after that earlier occurrence.
    prediction = [5, 6, 7, 8, 9, 1, 2, 3, 4, 10, 11, 1, 2, 3, 4]
    d, committed = start(prediction)
    assert propose(d, committed, 4) == prediction[:4]


def test_after_a_replaced_token_it_resyncs_and_goes_on():
    d, committed = start()
    written = [*PREDICTION[:4], 77, *PREDICTION[5:]]  # one token replaced
    assert drafted(d, committed, 6, written) == PREDICTION[:6]
    answer(d, committed, [written[5]])  # back on the prediction, after the replaced token
    assert d.copy_offer(committed, 64).evidence is Evidence.RESUMED
    assert propose(d, committed, 3) == PREDICTION[6:9]


def test_after_inserted_text_it_resyncs_and_goes_on():
    d, committed = start()
    written = [*PREDICTION[:4], 77, 78, *PREDICTION[4:]]  # two tokens inserted
    drafted(d, committed, 6, written)
    answer(d, committed, written[len(committed) - len(PROMPT) : 7])
    assert propose(d, committed, 3) == PREDICTION[5:8]


def test_after_a_long_cut_it_finds_its_place_by_the_answers_end():
    d, committed = start()
    written = [*PREDICTION[:4], *PREDICTION[20:]]  # 16 tokens deleted
    drafted(d, committed, 6, written)
    answer(d, committed, written[len(committed) - len(PROMPT) : 7])
    assert propose(d, committed, 3) == PREDICTION[23:26]


def test_a_prediction_shorter_than_the_answer_drafts_what_it_has():
    short = PREDICTION[:5]
    d, committed = start(short)
    assert d.copy_offer(committed, 64).available == 5
    drafted(d, committed, 5, [*short, 60, 61])
    assert propose(d, committed, 8) == []  # nothing left to copy, nothing repeated


def test_a_copy_of_the_prediction_ends_at_its_end_not_in_the_answers_start():
    # The answer opens with a fence (7, 8), copies the prediction and closes with another
    # fence (7, 9): the prediction's last token is followed by nothing the answer wrote, so
    # no draft reads on into the answer's opening.
    d, committed = start()
    answer(d, committed, [7, 8, PREDICTION[0]])
    assert d.copy_offer(committed, 64).available == len(PREDICTION) - 1
    written = [*PREDICTION[1:], 7, 9]
    assert drafted(d, committed, 64, written) == PREDICTION[1:]
    assert d.copy_offer(committed, 64) is None
    answer(d, committed, [9])
    assert d.copy_offer(committed, 64) is None


def test_an_empty_prediction_offers_nothing_and_a_bad_id_ends_it():
    d, committed = start([])
    assert d.copy_offer(committed, 64) is None and d.offer(committed, 64) is None
    d, committed = start([*PREDICTION[:3], 10_000, *PREDICTION[3:]], vocab=1000)
    assert d.source.prediction == tuple(PREDICTION[:3])


COSTS = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.05 * k for k in range(1, 65)})


@pytest.mark.parametrize("follows", [True, False])
def test_greedy_output_is_the_targets_own_with_any_prediction(follows):
    target = FakeModel(seed=4, window=3)
    prompt = [3, 1, 4, 1, 5]
    plain = plain_greedy(target, prompt, 80)
    prediction = plain if follows else [int(t) for t in RNG.integers(0, 24, 80)]
    params = GenerationParams(max_tokens=80, prediction=tuple(prediction))
    clock = VirtualClock()  # rounds priced at COSTS, whatever this machine's speed
    timed = TimedFake(clock, COSTS, seed=4, window=3)
    fin = run_to_completion(SpecDecoder(timed, None, COSTS, clock=clock).generate(prompt, params))
    assert list(fin.token_ids) == plain
    if follows:
        assert fin.stats.by_origin["prediction"] > 60
        assert fin.stats.by_drafter["prediction"].rounds < 10


def test_sampled_output_with_a_prediction_keeps_the_targets_distribution():
    """The first sampled token over many seeds, with a prediction of the most likely one."""
    target = FakeModel(n_vocab=6, seed=12, sharpness=0.7)
    prompt = [1, 2, 3]
    logits = target.logits_after(prompt).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    decoder = SpecDecoder(target, None, COSTS)
    counts = np.zeros(6)
    n, drafts = 3000, 0
    prediction = (int(np.argmax(p)), 2, 2)
    for seed in range(n):
        params = GenerationParams(
            max_tokens=2, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
            prediction=prediction,
        )  # fmt: skip
        decoder.forget_learning()  # each run as a fresh process: the first round drafts
        fin = run_to_completion(decoder.generate(prompt, params))
        counts[fin.token_ids[0]] += 1
        drafts += fin.stats.by_drafter.get("prediction") is not None
    assert drafts == n  # every first token was drafted from the prediction, then verified
    assert 0.5 * float(np.abs(counts / n - p).sum()) < 0.04


def test_a_question_asked_again_is_drafted_from_its_earlier_answer(tiny_pair, monkeypatch):
    """The history keeps each answer with the end of its prompt: the same prompt again
    gets the earlier answer as its prediction (history on, auto), and no other does."""
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    session = open_session(ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1))
    given: list[GenerationParams] = []
    generate = session.decoder.generate

    def spy(tokens, params, cancel=None, **kw):
        given.append(params)
        return generate(tokens, params, cancel, **kw)

    monkeypatch.setattr(session.decoder, "generate", spy)
    params = GenerationParams(max_tokens=24)
    question = "the cat sat on the mat and then " * 3  # longer than the kept prompt end
    try:
        first = run_to_completion(session.complete(question, params, raw=True))
        again = run_to_completion(session.complete(question, params, raw=True))
        other = run_to_completion(session.complete("the dog " * 8, params, raw=True))
        ngram = GenerationParams(max_tokens=24, drafter="ngram")
        fixed = run_to_completion(session.complete(question, ngram, raw=True))
    finally:
        session.close()
    assert given[0].prediction == ()
    assert given[1].prediction == first.token_ids  # the earlier answer, whole
    assert again.token_ids == first.token_ids
    assert given[2].prediction == () and given[3].prediction == ()  # another prompt; no auto
    assert other.token_ids and fixed.token_ids


def test_a_preamble_of_any_length_waits_for_the_predictions_start():
    """Chat answers open with a code fence or a sentence before the file: however long,
    the prediction's start waits, learns no edit from it, and is priced as a long match
    once the answer has come to it."""
    d, committed = start()
    preamble = list(range(60, 60 + 2 * RESYNC_MISSES))  # none of them in the prediction
    answer(d, committed, preamble)
    assert d.copy_offer(committed, 64) is None
    answer(d, committed, [PREDICTION[0]])
    offer = d.copy_offer(committed, 64)
    assert offer.evidence is Evidence.START
    assert propose(d, committed, 5) == PREDICTION[1:6]
    assert d.source.follower.place.edits == {}
    pricing = d.pricing
    resumed = CopyOffer(offer.available, evidence=Evidence.RESUMED)
    start_priced, resumed_priced = (pricing.expected_accepted(o, 15)[-1] for o in (offer, resumed))
    assert start_priced > 2 * resumed_priced


def test_an_edit_ends_the_start_and_the_copy_resyncs_as_any_does():
    d, committed = start()
    answer(d, committed, [60, 61, 62, PREDICTION[0]])  # a fence, then the prediction
    written = [*PREDICTION[1:4], 77, *PREDICTION[5:]]  # its fifth token replaced
    drafted(d, committed, 6, written)
    answer(d, committed, [written[4]])  # back on the prediction, after the replaced token
    offer = d.copy_offer(committed, 64)
    assert offer.evidence is Evidence.RESUMED
    assert propose(d, committed, 3) == PREDICTION[6:9]


def test_a_copy_that_parted_after_a_long_run_is_resumed_as_at_the_start():
    """An edit in the middle of a file the answer has been copying for a while: where the
    answer comes back to the prediction, it is priced as at the prediction's start, not as
    any resumed copy."""
    d, committed = start()
    assert RESUME_AFTER <= 20
    written = [*PREDICTION[:20], 77, *PREDICTION[21:]]  # the 21st token replaced
    drafted(d, committed, 24, written)  # 20 followed, then the edit
    answer(d, committed, [written[21]])  # back on the prediction
    offer = d.copy_offer(committed, 64)
    assert offer.evidence is Evidence.START
    assert propose(d, committed, 3) == PREDICTION[22:25]


def test_a_prediction_the_prompt_holds_is_one_copy_with_prompt_lookup():
    """Where prompt lookup and the prediction would draft the same tokens, one offer is
    weighed: prompt lookup's (as without the prediction), but for the prediction's start,
    which only it knows. Where they differ, both are weighed."""
    from localspec.core.drafting.copying import one_copy
    from localspec.core.drafting.ngram import ngram_drafter

    text = PREDICTION[:30]
    prompt = [90, 91, *text, 92]
    ngram, pred = ngram_drafter(), prediction_drafter()
    drafters = {"ngram": ngram, "prediction": pred}
    params = GenerationParams(prediction=tuple(text))
    for d in drafters.values():
        d.begin(prompt, params)
    committed = list(prompt)

    def offered() -> dict:
        made = {n: d.offer(committed, 64) for n, d in drafters.items()}
        return one_copy({n: o for n, o in made.items() if o is not None}, drafters)

    assert list(offered()) == ["prediction"]  # its start: prompt lookup has no match yet
    for token in text[:6]:  # the answer copies the file
        committed.append(token)
        for d in drafters.values():
            d.observe(committed, NOT_CHOSEN)
    both = {n: d.offer(committed, 16) for n, d in drafters.items()}
    assert set(both) == {"ngram", "prediction"}  # each could draft 16 tokens of the file
    assert pred.offered.evidence is not Evidence.START
    assert list(one_copy(both, drafters)) == ["ngram"]
    for _ in range(3):  # the answer's copies of the prediction bear out its odds better
        pred.pricing.copies.grade(1.0, 0.5)
    assert pred.proven > ngram.proven
    assert list(one_copy(both, drafters)) == ["prediction"]
    # The prediction ends with the file; the prompt goes on with what closes it: one copy,
    # prompt lookup's, which reads further, however well the prediction has done.
    longer = {n: d.offer(committed, 64) for n, d in drafters.items()}
    assert pred.preview(64) == text[6:] and ngram.preview(64)[:24] == text[6:]
    assert len(ngram.preview(64)) > 24
    assert list(one_copy(longer, drafters)) == ["ngram"]
    # A prediction that goes on otherwise than the prompt's text: both are weighed.
    other = prediction_drafter()
    other.begin(prompt, GenerationParams(prediction=(*text[:6], 88, 89, 87)))
    other.observe(committed, NOT_CHOSEN)
    drafters["prediction"] = other
    made = {n: d.offer(committed, 64) for n, d in drafters.items()}
    assert other.preview(3) == [88, 89, 87] and ngram.preview(3) == text[6:9]
    assert one_copy(made, drafters) == made


def test_a_draft_before_the_answer_has_written_anything_costs_little_if_it_fails():
    """Whether the answer opens with the prediction or with a fence is unknown until it
    writes something: the first draft is as long as failing it costs at most
    ``BLIND_COST`` plain steps (at least one token, for the answer to grade), and the
    prediction's start is drafted at full length once the answer has come to it."""
    from localspec.core.drafting.tunables import BLIND_COST

    cheap = CostProfile(plain_s=1.0, verify_s={1: 1.02, 8: 1.16, 64: 2.4})  # GPU-like
    blind = max(k for k in range(1, 41) if cheap.verify(k) <= BLIND_COST * cheap.plain_s)
    assert 1 < blind < len(PREDICTION)
    d = prediction_drafter(costs=cheap)
    d.begin(PROMPT, GenerationParams(prediction=tuple(PREDICTION)))
    committed = list(PROMPT)
    assert d.copy_offer(committed, 64).available == blind
    answer(d, committed, [PREDICTION[0]])
    assert d.copy_offer(committed, 64).available >= len(PREDICTION) - 1

    dear = CostProfile(plain_s=1.0, verify_s={1: 1.6, 64: 32.0})  # a batch costs many steps
    d = prediction_drafter(costs=dear)
    d.begin(PROMPT, GenerationParams(prediction=tuple(PREDICTION)))
    assert d.copy_offer(list(PROMPT), 64).available == 1
    decoder = SpecDecoder(TimedFake(VirtualClock(), dear), None, dear)
    prompt = [3, 1, 4, 1, 5]
    params = GenerationParams(max_tokens=8, prediction=tuple(PREDICTION))
    events: list = []
    run_to_completion(decoder.generate(prompt, params), events.append)
    first = next(e for e in events if type(e).__name__ == "RoundCompleted")
    assert first.drafter is None  # the answer's first token, unknown: a plain step


def test_prompt_lookup_left_out_of_a_round_that_drafts_its_copy_follows_it_as_its_own():
    """One copy, one offer: where the offer weighed instead of prompt lookup's is drafted
    and prompt lookup's own would have been chosen in its place, prompt lookup follows the
    draft as if it had drafted it (its place in the prompt, its streak), as it would have
    without the prediction; where its own would not have been chosen, it follows the answer
    as after a round that passed it over."""
    from localspec.core.drafting.copying import one_copy
    from localspec.core.drafting.ngram import ngram_drafter

    text = PREDICTION[:30]
    prompt = [90, 91, *text, 92]
    results = {}
    for would in (True, False):
        ngram, pred = ngram_drafter(), prediction_drafter()
        drafters = {"ngram": ngram, "prediction": pred}
        for d in drafters.values():
            d.begin(prompt, GenerationParams(prediction=tuple(text)))
        committed = list(prompt)
        for token in text[:6]:  # the answer copies the file
            committed.append(token)
            for d in drafters.values():
                d.observe(committed, NOT_CHOSEN)
        for _ in range(3):  # the prediction's copies have borne out its odds better
            pred.pricing.copies.grade(1.0, 0.5)
        made = {n: d.offer(committed, 16) for n, d in drafters.items()}
        chosen: list[list[str]] = []

        def chooses(offers, would=would, chosen=chosen):
            chosen.append([o.drafter for o in offers])
            return offers[0].drafter if would else None

        assert list(one_copy(made, drafters, chooses)) == ["prediction"]
        assert chosen == [["ngram"]]  # prompt lookup's offer, weighed in the prediction's place
        draft = propose(pred, committed, 10)
        assert draft == text[6:16]
        committed += [*draft, text[16]]  # accepted whole, and the copy goes on
        pred.observe(committed, Outcome(True, 10, 10))
        ngram.observe(committed, NOT_CHOSEN)
        results[would] = ngram.source.place.streak.copied
    assert results == {True: 10, False: 0}
