"""Prompt lookup: longest suffix match, several occurrences, long drafts, the protocol."""

from __future__ import annotations

import numpy as np

from localspec.core.drafting.base import Outcome
from localspec.core.drafting.copying import CopyDrafter
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.grades import Grade, Pending
from localspec.core.drafting.ngram import ngram_drafter
from localspec.core.params import GenerationParams

GREEDY = GenerationParams()
RNG = np.random.default_rng(0)


def propose(d: CopyDrafter, tokens: list[int], k: int) -> list[int]:
    return d.propose(tokens, k, GREEDY, RNG).tokens


def test_prefers_the_longest_suffix_match():
    d = ngram_drafter(1, 8)
    # "5 6" occurred before 7 8; "6" alone occurred later, before 9.
    toks = [5, 6, 7, 8, 1, 6, 9, 2, 5, 6]
    d.begin(toks)
    m = d.source.match()
    assert m.n == 2 and m.starts == (2,)
    assert propose(d, toks, 2) == [7, 8]


def test_measures_matches_far_back_and_reports_them():
    body = list(range(100, 140))
    toks = [1, 2, 3] + body + [7, 7] + body[:20]
    d = ngram_drafter(2, 32)
    d.begin(toks)
    m = d.source.match()
    assert m.n == 20  # the whole repeated stretch, not just the 4-token key
    assert d.copy_offer(toks, 64).match == 20
    assert propose(d, toks, 64)[:20] == body[20:40]


def test_match_length_is_capped_at_n_max():
    body = list(range(100, 150))
    toks = body + body
    d = ngram_drafter(2, 16)
    d.begin(toks)
    assert d.source.match().n == 16


def test_follows_the_continuation_most_occurrences_share():
    # "0 1 2 3" is followed by 4 twice and, most recently, by 9 once.
    toks = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 8, 0, 1, 2, 3]
    d = ngram_drafter(2, 8)
    d.begin(toks)
    assert propose(d, toks, 2) == [4, 5]


def test_ties_go_to_the_most_recent_occurrence():
    toks = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    d = ngram_drafter(2, 2)
    d.begin(toks)
    assert propose(d, toks, 3) == [4, 9, 1]


def test_long_draft_stops_at_the_end_of_the_text():
    toks = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    d = ngram_drafter(2, 8)
    d.begin(toks)
    offer = d.copy_offer(toks, 64)
    assert offer.available == 6  # 4 5 6 1 2 3: everything after the occurrence
    assert propose(d, toks, 64) == [4, 5, 6, 1, 2, 3]
    assert d.copy_offer(toks, 2).available == 2  # bounded by the caller's limit


def test_no_match_incremental_extension_and_streak():
    d = ngram_drafter(2, 8)
    body = list(range(10, 30))
    toks = [1, 2, *body]
    d.begin(toks)
    assert d.source.match() is None and d.copy_offer(toks, 8) is None
    toks += [1, 2]
    d.observe(toks)
    offer = d.copy_offer(toks, 64)
    assert offer.match == 2 and not offer.under_way
    assert d.offer(toks, 64).drafter == "ngram"
    assert propose(d, toks, 10) == body[:10]
    toks += body[:11]
    d.observe(toks, Outcome(True, 10, 10))  # a long draft accepted whole: the copy goes on
    assert d.copy_offer(toks, 64).under_way
    assert propose(d, toks, 3) == body[11:14]
    toks += [body[11], 99]
    d.observe(toks, Outcome(True, 3, 1))  # parted: no streak
    after = d.copy_offer(toks, 64)
    assert after is None or not after.under_way


def test_never_matches_the_suffix_itself():
    d = ngram_drafter(1, 2)
    d.begin([7, 8])
    assert d.source.match() is None


def _draft_and_observe(d, toks, k, answer_tokens, accepted):
    draft = propose(d, toks, k)
    toks += answer_tokens
    d.observe(toks, Outcome(True, len(draft), accepted))
    return draft


