"""Edge cases of ``localspec complete``: a random seed, Ctrl-C twice with --json, a session
that fails mid-answer, and input too large for any context."""

from __future__ import annotations

import json

import pytest

from localspec.cli import complete as complete_cli
from localspec.core.events import TARGET, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.errors import BackendError, InputError
from localspec.session import open as open_module
from tests.test_cli import assert_clean_error, localspec, pair_args


class StubSession:
    """Emits two tokens, then does what ``then`` says: a second Ctrl-C or an error."""

    def __init__(self, then: BaseException) -> None:
        self.then = then
        self.closed = False
        self.placement = None  # where the models run: nothing loaded here
        self.slot = None  # no draft model
        self.verification = "host"

    def complete(self, prompt, params, **kwargs):
        yield TokenEmitted(7, "ab", TARGET, 0)
        yield TokenEmitted(9, "cd", TARGET, 1)
        raise self.then

    def close(self, *, free: bool = True) -> None:
        self.closed = True


@pytest.fixture
def stub(monkeypatch):
    made: list[StubSession] = []

    def open_with(then):
        def open_session(options, on_progress=None, on_lost=None):
            made.append(StubSession(then))
            return made[-1]

        monkeypatch.setattr(open_module, "open_session", open_session)
        return made

    return open_with


class Options:
    exact = False


def test_a_second_ctrl_c_with_json_reports_the_text_so_far(stub, capsys):
    made = stub(KeyboardInterrupt())
    code = complete_cli.run_complete(
        "hi", GenerationParams(), Options(), raw=False, json_out=True, stats=False
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 130 and record["finish_reason"] == "cancelled"
    assert record["text"] == "abcd" and record["token_ids"] == [7, 9]
    assert record["stats"]["generated_tokens"] == 2
    assert made[0].closed


def test_the_session_is_closed_when_generation_fails(stub):
    made = stub(BackendError("decode failed"))
    with pytest.raises(BackendError):
        complete_cli.run_complete(
            "hi", GenerationParams(), Options(), raw=False, json_out=False, stats=False
        )
    assert made[0].closed


def test_seed_minus_one_draws_a_seed(tiny_pair):
    proc = localspec(
        "complete", *pair_args(tiny_pair), "--seed", "-1", "--temperature", "0.8",
        "--max-tokens", "4", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["stats"]["generated_tokens"] >= 1


def test_seed_below_minus_one_is_refused_before_loading(tiny_pair):
    proc = localspec("complete", *pair_args(tiny_pair), "--seed", "-2")
    assert proc.returncode == 2
    assert_clean_error(proc, "seed")


def test_input_larger_than_any_context_is_refused_before_it_is_read_whole(tiny_pair):
    # --ctx 256: the limit is the 1 MiB floor; 3 MiB of input never reaches the tokenizer.
    proc = localspec("complete", *pair_args(tiny_pair), stdin=b"word " * (600 << 10))
    assert proc.returncode == 2
    assert_clean_error(proc, "larger than 1,048,576 bytes", "--ctx")


def test_the_limit_reads_no_more_than_it_needs(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 5000)
    with pytest.raises(InputError, match="larger than 4,096 bytes"):
        complete_cli.read_prompt(str(big), 4096)
    assert complete_cli.read_prompt(str(big), 5000) == "x" * 5000
    assert complete_cli.input_limit(1 << 20) == 16 << 20


def test_system_prompt_from_text_or_file(tiny_pair, tmp_path):
    plain = json.loads(localspec("complete", *pair_args(tiny_pair), "--max-tokens", "2",
                                 "--json").stdout)  # fmt: skip
    with_text = localspec(
        "complete", *pair_args(tiny_pair), "--max-tokens", "2", "--json",
        "--system", "be brief",
    )  # fmt: skip
    assert with_text.returncode == 0, with_text.stderr.decode()
    grown = json.loads(with_text.stdout)["stats"]["prompt_tokens"]
    assert grown > plain["stats"]["prompt_tokens"]
    (tmp_path / "sys.txt").write_text("be brief")
    from_file = localspec(
        "complete", *pair_args(tiny_pair), "--max-tokens", "2", "--json",
        "--system", f"@{tmp_path / 'sys.txt'}",
    )  # fmt: skip
    assert json.loads(from_file.stdout)["stats"]["prompt_tokens"] == grown


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--system", "@/nonexistent/sys.txt"], "system prompt file not found"),
        (["--system", "be brief", "--raw"], "needs the chat template"),
    ],
)
def test_system_prompt_errors_are_clear(tiny_pair, extra, needle):
    proc = localspec("complete", *pair_args(tiny_pair), *extra)
    assert proc.returncode == 2
    assert_clean_error(proc, needle)


