"""Option groups (``cli.groups``) and the shared option set of ``options``: each
group's options appear once per command that takes it, and the command receives one typed
value per group; each option says where its value goes, and the checks are those the
Python API makes too."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from localspec.cli.groups import option_groups
from localspec.core.params import DrafterMode
from localspec.errors import UsageError
from localspec.options.generation import DraftingChoice, SamplingChoice
from localspec.options.model import (
    ModelChoice,
    Option,
    PairChoice,
    Spelling,
    command_line,
    options_of,
    settings,
)
from localspec.options.stores import SharedStoreChoice, StoreChoice


@dataclass(frozen=True)
class Size:
    width: Annotated[int, typer.Option(help="how wide")] = 3
    tall: Annotated[bool, typer.Option("--tall", help="stand up")] = False


@dataclass(frozen=True)
class Colour:
    colour: Annotated[str, typer.Option(help="which colour")] = "red"


def run(command, *args: str):
    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands: the first is named, as in localspec
    return CliRunner().invoke(app, [command.__name__, *args])


def test_a_command_receives_one_value_per_group_built_from_its_options():
    seen = []

    @option_groups
    def draw(
        name: Annotated[str, typer.Argument()], *, size: Size, colour: Colour, loud: bool = False
    ) -> None:
        seen.append((name, size, colour, loud))

    result = run(draw, "box", "--width", "7", "--tall", "--colour", "blue", "--loud")
    assert result.exit_code == 0, result.output
    assert seen == [("box", Size(width=7, tall=True), Colour("blue"), True)]
    seen.clear()
    assert run(draw, "box").exit_code == 0
    assert seen == [("box", Size(), Colour(), False)]  # the fields' defaults


def test_the_signature_lists_the_group_options_in_the_group_s_place():
    @option_groups
    def draw(first: int = 1, *, size: Size, last: str = "") -> None:
        pass

    parameters = inspect.signature(draw).parameters
    assert list(parameters) == ["first", "width", "tall", "last"]
    assert parameters["width"].default == 3 and parameters["tall"].default is False
    assert parameters["width"].kind is inspect.Parameter.KEYWORD_ONLY


def test_help_shows_each_group_option_with_its_help_and_default():
    @option_groups
    def draw(*, size: Size) -> None:
        pass

    result = run(draw, "--help")
    assert result.exit_code == 0
    assert "--width" in result.output and "how wide" in result.output
    assert "--tall" in result.output and "stand up" in result.output


def test_an_option_named_twice_is_refused_when_the_command_is_declared():
    def draw(*, size: Size, width: int = 2) -> None:
        pass

    with pytest.raises(TypeError, match="options named twice: width"):
        option_groups(draw)


@dataclass(frozen=True)
class Bare:
    needed: int


def test_a_group_field_without_a_default_is_refused():
    def draw(*, bare: Bare) -> None:
        pass

    with pytest.raises(TypeError, match="an option needs a default"):
        option_groups(draw)


def test_model_options_parse_placement_rpc_and_shares():
    options = ModelChoice(
        target="t.gguf",
        ctx=2048,
        gpu_layers="all",
        draft_gpu_layers="0",
        rpc="10.0.0.2:50052,10.0.0.3:50052",
        rpc_split="3,1",
        exact=True,
    ).options(spelling=command_line("calibrate"), recalibrate=True)
    assert (options.target, options.n_ctx, options.exact, options.recalibrate) == (
        "t.gguf",
        2048,
        True,
        True,
    )
    assert (options.n_gpu_layers, options.draft_gpu_layers) == (-1, 0)
    assert options.rpc == ("10.0.0.2:50052", "10.0.0.3:50052")
    assert options.rpc_split == (3.0, 1.0)


def test_a_bad_model_value_names_the_option_and_the_command_s_help():
    with pytest.raises(UsageError) as caught:
        ModelChoice(threads=0).options(spelling=command_line("bench"))
    assert "--threads" in caught.value.message
    assert caught.value.hint == "see localspec bench --help"
    with pytest.raises(UsageError, match="--rpc-split"):
        ModelChoice(rpc="h:1", rpc_split="3,x").options()
    with pytest.raises(UsageError, match="--gpu-layers"):
        PairChoice(gpu_layers="most").options(spelling=command_line("doctor"))


def test_the_pair_group_leaves_rpc_and_exact_at_their_defaults():
    options = PairChoice(target="t.gguf", threads=2).options(spelling=command_line("doctor"))
    assert (options.threads, options.exact, options.rpc, options.rpc_split) == (2, False, (), ())


def test_model_choice_of_a_call_s_keywords():
    values = {field: None for field in ("draft", "gpu_layers", "draft_gpu_layers", "rpc")}
    values |= dict(target="t.gguf", threads=4, ctx=1024, rpc_timeout=5.0, rpc_split=None)
    values |= dict(exact=True, modes="none")  # not the model's: left out
    choice = ModelChoice.of(values)
    assert choice == ModelChoice(target="t.gguf", threads=4, ctx=1024, rpc_timeout=5.0, exact=True)


def test_each_option_sets_its_field_as_it_says():
    fields = settings(ModelChoice(ctx=512, gpu_layers="all", rpc_split="3,1"))
    assert (fields["n_ctx"], fields["n_gpu_layers"], fields["rpc_split"]) == (512, -1, (3.0, 1.0))
    assert "ctx" not in fields and "gpu_layers" not in fields
    assert settings(DraftingChoice(no_trees=True))["trees"] is False
    assert set(settings(SamplingChoice())) == {"temperature", "top_k", "top_p", "min_p", "seed"}


def test_an_error_names_the_option_as_its_front_end_writes_it():
    python = Spelling("", "_", "see help(localspec.load)")
    with pytest.raises(UsageError, match="invalid draft_gpu_layers") as caught:
        PairChoice(draft_gpu_layers="most").options(spelling=python)
    with pytest.raises(UsageError, match="invalid rpc_split 'x'"):
        ModelChoice(rpc="h:1", rpc_split="x").options(spelling=python)
    with pytest.raises(UsageError, match="invalid ctx: "):
        ModelChoice(ctx=8).options(spelling=python)
    assert caught.value.hint
    with pytest.raises(UsageError, match="store and no_store contradict"):
        StoreChoice(["docs"], True).fields(python)


@dataclass(frozen=True)
class Half:
    said: Annotated[int, Option(help="said")] = 1
    unsaid: int = 2


@dataclass(frozen=True)
class Shared:
    loud: Annotated[bool, Option("--loud", help="speak up")] = False
    level: Annotated[str, Option(metavar="LOW|HIGH", help="how much")] = "low"
    secret: Annotated[bool, Option("--secret", hidden=True)] = False


def test_a_group_field_without_an_option_is_refused():
    with pytest.raises(TypeError, match="fields without an Option: unsaid"):
        options_of(Half)


def test_a_shared_option_is_a_typer_option_of_the_same_flags_and_help():
    seen = []

    @option_groups
    def say(*, shared: Shared) -> None:
        seen.append(shared)

    result = run(say, "--help")
    assert "--loud" in result.output and "--no-loud" not in result.output
    assert "speak up" in result.output and "LOW|HIGH" in result.output
    assert "--secret" not in result.output
    assert run(say, "--loud", "--level", "high", "--secret").exit_code == 0
    assert seen == [Shared(loud=True, level="high", secret=True)]


def test_a_server_s_stores_are_named_ones_and_never_the_history():
    assert SharedStoreChoice().fields() == {"stores": (), "history": False}
    assert SharedStoreChoice(["docs"], True, True).fields() == {
        "stores": ("docs",),
        "history": False,
    }


@pytest.mark.parametrize(
    "store, no_store, no_history, expected",
    [
        (None, False, False, {"stores": None, "history": True}),
        (["docs"], False, True, {"stores": ("docs",), "history": False}),
        (None, True, False, {"stores": (), "history": True}),
    ],
)
def test_store_choice_fields(store, no_store, no_history, expected):
    assert StoreChoice(store, no_store, no_history).fields() == expected


def test_store_and_no_store_contradict():
    with pytest.raises(UsageError, match="--store and --no-store contradict"):
        StoreChoice(["docs"], True).fields()


def test_sampling_and_drafting_become_generation_params():
    params = SamplingChoice(temperature=0.5, top_k=7, seed=-1).params(
        DraftingChoice(drafter=DrafterMode.NGRAM, draft_max=4, no_trees=True),
        max_tokens=9,
        trace=True,
    )
    assert (params.temperature, params.top_k, params.seed) == (0.5, 7, None)
    assert (params.drafter, params.draft_max, params.trees) == (DrafterMode.NGRAM, 4, False)
    assert (params.max_tokens, params.trace) == (9, True)
    with pytest.raises(UsageError, match="invalid --top-p"):
        SamplingChoice(top_p=0).params(DraftingChoice())


@pytest.mark.parametrize(
    "command, args, needle",
    [
        ("calibrate", ["--threads", "0"], "invalid --threads"),
        ("calibrate", ["--rpc-split", "a,b"], "invalid --rpc-split"),
        ("doctor", ["--gpu-layers", "most"], "--gpu-layers"),
        ("doctor", ["--ctx", "8"], "invalid --ctx"),
        ("doctor", ["--ctx", "99999999999"], "invalid --ctx"),
        ("calibrate", ["--threads", "100000"], "invalid --threads"),
    ],
)
def test_a_bad_model_value_is_refused_before_anything_loads(command, args, needle):
    from localspec.cli.app import app

    result = CliRunner().invoke(app, [command, *args])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.output.startswith("error: ") and needle in result.output


def test_doctor_takes_no_rpc_or_exact_option():
    from localspec.cli.app import app

    for option in ("--rpc", "--exact"):
        result = CliRunner().invoke(app, ["doctor", option, "x"])
        assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.parametrize(
    "args, needle",
    [(["--ctx", "99999999999"], "invalid --ctx"), (["--threads", "100000"], "invalid --threads")],
)
def test_complete_refuses_a_context_or_threads_past_their_bounds(tiny_pair, tmp_path, args,
                                                                 needle):  # fmt: skip
    """Not a MemoryError reading the input a context that large would hold, nor llama.cpp
    crashing on more threads than it has room for: a sentence and exit code 2."""
    import os
    import subprocess
    import sys

    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "complete", "--target", str(target),
         "--draft", str(draft), "--max-tokens", "4", *args],
        input=b"the cat", capture_output=True, timeout=60,
        env={**os.environ, "LOCALSPEC_HOME": str(tmp_path)},
    )  # fmt: skip
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert needle in stderr and "internal error" not in stderr and "loading" not in stderr