def test_a_parted_copy_resumes_after_a_replaced_token():
    source = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    toks = [*source, 40, 1, 2, 3]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    # The answer copies 4 5, then writes 77 where the source has 6 (a renamed variable).
    draft = _draft_and_observe(d, toks, 5, [4, 5, 77], accepted=2)
    assert draft == [4, 5, 6, 7, 8]
    toks.append(7)  # a plain step: the answer is back on the source, after the 6
    d.observe(toks)
    offer = d.copy_offer(toks, 64)
    assert offer.evidence is Evidence.RESUMED and offer.available == len(toks) - 7
    assert propose(d, toks, 3) == [8, 9, 10]


def test_a_parted_copy_resumes_after_inserted_text():
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 1, 2, 3]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 5, [4, 5, 77], accepted=2)  # 77 inserted before the 6
    for token in (78, 6):  # more inserted text, then the source again
        toks.append(token)
        d.observe(toks)
    offer = d.copy_offer(toks, 64)
    assert offer.evidence is Evidence.RESUMED
    assert propose(d, toks, 3) == [7, 8, 9]


def test_a_parted_copy_is_forgotten_when_the_answer_goes_elsewhere():
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40, 1, 2, 3]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 5, [4, 5, 77], accepted=2)
    for token in range(100, 112):  # new text, nothing like the source
        toks.append(token)
        d.observe(toks)
    assert d.copy_offer(toks, 64) is None


END = 99  # an end-of-generation token: the end of a turn in the chat template


def test_a_copy_ends_after_the_end_of_a_turn():
    # The source turn ends with END, then the template goes on; the answer copies the turn.
    toks = [1, 2, 3, 4, 5, END, 60, 61, 62, 63, 1, 2]
    d = ngram_drafter(2, 16, ends=lambda t: t == END)
    d.begin(toks)
    offer = d.copy_offer(toks, 64)
    assert offer.available == 4  # 3 4 5 END: never the template after it
    assert propose(d, toks, 64) == [3, 4, 5, END]
    plain = ngram_drafter(2, 16)
    plain.begin(toks)
    assert propose(plain, toks, 64)[:6] == [3, 4, 5, END, 60, 61]


def test_preview_shows_the_draft_without_drafting_it():
    source = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    toks = [*source, 40, 1, 2, 3]
    d, never = ngram_drafter(2, 16), ngram_drafter(2, 16)
    d.begin(toks)
    never.begin(toks)
    assert d.preview(5) == [4, 5, 6, 7, 8]
    for token in (4, 5, 77, 7):  # plain steps: the answer copies, parts, and comes back
        toks.append(token)
        d.observe(toks)
        never.observe(toks)
        assert d.copy_offer(toks, 64) == never.copy_offer(toks, 64)
        assert propose(d, toks, 3) == propose(never, toks, 3)


def test_a_passed_draft_is_graded_once_the_answer_shows_its_fate():
    offer = CopyOffer(4, match=3)
    passed = Pending(Grade.PASSED, offer, (7, 8, 9, 10), start=3)
    assert passed.verdict([1, 2, 3, 7, 8]) is None  # so far, so good: not known yet
    assert passed.verdict([1, 2, 3, 7, 8, 5]) == (4, 2)  # parted at the third token
    assert passed.verdict([1, 2, 3, 7, 8, 9, 10, 11]) == (4, 4)  # held whole
    assert Pending(Grade.PASSED, offer, (), start=3).verdict([1, 2, 3]) == (0, 0)


# -- edits: what a rewrite replaces once, it replaces again ------------------------------------

OLD, NEW = 50, 77  # a variable and the name the answer gives it


def test_a_replaced_token_is_replaced_again_in_later_drafts():
    source = [1, 2, 3, OLD, 5, 6, 7, OLD, 9, 10, 11, 12, OLD, 14, 15]
    toks = [*source, 40, 1, 2]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    # The answer copies 3, writes NEW for OLD, and goes on with the source.
    _draft_and_observe(d, toks, 4, [3, NEW], accepted=1)
    toks.append(5)  # back on the source: OLD -> NEW is an edit of this text
    d.observe(toks)
    assert d.source.place.edits == {(OLD,): (NEW,)}
    assert propose(d, toks, 10) == [6, 7, NEW, 9, 10, 11, 12, NEW, 14, 15]


