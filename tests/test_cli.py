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
        (["--drafter", "magic"], "drafter"),
        (["--threads", "0"], "threads"),
    ],
)
def test_invalid_option_values(tiny_pair, args, needle):
    assert_clean_error(localspec("complete", *args, *pair_args(tiny_pair)), needle)


def test_tiny_models_are_loadable(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", seed=3)
    assert path.read_bytes()[:4] == b"GGUF"


def test_ctrl_c_stops_cleanly_and_still_prints_stats(tiny_pair, tmp_path):
    import signal
    import time

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
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    err = err.decode()
    assert "Traceback" not in err
    assert proc.returncode == 130, err
    assert "finish: cancelled" in err and "tokens per pass" in err
