"""The engine under a grammar, over scripted models: greedy output is plain decoding under
the same grammar with every drafter, forbidden drafts never reach the target, the tokens the
grammar admits alone are drafted without a model, and sampling is exact against the masked,
renormalized target."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.drafting.grammar import GrammarDrafter
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import FinishReason, RoundCompleted
from localspec.core.grammar import (
    SHORTLIST,
    best_allowed,
    cut,
    forced,
    masked,
    masked_for_top,
    spelled_after,
    token_index,
)
from localspec.core.params import GenerationParams
from localspec.core.sampling import warp
from tests.fakes import (
    FakeGrammar,
    FakeModel,
    plain_constrained,
    plain_greedy,
    template_grammar,
)
from tests.test_engine import CHEAP_VERIFY, PROMPT

EOG = 23
EVEN = set(range(0, 22, 2))
# Free positions (even tokens only), forced runs, and an end.
TEMPLATE = [EVEN, EVEN, {5}, {7}, {9}, EVEN, {1, 3}, EVEN, EVEN, {11}, {13}, EVEN, EVEN, EVEN]


def odd_grammar(accepted):
    """Any odd token but 21, then (after twelve) only the end."""
    return set(range(1, 21, 2)) if len(accepted) < 12 else {EOG}


@pytest.mark.parametrize("mode", ["none", "ngram", "model", "lookahead", "auto"])
@pytest.mark.parametrize("rule", [template_grammar(TEMPLATE, EOG), odd_grammar])
@pytest.mark.parametrize("noise", [0.0, 0.6, 3.0])
def test_greedy_output_under_a_grammar_is_plain_decoding_under_it(mode, rule, noise):
    target = FakeModel(seed=1, window=2, eog=(EOG,))
    draft = FakeModel(seed=1, window=2, noise=noise, eog=(EOG,))
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    for _ in range(2):  # and again, with what the drafters learned
        fin = run_to_completion(
            decoder.generate(
                PROMPT, GenerationParams(max_tokens=40, drafter=mode), grammar=FakeGrammar(rule)
            )
        )
        assert list(fin.token_ids) == plain_constrained(target, PROMPT, 40, rule)
        assert fin.reason == FinishReason.EOS


def test_unconstrained_output_differs_so_the_grammar_is_what_decides():
    target = FakeModel(seed=1, window=2, eog=(EOG,))
    rule = template_grammar(TEMPLATE, EOG)
    assert plain_greedy(target, PROMPT, 14) != plain_constrained(target, PROMPT, 14, rule)


def test_forced_tokens_are_drafted_without_a_model_and_accepted():
    target = FakeModel(seed=1, window=2, eog=(EOG,))
    rule = template_grammar(TEMPLATE, EOG)
    events = list(
        SpecDecoder(target, None, CHEAP_VERIFY).generate(
            PROMPT,
            GenerationParams(max_tokens=40, drafter="auto", left_out=("ngram", "lookahead")),
            grammar=FakeGrammar(rule),
        )
    )
    fin = events[-1]
    assert list(fin.token_ids) == plain_constrained(target, PROMPT, 40, rule)
    rounds = [e for e in events if isinstance(e, RoundCompleted) and e.drafter == "grammar"]
    # 5 7 9 and 11 13 are forced: drafted by the grammar and accepted whole.
    assert sum(r.accepted for r in rounds) == 5 and len(rounds) == 2


def test_plain_decoding_under_a_grammar_drafts_nothing():
    target = FakeModel(seed=1, window=2, eog=(EOG,))
    rule = template_grammar(TEMPLATE, EOG)
    fin = run_to_completion(
        SpecDecoder(target, None, CHEAP_VERIFY).generate(
            PROMPT, GenerationParams(max_tokens=40, drafter="none"), grammar=FakeGrammar(rule)
        )
    )
    assert fin.stats.drafted == 0
    assert list(fin.token_ids) == plain_constrained(target, PROMPT, 40, rule)


def test_a_forbidden_draft_is_cut_before_the_target_sees_it():
    """A draft model that drafts only even tokens under a grammar of odd ones: the target
    never evaluates one of its drafts."""
    target = FakeModel(seed=1, window=2, eog=(EOG,))
    draft = FakeModel(seed=1, window=2, eog=(EOG,))
    draft.logits_after = lambda ctx: np.where(np.arange(24) % 2 == 0, 50.0, 0.0).astype(  # type: ignore[method-assign]
        np.float32
    )
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    fin = run_to_completion(
        decoder.generate(
            PROMPT,
            GenerationParams(max_tokens=40, drafter="model"),
            grammar=FakeGrammar(odd_grammar),
        )
    )
    assert list(fin.token_ids) == plain_constrained(target, PROMPT, 40, odd_grammar)
    assert fin.stats.drafted == 0
    # Each round evaluated one token on the target: the draft never joined its batch.
    assert all(n == 1 for _, n, _ in target.calls[1:])


def test_best_allowed_masks_only_when_the_argmax_is_forbidden():
    row = np.array([0.0, 5.0, 1.0, 3.0])
    grammar = FakeGrammar(lambda acc: {1, 3})
    assert best_allowed(row, grammar) == 1 and grammar.passes == 1
    grammar = FakeGrammar(lambda acc: {0, 2, 3})
    assert best_allowed(row, grammar) == 3 and grammar.passes == 1 + 4


def masked_argmax(row, allowed):
    return int(np.argmax(np.where(np.isin(np.arange(len(row)), list(allowed)), row, -np.inf)))


@pytest.mark.parametrize("seed", range(20))
def test_best_allowed_asks_about_the_rows_best_tokens_before_the_whole_vocabulary(seed):
    rng = np.random.default_rng(seed)
    row = np.round(rng.normal(size=2000), 1)  # rounded: ties, also at the shortlist's edge
    order = np.argsort(-row, kind="stable")
    # Forbidden: the argmax and a random share of the rest; allowed somewhere in the top.
    allowed = {int(t) for t in order[rng.integers(1, SHORTLIST) :] if rng.random() < 0.3}
    allowed.add(int(order[rng.integers(1, SHORTLIST)]))
    grammar = FakeGrammar(lambda acc: allowed)
    assert best_allowed(row, grammar) == masked_argmax(row, allowed)
    assert grammar.passes < len(row) / 4  # the shortlist, not the vocabulary


def test_best_allowed_masks_the_row_when_it_forbids_the_shortlist():
    row = np.arange(1000, dtype=float)  # the best tokens are the highest ids
    allowed = {3, 500}
    grammar = FakeGrammar(lambda acc: allowed)
    assert best_allowed(row, grammar) == 500
    assert grammar.passes > len(row)  # argmax, shortlist, then the whole row


@pytest.mark.parametrize("share", [0.9, 0.5, 0.05, 0.0])
@pytest.mark.parametrize("top_k", [0, 1, 40, 100])
def test_a_sampler_keeping_the_top_k_reads_the_same_distribution_from_the_shortlist(share, top_k):
    rng = np.random.default_rng(7)
    row = rng.normal(size=50_000)  # no equal logits
    allowed = {int(t) for t in range(len(row)) if rng.random() < share} | {49_999}
    params = GenerationParams(temperature=0.8, top_k=top_k, top_p=0.95, min_p=0.05)
    full, quick = FakeGrammar(lambda acc: allowed), FakeGrammar(lambda acc: allowed)
    expected = warp(masked(row, full), params)
    assert np.allclose(warp(masked_for_top(row, quick, top_k), params), expected)
    if top_k > 0 and share >= 0.5:
        assert quick.passes < len(row) / 4  # the shortlist, not the vocabulary


def test_cut_keeps_the_allowed_prefix_and_leaves_the_grammar_as_it_was():
    grammar = FakeGrammar(template_grammar([{1}, {2}, {3}], EOG))
    assert cut(grammar, [1, 2, 4, 3]) == ([1, 2], 4)
    assert cut(grammar, [1, 2, 3]) == ([1, 2, 3], None)
    assert grammar.accepted == ()


class TextGrammar(FakeGrammar):
    """A grammar over bytes, as real ones are: the answer is one of ``texts``; a token is
    allowed where the bytes so far and its own begin one of them, the end where they are
    one."""

    def __init__(self, texts, pieces, end, accepted=()):
        def allowed(acc):
            said = b"".join(pieces[t] for t in acc)
            ok = {t for t, p in pieces.items() if p and any(x.startswith(said + p) for x in texts)}
            return ok | ({end} if said in texts else set())

        super().__init__(allowed, accepted)
        self.texts, self.pieces, self.end = texts, pieces, end

    def clone(self):
        return TextGrammar(self.texts, self.pieces, self.end, self.accepted)


PIECES = {1: b"a", 2: b"ab", 3: b"abc", 4: b"x", 5: b"y", 6: b"", 7: b"b", 8: b"c", 9: b"cx"}


def spell(tokens):
    return [PIECES[t] for t in tokens]


def test_forced_spells_the_text_the_grammar_admits_alone_with_the_longest_tokens():
    index = token_index(10, lambda t: PIECES.get(t, b"?"), lambda t: t == 6)
    # "abcx" then "x" or "y": the text "abcx" is forced; "cx" would not be taken over "c"
    # and "x" only if nothing longer could follow.
    grammar = TextGrammar([b"abcxx", b"abcxy"], PIECES, 6)
    assert spell(forced(grammar, 5, index)) == [b"abc", b"x"]
    assert spell(forced(grammar, 1, index)) == [b"abc"]
    assert grammar.accepted == ()  # left as it was


def test_forced_stops_before_a_token_the_model_could_run_past_the_texts_end():
    index = token_index(10, lambda t: PIECES.get(t, b"?"), lambda t: t == 6)
    # Forced: "ab", then "c" or "y". The model may write "abc" or "ab" + "y": only
    # tokens that cannot run past "ab" are drafted, and "ab" could ("abc"): nothing.
    grammar = TextGrammar([b"abc", b"aby"], PIECES, 6)
    assert forced(grammar, 5, index) == []
    # Forced: "xa", then "b" or "y": "x" is safe, "a" could run on as "ab".
    grammar = TextGrammar([b"xab", b"xay"], PIECES, 6)
    assert spell(forced(grammar, 5, index)) == [b"x"]


def test_forced_stops_where_the_answer_may_end_or_two_bytes_may_come():
    index = token_index(10, lambda t: PIECES.get(t, b"?"), lambda t: t == 6)
    assert spell(forced(TextGrammar([b"x", b"xx"], PIECES, 6), 5, index)) == [b"x"]
    assert forced(TextGrammar([b"ab", b"b"], PIECES, 6), 5, index) == []


def test_forced_text_is_spelled_as_the_tokenizer_writes_it_where_that_spells_it():
    index = token_index(10, lambda t: PIECES.get(t, b"?"), lambda t: t == 6)
    grammar = TextGrammar([b"abcxx", b"abcxy"], PIECES, 6)
    # The tokenizer writes "abcx" as "ab" + "cx", not the longest "abc" + "x".
    assert spell(forced(grammar, 5, index, lambda text: [2, 9])) == [b"ab", b"cx"]
    # A spelling of other text, or of unknown ids, is not taken: the longest tokens are.
    assert spell(forced(grammar, 5, index, lambda text: [1, 7])) == [b"abc", b"x"]
    assert spell(forced(grammar, 5, index, lambda text: [99])) == [b"abc", b"x"]
    assert spell(forced(grammar, 5, index, lambda text: None)) == [b"abc", b"x"]


def test_a_token_the_model_could_run_past_gives_way_to_the_one_the_answer_wrote():
    index = token_index(10, lambda t: PIECES.get(t, b"?"), lambda t: t == 6)
    # Forced "ab", then "c" or "y": the model may write "ab" or "abc". Without a habit
    # nothing is drafted; where the answer wrote "abc" before, "abc" is.
    grammar = TextGrammar([b"abc", b"aby"], PIECES, 6)
    assert forced(grammar, 5, index, habit=lambda tokens: None) == []
    assert spell(forced(grammar, 5, index, habit=lambda ts: 3 if 3 in ts else None)) == [b"abc"]


def test_spelled_after_splits_the_text_as_it_follows_the_answers_last_words():
    piece = lambda t: PIECES.get(t, b"?")  # noqa: E731
    by_char = {"a": 1, "b": 7, "c": 8, "x": 4, "y": 5}

    def tokenize(text):  # "abc" one token wherever it is, else a token a character
        out, at = [], 0
        while at < len(text):
            whole = text.startswith("abc", at)
            out.append(3 if whole else by_char[text[at]])
            at += 3 if whole else 1
        return out

    # After "a", "bcx" would be split inside "abc": no boundary falls where "a" ends, so
    # the text is spelled alone.
    assert spelled_after(tokenize, piece, b"a", b"bcx") == [7, 8, 4]
    # After "x", a boundary falls where "x" ends: the tokens after it.
    assert spelled_after(tokenize, piece, b"x", b"abcy") == [3, 5]
    assert spelled_after(tokenize, piece, b"x", b"\xe2\x82") is None  # cut UTF-8


def drafter_at(texts, pieces, committed):
    drafter = GrammarDrafter(10, lambda t: pieces.get(t, b"?"), lambda t: t == 6)
    drafter.bind(TextGrammar(texts, pieces, 6, tuple(committed)))
    drafter.begin([], GenerationParams())
    return drafter


def test_the_grammar_drafter_bridges_a_choice_to_forced_text_by_the_answers_habit():
    # Three blocks of ("x" or "y") + "abc": after "xabcx" the rest of the block is forced,
    # the next block's first byte is a choice, and the answer wrote "x" after "abc" before.
    blocks = [b"xabc", b"yabc"]
    texts = [a + b + c for a in blocks for b in blocks for c in blocks]
    committed = [4, 3, 4]
    drafter = drafter_at(texts, PIECES, committed)
    offer = drafter.offer(committed, 8)
    assert offer is not None and offer.available == 3
    draft = drafter.propose(committed, 8, GenerationParams(), np.random.default_rng(0))
    assert spell(draft.tokens) == [b"abc", b"x", b"abc"]


def test_the_grammar_drafter_does_not_bridge_to_a_single_forced_byte():
    # Blocks of ("x" or "y") + "c": a bridge would lead to "c" alone, a byte that might be
    # a string's opening quote, where the answer's habits are another context's.
    blocks = [b"xc", b"yc"]
    texts = [a + b + c for a in blocks for b in blocks for c in blocks]
    committed = [4, 8, 4]
    drafter = drafter_at(texts, {4: b"x", 5: b"y", 6: b"", 8: b"c"}, committed)
    drafter.offer(committed, 8)
    draft = drafter.propose(committed, 8, GenerationParams(), np.random.default_rng(0))
    assert spell(draft.tokens) == [b"c"]


def masked_distribution(target: FakeModel, allowed: set[int]) -> np.ndarray:
    logits = target.logits_after(PROMPT).astype(np.float64)
    p = np.where([t in allowed for t in range(target.n_vocab)], np.exp(logits - logits.max()), 0)
    return p / p.sum()


@pytest.mark.parametrize("mode", ["model", "ngram"])
def test_sampling_under_a_grammar_follows_the_masked_target(mode):
    """Over many seeds, the first sampled token follows the target's distribution restricted
    to what the grammar allows and renormalized, whatever the draft puts on forbidden ids."""
    target = FakeModel(n_vocab=6, seed=12, sharpness=0.7)
    draft = FakeModel(n_vocab=6, seed=12, sharpness=0.7, noise=1.5)
    allowed = {0, 2, 3, 5}
    params = dict(max_tokens=2, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, drafter=mode)
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    n = 3000
    counts = np.zeros(6)
    for seed in range(n):
        fin = run_to_completion(
            decoder.generate(
                PROMPT,
                GenerationParams(seed=seed, **params),
                grammar=FakeGrammar(lambda acc: allowed),
            )
        )
        counts[fin.token_ids[0]] += 1
        assert set(fin.token_ids) <= allowed
    tv = 0.5 * float(np.abs(counts / n - masked_distribution(target, allowed)).sum())
    assert tv < 0.04