def test_a_replaced_span_is_learned_once_two_tokens_agree_again():
    old, new = [50, 51, 52], [77, 78]  # e.g. " current", "_str", "ing" -> " curr", "_str"
    source = [1, 2, 3, *old, 6, 7, 8, *old, 6, 9]
    toks = [*source, 40, 1, 2]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 4, [3, 77], accepted=1)
    for token in (78, 6, 7):  # the rest of the new name, then the source again
        toks.append(token)
        d.observe(toks)
    assert d.source.place.edits == {tuple(old): tuple(new)}
    assert propose(d, toks, 5) == [8, *new, 6, 9]


def test_a_copy_comes_back_where_most_of_the_answer_agrees_with_its_source():
    # " iter" "_values" " =" " iter" "(values" renamed to " iterator" " =" " iter" "(values":
    # " iter" agrees with the parted token itself (as if " iterator =" were inserted), but
    # " =" " iter" agrees with the source two tokens on: the name was replaced.
    name, rest, eq, it, args = 60, 61, 62, 60, 63
    source = [1, 2, 3, name, rest, eq, it, args, 8, 9, name, rest, 10, 11]
    toks = [*source, 40, 1, 2]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 4, [3, 77], accepted=1)  # 77: the new name
    for token in (eq, it):
        toks.append(token)
        d.observe(toks)
    assert d.source.place.edits == {(name, rest): (77,)}
    assert propose(d, toks, 6) == [args, 8, 9, 77, 10, 11]


def test_a_passage_the_answer_copied_from_elsewhere_is_not_an_edit():
    # The source has a line twice, as "start1," and as "start_0,"; the answer writes the
    # first place as the second has it: copying, not replacing "1" with "_0" everywhere.
    start, one, comma, us, zero = 50, 51, 52, 53, 54

    def edits_learned(source: list[int]) -> dict:
        toks = [*source, 40, 1, 2]
        d = ngram_drafter(2, 16)
        d.begin(toks)
        _draft_and_observe(d, toks, 3, [start, us], accepted=1)
        for token in (zero, comma):
            toks.append(token)
            d.observe(toks)
        return d.source.place.edits

    other = [start, us, zero, comma]
    assert edits_learned([1, 2, start, one, comma, 5, 6, 7, 8, 9, *other, 10, one, 11]) == {}
    # Without the other passage, the same answer tokens are an edit of this text.
    alone = [1, 2, start, one, comma, 5, 6, 7, 8, 9, 10, one, 11]
    assert edits_learned(alone) == {(one,): (us, zero)}


def test_an_edit_the_answer_does_not_make_is_forgotten():
    source = [1, 2, 3, OLD, 5, 6, 7, OLD, 9, 10]
    toks = [*source, 40, 1, 2]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 4, [3, NEW], accepted=1)
    toks.append(5)
    d.observe(toks)
    assert propose(d, toks, 3) == [6, 7, NEW]
    toks += [6, 7, OLD]  # here the answer keeps the old name
    d.observe(toks, Outcome(True, 3, 2))
    assert d.source.place.edits == {}
    assert propose(d, toks, 2) == [9, 10]


def test_two_spans_that_trade_places_are_not_learned_as_edits():
    # Two parameters swapped: the answer writes B where the source has A, then A where it
    # has B. Neither is a rename that later text repeats.
    a, b = 50, 60
    source = [1, 2, 3, a, 5, 6, b, 5, 6, 9, 10, a, 11, b, 12, 13]
    toks = [*source, 40, 1, 2]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 4, [3, b], accepted=1)
    toks.append(5)  # back on the source: A -> B so far
    d.observe(toks)
    assert d.source.place.edits == {(a,): (b,)}
    _draft_and_observe(d, toks, 3, [6, a], accepted=1)  # and A where the source has B
    toks.append(5)
    d.observe(toks)
    assert d.source.place.edits == {}
    assert propose(d, toks, 8) == [6, 9, 10, a, 11, b, 12, 13]


def test_insertions_are_not_learned_as_edits():
    source = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    toks = [*source, 40, 1, 2, 3]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _draft_and_observe(d, toks, 5, [4, 5, 77], accepted=2)  # 77 inserted before the 6
    toks.append(6)
    d.observe(toks)
    assert d.source.place.edits == {} and propose(d, toks, 3) == [7, 8, 9]


