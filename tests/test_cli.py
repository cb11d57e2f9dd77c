"""`localspec complete` end to end on tiny GGUF models written by the tests.

Runs the real command in a subprocess: exit codes, stdout carrying only the text, JSON
shape, and one-line errors (never a traceback) for bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tiny_gguf import write_tiny_llama


def localspec(*args, stdin: bytes | None = b"hello world", env_home=None):
    env = dict(os.environ)
    if env_home is not None:
        env["LOCALSPEC_HOME"] = str(env_home)
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
    )


def pair_args(tiny_pair):
    target, draft, _ = tiny_pair
    return ["--target", str(target), "--draft", str(draft), "--ctx", "256"]


def assert_clean_error(proc, *needles):
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "Traceback" not in err
    # Progress lines (e.g. the one-time machine measurement) may come first; the failure
    # itself is one "error:" line, followed at most by a "hint:" line.
    lines = err.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1 and all(x.startswith("hint: ") for x in lines[errors[0] + 1 :])
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "auto"])
def test_json_output_and_identical_greedy_tokens(tiny_pair, drafter):
    proc = localspec(
        "complete",
        "--raw",
        "--json",
        "--max-tokens",
        "24",
        "--drafter",
        drafter,
        *pair_args(tiny_pair),
        stdin=b"the cat and the dog and the cat",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    record = json.loads(proc.stdout)
    assert set(record) >= {"text", "token_ids", "finish_reason", "stats"}
    for key in (
        "prompt_tokens",
        "generated_tokens",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "rounds",
        "prefill_s",
        "decode_s",
        "decode_tokens_per_s",
        "by_drafter",
    ):
        assert key in record["stats"]
    assert record["finish_reason"] in ("eos", "length")
    baseline = localspec(
        "complete",
        "--raw",
        "--json",
        "--max-tokens",
        "24",
        "--drafter",
        "none",
        *pair_args(tiny_pair),
        stdin=b"the cat and the dog and the cat",
    )
    assert record["token_ids"] == json.loads(baseline.stdout)["token_ids"]


def test_stdout_is_only_the_text_and_stats_go_to_stderr(tiny_pair, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):")
    plain = localspec(
        "complete", str(prompt), "--max-tokens", "12", "--stats", *pair_args(tiny_pair), stdin=None
    )
    assert plain.returncode == 0, plain.stderr.decode()
    js = localspec(
        "complete", str(prompt), "--max-tokens", "12", "--json", *pair_args(tiny_pair), stdin=None
    )
    assert plain.stdout.decode() == json.loads(js.stdout)["text"]
    assert "tokens per pass" in plain.stderr.decode()


def test_empty_input(tiny_pair):
    assert_clean_error(localspec("complete", *pair_args(tiny_pair), stdin=b"  \n"), "empty")


def test_non_utf8_input(tiny_pair):
    proc = localspec("complete", *pair_args(tiny_pair), stdin=b"caf\xe9 au lait")
    assert_clean_error(proc, "not UTF-8", "0xe9")


def test_missing_model_file(tmp_path):
    proc = localspec("complete", "--target", str(tmp_path / "nope.gguf"), "--drafter", "none")
    assert_clean_error(proc, "not found")


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    assert_clean_error(
        localspec("complete", "--target", str(bogus), "--drafter", "none"), "not a GGUF file"
    )


def test_truncated_gguf_file(tiny_pair, tmp_path):
    data = tiny_pair[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert_clean_error(
        localspec("complete", "--target", str(cut), "--drafter", "none"), "could not load"
    )


def test_incompatible_pair_names_the_first_differing_token(tiny_pair):
    target, _, alien = tiny_pair
    proc = localspec("complete", "--target", str(target), "--draft", str(alien))
    assert_clean_error(proc, "cannot draft for", "token")
    assert "hint:" in proc.stderr.decode()


def test_prompt_longer_than_context(tiny_pair):
    # llama.cpp rounds small contexts up to 256 tokens; the message gives the real size.
    proc = localspec("complete", "--raw", *pair_args(tiny_pair), stdin=b"the cat and the dog " * 40)
    assert_clean_error(proc, "the prompt has", "context holds 256", "--ctx")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top-p"),
        (["--max-tokens", "0"], "max-tokens"),
        (["--threads", "0"], "threads"),
    ],
)
def test_invalid_option_values(tiny_pair, args, needle):
    assert_clean_error(localspec("complete", *args, *pair_args(tiny_pair)), needle)


def test_tiny_models_are_loadable(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", seed=3)
    assert path.read_bytes()[:4] == b"GGUF"


def test_ctrl_c_stops_cleanly_and_still_prints_stats(tiny_pair, tmp_path):
    import re
    import signal

    target, _, _ = tiny_pair
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the cat and the dog")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localspec.cli.app",
            "complete",
            str(prompt),
            "--raw",
            "--stats",
            "--drafter",
            "none",
            "--max-tokens",
            "1900",
            "--ctx",
            "2048",
            "--target",
            str(target),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.read(1)  # generation has started
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = err.decode()
    assert "Traceback" not in err
    assert proc.returncode == 130, err
    assert "finish: cancelled" in err and "tokens per pass" in err
    generated = re.search(r"generated (\d+) tokens", err)
    assert generated and int(generated[1]) < 1900, err  # stopped, not written to its end


# -- chat: saved conversations (no model is loaded: the app itself is replaced) ------------


def chat_cli(monkeypatch, *args):
    """Run ``localspec chat ARGS`` in process; returns (result, the run_chat call or None)."""
    from typer.testing import CliRunner

    import localspec.tui
    from localspec.cli.app import app

    calls = []

    def run_chat(factory, params, system_prompt=None, **kw):
        calls.append({"params": params, "system": system_prompt, **kw})
        return 0

    monkeypatch.setattr(localspec.tui, "run_chat", run_chat)
    result = CliRunner().invoke(app, ["chat", *args])
    return result, (calls[0] if calls else None)


def write_saved(path, first_user="What is 2 + 2?", turns=1, updated="2025-01-02T03:04:05",
                **settings):  # fmt: skip
    messages = []
    for i in range(turns):
        messages += [
            {"role": "user", "content": first_user if i == 0 else f"more {i}"},
            {"role": "assistant", "content": f"answer {i}", "finish": "eos"},
        ]
    data = {
        "format": "localspec-chat",
        "version": 1,
        "created": "2025-01-02T03:04:05",
        "updated": updated,
        "system": "Be brief.",
        "settings": {"temperature": 0.7, "seed": 3, "top_k": 10, "max_tokens": 99, **settings},
        "messages": messages,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "content, needle",
    [
        (b'{"format": "localspec-chat", "version": 1,', "not JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"# a Markdown transcript\n", "not JSON"),
        (b'{"format": "localspec-chat", "version": 7}', "format version 7"),
        (b'{"format": "something-else", "version": 1}', "not a localspec conversation"),
        (
            b'{"format": "localspec-chat", "version": 1, "created": "2025-01-02T03:04:05",'
            b' "updated": "2025-01-02T03:04:05", "messages": [{"role": "wizard", "content": ""}]}',
            "damaged",
        ),  # fmt: skip
        (None, "no such file"),
    ],
)
def test_chat_resume_refuses_a_bad_file_in_one_line(monkeypatch, tmp_path, content, needle):
    path = tmp_path / "conversation.json"
    if content is not None:
        path.write_bytes(content)
    result, call = chat_cli(monkeypatch, "--resume", str(path))
    assert call is None  # refused before any model is loaded
    assert result.exit_code == 2
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"error: cannot resume {path}: ") and needle in lines[0]
    assert lines[1:] == ["hint: localspec chat --recent lists the saved conversations"]


def test_chat_recent_lists_newest_first_and_skips_damaged_files(monkeypatch, isolated_home):
    folder = isolated_home / "conversations"
    result, _ = chat_cli(monkeypatch, "--recent")
    assert result.exit_code == 0 and result.output == f"no saved conversations in {folder}\n"
    old = write_saved(
        folder / "chat-1.json", "old question", turns=1, updated="2025-01-01T10:00:00"
    )
    long_line = "Explain, at length, " + "why " * 30 + "\nsecond line"
    new = write_saved(folder / "chat-2.json", long_line, turns=3, updated="2025-01-03T11:30:00")
    (folder / "chat-3.json").write_text("{ damaged")
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    os.utime(folder / "chat-3.json", (3_000_000, 3_000_000))
    result, call = chat_cli(monkeypatch, "--recent")
    assert result.exit_code == 0 and call is None
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:5] == ["1", "2025-01-03", "11:30", "3", "turns"]
    assert "Explain, at length, why why" in lines[0] and "…" in lines[0]
    assert "second line" not in lines[0] and lines[0].endswith(str(new))
    assert lines[1].split()[:5] == ["2", "2025-01-01", "10:00", "1", "turn"]
    assert "old question" in lines[1] and lines[1].endswith(str(old))


def test_chat_resume_last_takes_the_file_settings_unless_given(monkeypatch, isolated_home):
    folder = isolated_home / "conversations"
    result, _ = chat_cli(monkeypatch, "--resume", "last")
    assert result.exit_code == 2 and "no saved conversation" in result.output
    older = write_saved(folder / "a.json", "older")
    newer = write_saved(folder / "b.json", "newer", turns=2)
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))

    result, call = chat_cli(monkeypatch, "--resume", "last")
    assert result.exit_code == 0, result.output
    assert call["resume_path"] == newer and call["autosave"] is True
    assert call["resume"].messages[0].content == "newer"
    p = call["params"]
    assert (p.temperature, p.seed, p.top_k, p.max_tokens) == (0.7, 3, 10, 99)
    assert call["system"] == "Be brief."

    result, call = chat_cli(
        monkeypatch, "--resume", "2", "--temperature", "0.2", "--system", "Be long.", "--no-save"
    )
    assert result.exit_code == 0, result.output
    assert call["resume_path"] == older and call["autosave"] is False
    assert (call["params"].temperature, call["params"].seed) == (0.2, 3)
    assert call["system"] == "Be long."

    result, call = chat_cli(monkeypatch, "--no-save")
    assert result.exit_code == 0 and call["autosave"] is False and call["resume"] is None


@pytest.mark.parametrize("command", ["complete", "chat", "serve"])
def test_an_unknown_drafter_is_refused_with_the_modes_before_anything_runs(command):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    result = CliRunner().invoke(app, [command, "--drafter", "magic"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    for mode in ("'magic'", "auto", "model", "ngram", "self", "lookahead", "none"):
        assert mode in result.output


@pytest.mark.parametrize(
    "mode, use_draft, calibrate",
    [
        ("auto", True, True),
        ("model", True, False),
        ("ngram", False, False),
        ("none", False, False),
        ("self", True, False),
        ("lookahead", False, True),
    ],  # fmt: skip
)
def test_the_drafter_decides_what_is_loaded_and_measured(mode, use_draft, calibrate):
    from localspec.core.params import DrafterMode
    from localspec.options.generation import DraftingChoice, SamplingChoice
    from localspec.options.model import ModelChoice

    params = SamplingChoice().params(DraftingChoice(drafter=DrafterMode(mode)))
    options = ModelChoice().options(params.drafter)
    assert params.drafter == mode
    assert (options.use_draft, options.calibrate) == (use_draft, calibrate)
    assert (options.draft == "self") == (mode == "self")  # self drafts with a derived draft


def test_drafter_self_with_another_draft_is_a_usage_error():
    from localspec.core.params import DrafterMode
    from localspec.errors import UsageError
    from localspec.options.model import ModelChoice

    with pytest.raises(UsageError, match="--drafter self drafts with the target's own layers"):
        ModelChoice(draft="other.gguf").options(DrafterMode.SELF)
    assert ModelChoice(draft="self").options(DrafterMode.SELF).draft == "self"


def test_chat_resume_takes_the_file_s_drafter_unless_given(monkeypatch, isolated_home):
    saved = write_saved(isolated_home / "conversations" / "a.json", drafter="ngram")
    result, call = chat_cli(monkeypatch, "--resume", str(saved))
    assert result.exit_code == 0, result.output
    assert call["params"].drafter == "ngram"
    result, call = chat_cli(monkeypatch, "--resume", str(saved), "--drafter", "none")
    assert result.exit_code == 0, result.output
    assert call["params"].drafter == "none" and call["params"].max_tokens == 99
