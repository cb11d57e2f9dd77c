"""Draft trees in the loop: a tree round read back as the chain the target took, exact greedy
output through the engine on scripted models, the cache bookkeeping, and the switches that
turn trees off (``--no-trees``, sampled decoding)."""

from __future__ import annotations

import pytest

from localspec.core.costs import CostProfile
from localspec.core.drafting.copying import CopyDrafter
from localspec.core.engine import SpecDecoder
from localspec.core.events import RoundCompleted, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.tree_round import taken_branch, verify_branches
from tests.fakes import FakeModel, plain_greedy

# Batches that cost little more as they grow: trees pay.
FLAT = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.01 * k for k in range(1, 65)})


def test_the_branch_taken_is_the_first_that_starts_with_the_accepted_path():
    branches = [[4, 5, 6], [9, 8], [7]]
    assert taken_branch(branches, [9, 8]) == 1
    assert taken_branch(branches, [7]) == 2
    assert taken_branch(branches, [4]) == 0
    assert taken_branch(branches, []) == 0  # nothing accepted: the drafted one


def test_verify_branches_keeps_the_accepted_path_in_the_targets_cache():
    target = FakeModel(seed=2)
    committed = [1, 2, 3, 4]
    own = plain_greedy(target, committed, 3)
    wrong = (own[0] + 1) % target.n_vocab
    tried = verify_branches(target, committed, [[wrong, 5], own[:2]])
    assert tried.taken == 1 and tried.nodes == 4
    assert tried.verdict.accepted == 2 and tried.verdict.token == own[2]
    assert target.cached == committed + own[:2]


def forked_prompt(target: FakeModel) -> tuple[list[int], list[int]]:
    """A prompt whose suffix occurred three times before: twice going on with text the
    target does not write, once (the minority) with what it does write. The fake's logits
    depend on the last three tokens only, so the answer is the same after every one."""
    suffix = [50, 51, 52, 53]
    answer = plain_greedy(target, suffix, 30)
    wrong = [60, 61, 62, 63, 59, 58]
    assert wrong[0] != answer[0]
    prompt = [
        1, 40, *suffix, *wrong, 2, 41, *suffix, *wrong, 3, 42, *suffix, *answer[:12], 4, 43,
        *suffix,
    ]  # fmt: skip
    return prompt, answer


@pytest.fixture
def taken(monkeypatch):
    """The branches the n-gram drafter was told the target took."""
    calls: list[int] = []
    take = CopyDrafter.take

    def spy(self, i):
        if self.name == "ngram":
            calls.append(i)
        take(self, i)

    monkeypatch.setattr(CopyDrafter, "take", spy)
    return calls


def test_greedy_output_with_trees_is_the_targets_own_and_a_minority_branch_is_taken(taken):
    target = FakeModel(n_vocab=64, seed=7, window=3)
    prompt, _ = forked_prompt(target)
    committed = list(prompt)
    rounds, full = [], 0
    for event in SpecDecoder(target, None, FLAT).generate(
        prompt, GenerationParams(max_tokens=30, trace=True)
    ):
        if isinstance(event, TokenEmitted):
            committed.append(event.token_id)
        if isinstance(event, RoundCompleted):
            rounds.append(event)
            if event.emitted == event.accepted + 1:
                assert target.cached == committed[:-1]  # as after any chain round
                full += 1
    fin = event
    assert list(fin.token_ids) == plain_greedy(target, prompt, 30)
    trees = [r for r in rounds if r.branches > 1]
    assert trees and 1 in taken
    first = trees[0]
    assert first.accepted >= 8 and first.drafted > first.accepted + 8  # every node counted
    assert "tree 2x" in first.reason
    assert fin.stats.drafted == sum(r.drafted for r in rounds)
    assert fin.stats.by_origin["ngram"] >= first.accepted
    assert any(entry["branches"] == 2 for entry in fin.stats.trace)
    # One target pass per round, nothing evaluated twice: the prefill, then the last
    # committed token and every drafted node of each round.
    assert target.evaluated_tokens == len(prompt) - 1 + sum(1 + r.drafted for r in rounds)
    assert (len(prompt) - 1 + 0, 1 + first.drafted, 1 + first.drafted) in target.calls
    assert full >= len(rounds) - 1


@pytest.mark.parametrize("params", [{"trees": False}, {"temperature": 0.8, "seed": 3}])
def test_no_tree_without_trees_or_when_sampling(params, taken):
    target = FakeModel(n_vocab=64, seed=7, window=3)
    prompt, _ = forked_prompt(target)
    events = list(
        SpecDecoder(target, None, FLAT).generate(prompt, GenerationParams(max_tokens=30, **params))
    )
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert rounds and all(r.branches == 1 for r in rounds) and taken == []
    if not params.get("temperature"):
        assert list(events[-1].token_ids) == plain_greedy(target, prompt, 30)


def test_a_target_that_cannot_verify_trees_gets_chains():
    class Chains(FakeModel):
        @property
        def supports_trees(self) -> bool:
            return False

    target = Chains(n_vocab=64, seed=7, window=3)
    prompt, _ = forked_prompt(target)
    events = list(SpecDecoder(target, None, FLAT).generate(prompt, GenerationParams(max_tokens=30)))
    assert all(e.branches == 1 for e in events if isinstance(e, RoundCompleted))
    assert list(events[-1].token_ids) == plain_greedy(target, prompt, 30)


# -- --no-trees ----------------------------------------------------------------------------


def test_no_trees_reaches_the_generation_params_of_complete_chat_and_serve(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from localspec.cli import complete as complete_cli
    from localspec.cli import serve as serve_cli
    from localspec.cli.app import app
    from localspec.serve import server as serve_server
    from tests.test_cli import chat_cli

    seen: dict[str, bool] = {}

    def run_complete(prompt, params, options, **kw):
        seen["complete"] = params.trees
        return 0

    def run_server(state, host, port):  # nothing listens
        seen["serve"] = state.defaults.trees
        return True

    monkeypatch.setattr(complete_cli, "run_complete", run_complete)
    monkeypatch.setattr(serve_server, "run", run_server)
    monkeypatch.setattr(serve_cli, "load_into", lambda *args: None)  # no models are loaded
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello", encoding="utf-8")
    for flag in ([], ["--no-trees"]):
        seen.clear()
        result = CliRunner().invoke(app, ["complete", *flag, str(prompt)])
        assert result.exit_code == 0, result.output
        result = CliRunner().invoke(app, ["serve", *flag])
        assert result.exit_code == 0, result.output
        result, call = chat_cli(monkeypatch, *flag)
        assert result.exit_code == 0, result.output
        assert seen == {"complete": not flag, "serve": not flag}
        assert call["params"].trees is (not flag)