def test_a_copy_followed_through_edits_is_offered_on_the_length_it_was_followed():
    body = [10, 11, 12, OLD, 14, 15, 16, 17, OLD, 19, 20, 21, 22, 23, OLD, 25, 26, 27]
    toks = [*body, 40, 10, 11]
    d = ngram_drafter(2, 32)
    d.begin(toks)
    _draft_and_observe(d, toks, 3, [12, NEW], accepted=1)
    toks.append(14)
    d.observe(toks)
    # Just back: too soon to call it a copy.
    assert d.copy_offer(toks, 64).evidence is Evidence.RESUMED
    draft = _draft_and_observe(d, toks, 8, [15, 16, 17, NEW, 19, 20, 21, 22, 23], accepted=8)
    assert draft == [15, 16, 17, NEW, 19, 20, 21, 22]
    offer = d.copy_offer(toks, 64)
    # The suffix (with NEW in it) matches little, but the copy was followed for 10 tokens
    # and its last draft held whole.
    assert offer.evidence is not Evidence.RESUMED and offer.under_way and offer.match == 10
    assert propose(d, toks, 5) == [NEW, 25, 26, 27, 40]


def test_short_drafts_accepted_whole_in_a_row_add_up_to_a_copy_under_way():
    body = list(range(10, 60))
    toks = [1, 2, 3, 4, *body, 7, 1, 2, 3, 4]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    assert not d.copy_offer(toks, 64).under_way
    _draft_and_observe(d, toks, 5, body[:6], accepted=5)  # 5 accepted whole: not yet
    assert not d.copy_offer(toks, 64).under_way
    _draft_and_observe(d, toks, 5, body[6:12], accepted=5)  # 10 in a row: a copy under way
    assert d.copy_offer(toks, 64).under_way
    _draft_and_observe(d, toks, 5, [*body[12:15], 99], accepted=3)  # parted
    offer = d.copy_offer(toks, 64)
    assert offer is None or not offer.under_way


def _priced_round(d, toks, k, answer_tokens, accepted):
    """A round the drafter was offered and chosen for: its pricing learns from it."""
    d.offer(toks, 64)
    draft = propose(d, toks, k)
    toks += answer_tokens
    d.observe(toks, Outcome(True, len(draft), accepted))
    return draft


def test_a_short_draft_accepted_whole_learns_how_far_the_copy_went_on():
    """A copy under way drafted shorter than the limit leaves its deeper positions
    untried; once the answer shows that the copy went on, they count as accepted, so a
    copy drafted short after one deep failure can be drafted long again."""
    body = list(range(10, 110))
    toks = [1, 2, 3, 4, *body, 7, 1, 2, 3, 4]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _priced_round(d, toks, 16, body[:17], accepted=16)  # a copy under way
    assert d.copy_offer(toks, 64).under_way
    _priced_round(d, toks, 10, body[17:28], accepted=10)  # whole, 54 short of the limit
    (est,) = d.pricing.streaks.values()
    assert len(est.tries) == 10  # only the drafted depths are known yet
    for token in body[28:81]:  # the answer goes on along the copy, by plain steps
        toks.append(token)
        d.observe(toks)
    assert len(est.tries) == d.limit
    assert est.hits[10:] == est.tries[10:] and min(est.tries[10:]) >= 1


def test_a_short_draft_whose_copy_parts_right_after_it_learns_that_too():
    body = list(range(10, 110))
    toks = [1, 2, 3, 4, *body, 7, 1, 2, 3, 4]
    d = ngram_drafter(2, 16)
    d.begin(toks)
    _priced_round(d, toks, 16, body[:17], accepted=16)
    _priced_round(d, toks, 10, [*body[17:27], 99], accepted=10)  # the next token parts
    (est,) = d.pricing.streaks.values()
    assert len(est.tries) == d.limit  # graded at once: the 11th token was not the copy's
    assert est.tries[10] == 1 and est.hits[10] == 0 and est.tries[11] == 0


# -- disagreeing sources: shares, alternatives, and the branch the target took ---------------


