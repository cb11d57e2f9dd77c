"""A load planned as one value (session/plan.py), and the environment read at the edge.

``plan_load`` says which files, where each model runs, when the draft model loads and what is
measured and learned, loading nothing; ``--draft self`` is derived by its own step, never by
``resolve_pair``; ``LOCALSPEC_DEVICE_VERIFY`` and ``LOCALSPEC_GATHER`` are read by one parser
into the options; a server of several clients restores what auto learned but saves nothing.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from localspec.core.params import DrafterMode
from localspec.environment import DEVICE_VERIFY, GATHER, gathering
from localspec.errors import UsageError
from localspec.options.model import ModelChoice
from localspec.session import plan as plan_module
from localspec.session.loading import DraftPlan
from localspec.session.pair import ModelOptions, resolve_pair


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(plan_module, "gpu_devices", lambda: [])
    monkeypatch.setattr(plan_module, "gpu_hardware", lambda: None)


def test_the_plan_of_a_pair_loads_nothing_and_says_what_loading_will_do(tiny_pair, on_cpu):
    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft), lanes=0, n_ctx=256)
    plan = plan_module.plan_load(options)
    assert (plan.target, plan.draft, plan.derived) == (target, draft, False)
    assert plan.options.lanes == plan.load.lanes == 2  # auto, on the CPU
    assert plan.measuring and plan.decision is not None
    assert plan.decision.plan is DraftPlan.NOW  # the costs are measured with it
    assert plan.draft_now == draft and plan.endpoints == ()
    assert plan.restores_learning and plan.saves_learning
    assert plan.draft_load(99).greedy_vocab == 99 and plan.draft_load(99).greedy_confidence
    assert plan.target_load.exact is False and plan.load.device_greedy is None
    quiet = plan_module.plan_load(options.model_copy(update={"calibrate": False}))
    assert not (quiet.measuring or quiet.restores_learning or quiet.saves_learning)
    unsaved = plan_module.plan_load(options.model_copy(update={"save_learning": False}))
    assert unsaved.restores_learning and not unsaved.saves_learning


def test_a_self_draft_is_derived_by_its_own_step_never_by_resolve_pair(
    tiny_pair, on_cpu, monkeypatch
):
    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft="self", n_ctx=256, threads=1)
    assert resolve_pair(options) == (target, None)  # nothing derived
    derived: list[tuple] = []

    def derive(path, threads, on_progress):
        derived.append((path, threads))
        return draft

    monkeypatch.setattr(plan_module, "derive_self_draft", derive)
    plan = plan_module.plan_load(options)
    assert derived == [(target, 1)] and plan.derived and plan.draft == draft
    plain = plan_module.plan_load(options.model_copy(update={"use_draft": False}))
    assert derived == [(target, 1)] and not plain.derived and plain.draft is None


def test_rpc_split_is_checked_as_the_load_is_planned(tiny_pair, on_cpu):
    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256,
                           rpc=("127.0.0.1:50052",), rpc_split=(1.0, 2.0))  # fmt: skip
    with pytest.raises(UsageError, match="2 shares for 1 worker"):
        plan_module.plan_load(options)
    plan = plan_module.plan_load(options.model_copy(update={"rpc_split": (1.0,)}))
    assert [str(e) for e in plan.endpoints] == ["127.0.0.1:50052"]
    assert plan.target_load.tensor_split == (1.0,) and plan.load.tensor_split != (1.0,)


@pytest.mark.parametrize(("value", "setting"), [(None, None), ("auto", None), (" 1 ", True),
                                                ("0", False)])  # fmt: skip
def test_the_environment_is_read_into_the_options_by_one_parser(monkeypatch, value, setting):
    for name in (DEVICE_VERIFY, GATHER):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert ModelChoice().options(DrafterMode.AUTO).device_verify is setting
    assert ModelChoice().options(device_verify=False).device_verify is False  # given wins
    assert gathering() is setting


def test_a_bad_environment_value_is_refused_before_anything_loads(monkeypatch):
    monkeypatch.setenv(DEVICE_VERIFY, "yes")
    with pytest.raises(UsageError, match="LOCALSPEC_DEVICE_VERIFY='yes' is neither auto"):
        ModelChoice().options(DrafterMode.AUTO)
    monkeypatch.setenv(GATHER, "maybe")
    with pytest.raises(UsageError, match="LOCALSPEC_GATHER='maybe' is neither auto"):
        gathering()


@pytest.mark.parametrize(("keys", "saves"), [([], True), (["a"], True), (["a", "b"], False)])
def test_a_server_of_several_clients_restores_what_auto_learned_but_saves_nothing(
    monkeypatch, keys, saves
):
    from localspec.cli import serve as serve_cli
    from localspec.cli.app import app
    from localspec.serve import server as serve_server

    loads = []

    def run(state, host, port):  # nothing listens: the loading thread has run
        state.loader.join(10)
        return True

    monkeypatch.setattr(serve_server, "run", run)
    monkeypatch.setattr(serve_cli, "load_into", lambda *args: loads.append(args))
    monkeypatch.setattr(serve_cli, "_log_to_stderr", lambda: None)
    monkeypatch.delenv("LOCALSPEC_API_KEY", raising=False)
    flags = [word for key in keys for word in ("--api-key", key)]
    result = CliRunner().invoke(app, ["serve", *flags])
    assert result.exit_code == 0, result.output
    ((state, options, *_),) = loads
    assert options.learn and options.save_learning is saves
