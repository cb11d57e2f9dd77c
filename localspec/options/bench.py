"""The bench's own options, declared once: ``localspec bench`` takes them as a group.

``BenchChoice`` holds each option as given (the modes, the categories and the native flags as
typed, unparsed: ``bench/run.py`` checks them before anything loads); the command takes the
pair's options beside it (``ModelChoice``). The bench's runner takes the settings of its
protocol from it by name (``bench.runner.BenchConfig.of``), so an option is spelled here
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from localspec.options.generation import Temperature
from localspec.options.model import Option


@dataclass(frozen=True)
class BenchChoice:
    """The options of ``localspec bench`` beside the pair's, in the order ``--help`` lists
    them."""

    categories: Annotated[
        str | None,
        Option(
            help="comma-separated categories (default: all but repo_code, apply, the "
            "constrained sets and the check sets, which are run when named: apply edits "
            "whole files, with the file as the prediction; extraction, tool_calls and "
            "schema_prose answer under a JSON schema or a tool call's grammar; check3, "
            "check4, check3_unrelated and history_followup are prompts the bench was not "
            "tuned on)"
        ),
    ] = None
    limit: Annotated[int | None, Option(help="prompts per category at most")] = None
    prompts: Annotated[
        Path | None,
        Option(
            help="your own prompts instead of the shipped sets: JSONL, one object a line with "
            '"prompt" (and optional "id", "category", "source", "prediction" for mode '
            'auto-prediction, "first" for mode auto-again, and "json_schema" or "tools" '
            "(OpenAI's) for an answer every mode writes under that grammar)"
        ),
    ] = None
    modes: Annotated[
        str,
        Option(
            help="comma-separated: none, ngram, model, auto, auto-store, auto-chains (auto "
            "without draft trees), auto-prediction (auto with the prompt's prediction, else "
            "its first code block), native-draft, native-ngram (ngram-simple), "
            "native-ngram-map-k, native-ngram-mod, native-none (llama.cpp's plain decoding), "
            "native-bench (llama-bench at the prompt's depth)"
        ),
    ] = "none,ngram,model,auto"
    store: Annotated[
        list[str] | None,
        Option(
            "--store",
            metavar="NAME",
            help="a datastore for mode auto-store (repeatable; adds that mode); the other "
            "modes draft from none",
        ),
    ] = None
    max_tokens: Annotated[int, Option(help="new tokens per run at most")] = 200
    temperature: Temperature = 0.0
    seed: Annotated[int | None, Option(help="sampling seed (prompt i uses seed+i)")] = None
    raw: Annotated[bool, Option(help="send prompts without the chat template")] = False
    cold: Annotated[
        bool,
        Option(
            "--cold/--warm",
            help="cold: every run starts with nothing learned, as a fresh process; warm: "
            "the controllers keep learning from prompt to prompt",
        ),
    ] = True
    fresh: Annotated[
        bool,
        Option(
            help="run each engine mode as a fresh localspec complete process, timed from its "
            "start to its exit as a user waits for it (llama.cpp's modes always are)"
        ),
    ] = False
    rpc_delay: Annotated[
        float | None,
        Option(
            metavar="MS",
            help="reach the --rpc workers through a relay on 127.0.0.1 that adds MS "
            "milliseconds to every round trip, as a slower network would",
        ),
    ] = None
    trace: Annotated[
        bool,
        Option(help="keep every round (drafter, draft, accepted, timings) in records.jsonl"),
    ] = False
    native_bin: Annotated[
        Path | None,
        Option(
            help="llama-speculative-simple to compare with; native-bench runs the llama-bench "
            "beside it (adds all native modes unless --modes names some)"
        ),
    ] = None
    native_flags: Annotated[
        str,
        Option(
            help="extra flags for llama-speculative-simple (not llama-bench), e.g. "
            "'--spec-draft-n-max 8'"
        ),
    ] = ""
    repeat: Annotated[
        int,
        Option(
            help="runs of every prompt and mode, interleaved; the summary takes each one's "
            "median run (as llama-bench's -r)"
        ),
    ] = 1
    out: Annotated[
        Path | None, Option(help="output folder (default: ./bench-results/<timestamp>)")
    ] = None
    chart: Annotated[bool, Option(help="draw speedup.png (needs matplotlib)")] = True
    warmup: Annotated[bool, Option(help="one short unrecorded run per mode first")] = True
    ceiling: Annotated[
        bool,
        Option(
            help="measure the target's ceiling first (its best batch throughput, overall and "
            "at each category's depth); --no-ceiling when only the answers matter"
        ),
    ] = True