def test_loading_shows_only_warnings_and_waits_each_as_a_line(capsys):
    from localspec.progress import Progress, ProgressKind

    for kind, text in [
        (ProgressKind.STEP, "loading target t.gguf"),
        (ProgressKind.WAIT, "measuring this machine's step costs (once per model pair)"),
        (ProgressKind.WARNING, "only 2.0 GiB of memory is available"),
        (ProgressKind.DOWNLOAD, "downloading t"),
    ]:
        complete_cli.print_warnings(Progress(kind, text))
    assert capsys.readouterr().err.splitlines() == [
        "measuring this machine's step costs (once per model pair)",
        "warning: only 2.0 GiB of memory is available",
    ]


def test_a_prediction_is_drafted_from_and_changes_nothing_in_the_answer(tiny_pair, tmp_path):
    args = ("complete", *pair_args(tiny_pair), "--max-tokens", "60", "--json", "--raw")
    prompt = b"the cat sat on the mat and the dog sat on the log"
    plain = json.loads(localspec(*args, stdin=prompt).stdout)
    (tmp_path / "old.txt").write_text(plain["text"], encoding="utf-8")
    proc = localspec(*args, "--prediction", str(tmp_path / "old.txt"), stdin=prompt)
    assert proc.returncode == 0, proc.stderr.decode()
    predicted = json.loads(proc.stdout)
    assert predicted["token_ids"] == plain["token_ids"]  # greedy: the target's own
    # The whole answer was predicted (bar the joins of text tokenized apart); whether it
    # was drafted from depends on this machine's costs and timings, which the bench shows.
    used = predicted["prediction"]
    assert used["accepted_prediction_tokens"] >= len(plain["token_ids"]) - 2
    assert (
        used["accepted_prediction_tokens"] + used["rejected_prediction_tokens"] == (used["tokens"])
    )
    assert "prediction" not in plain
    # What the answer made of it: the tokens it copied, and those of them drafted.
    origins = predicted["stats"]["tokens_by_origin"]
    assert used["used_tokens"] >= len(plain["token_ids"]) - 8
    assert used["drafted_tokens"] <= sum(n for o, n in origins.items() if o != "target")
    assert used["drafted_by_prediction"] <= origins.get("prediction", 0)
    stats = localspec(*args[:-2], "--raw", "--stats", "--prediction", str(tmp_path / "old.txt"),
                      stdin=prompt)  # fmt: skip
    assert stats.returncode == 0, stats.stderr.decode()
    line = f"prediction: {used['tokens']} tokens; the answer copied {used['used_tokens']} of them"
    assert line in stats.stderr.decode()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "prediction file not found"),
        ("  \n", "prediction file"),
        (b"\xff\xfe", "UTF-8"),
        ("text", "drafted from by --drafter auto"),
    ],
)
def test_prediction_file_errors_are_clear(tiny_pair, tmp_path, content, needle):
    path = tmp_path / "prediction.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    mode = ["--drafter", "ngram"] if content == "text" else []
    proc = localspec(
        "complete", *pair_args(tiny_pair), "--prediction", str(path), *mode, stdin=b"hi"
    )
    assert proc.returncode == 2
    assert_clean_error(proc, needle)