def test_disagreeing_occurrences_give_shares_and_one_alternative_per_next_token():
    # "0 1 2 3" goes on with 4 twice and, most recently, with 9 once.
    toks = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 8, 0, 1, 2, 3]
    d = ngram_drafter(2, 8)
    d.begin(toks)
    offer = d.copy_offer(toks, 3)
    assert offer.shares == (2 / 3, 1 / 3)
    assert d.alternatives(3, 4) == [[4, 5, 0], [9, 8, 0]]
    assert d.alternatives(3, 1) == [[4, 5, 0]]
    assert d.alternatives(3, 4)[0] == propose(d, toks, 3)  # the first is the chain's draft


def test_agreeing_occurrences_have_no_alternatives():
    toks = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2, 3]
    d = ngram_drafter(2, 8)
    d.begin(toks)
    assert d.copy_offer(toks, 8).shares == ()  # they part only later: one next token
    assert d.alternatives(3, 4) == [[4, 6, 0]]


def test_alternatives_apply_the_edits_and_stop_after_the_end_of_a_turn():
    toks = [
        1, 2, 3, OLD, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,  # the first source
        30, 20, 21, OLD, 23, END, 24,  # "20 21" goes on with OLD once...
        31, 20, 21, 25, 26, 27,  # ... and with 25 twice
        32, 20, 21, 25, 26, 28,
        41, 1, 2,
    ]  # fmt: skip
    d = ngram_drafter(2, 16, ends=lambda t: t == END)
    d.begin(toks)
    _draft_and_observe(d, toks, 4, [3, NEW], accepted=1)
    toks.append(5)  # OLD -> NEW is an edit of this text
    d.observe(toks)
    assert d.source.place.edits == {(OLD,): (NEW,)}
    for token in (20, 21):  # the answer leaves that source for text that occurs thrice
        toks.append(token)
        d.observe(toks)
    assert d.copy_offer(toks, 4).shares == (2 / 3, 1 / 3)
    assert d.alternatives(4, 4) == [[25, 26, 28, 41], [NEW, 23, END]]


def test_take_makes_the_branch_the_target_took_the_draft_observe_follows():
    a, b = list(range(10, 20)), list(range(30, 40))
    toks = [0, 1, 2, 3, *a, 50, 0, 1, 2, 3, *b, 51, 0, 1, 2, 3]
    answer = a[:9]  # the target takes branch a for 8 drafts, then writes a[8] itself
    streaks = {}
    for took in (True, False):
        d = ngram_drafter(2, 16)
        d.begin(toks)
        assert d.copy_offer(toks, 8).shares == (0.5, 0.5)
        assert d.alternatives(8, 2) == [b[:8], a[:8]]  # a tie: the most recent first
        if took:
            d.take(1)
        committed = toks + answer
        d.observe(committed, Outcome(True, 8, 8))
        streaks[took] = d.copy_offer(committed, 8).under_way
        if took:  # the copy of a goes on from where it was taken
            assert propose(d, committed, 2) == [a[9], 50]
    # Eight drafted tokens accepted in a row from the copy the target took: a copy under
    # way; without ``take`` the drafter would think its other branch parted at once.
    assert streaks == {True: True, False: False}


def test_a_fixed_policy_drafts_from_long_matches_only():
    """``--drafter ngram`` has no cost model to weigh a short match: it is offered drafts
    from matches of FIXED_MIN_MATCH tokens, while auto's drafter offers every match."""
    from localspec.core.costs import LiveCosts
    from localspec.core.drafting.base import Resources
    from localspec.core.drafting.ngram import build
    from localspec.core.drafting.tunables import FIXED_MIN_MATCH
    from localspec.core.engine import DEFAULT_COSTS
    from tests.fakes import FakeModel

    body = list(range(100, 140))
    for mode, shortest in (("ngram", FIXED_MIN_MATCH), ("auto", 2)):
        params = GenerationParams(drafter=mode)
        policy = params.drafter.policy
        drafter = build(params, Resources(LiveCosts(DEFAULT_COSTS), FakeModel(), policy=policy))
        for n in (2, FIXED_MIN_MATCH - 1, FIXED_MIN_MATCH):
            toks = [1, 2, 3, *body, 7, 7, *body[:n]]
            drafter.begin(toks, params)
            offer = drafter.copy_offer(toks, 64)
            assert (offer is not None) == (n >= shortest), (mode, n)
        assert drafter.limit == (params.draft_max if mode == "ngram" else params.ngram_draft_max)
