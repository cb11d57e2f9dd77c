"""Decode speed under a JSON schema: llama.cpp's ``llama-server`` beside ``localspec serve``.

Each prompt of a JSONL file (one ``{"id": ..., "prompt": "...", "json_schema": {...}}`` a
line) goes as one user message to ``/v1/chat/completions``, greedy (temperature 0), with
``--max-tokens`` and ``response_format: {"type": "json_schema", "json_schema": {"name": ...,
"schema": ..., "strict": true}}`` (both servers take that field), non-streamed and streamed,
``--repeat`` times, to one server per mode, started here one after another (never two at
once), each with the same target (and draft) GGUF, one slot, ``--threads`` and ``--ctx``:

- ``llama-none``, ``llama-ngram-simple``, ``llama-ngram-map-k``, ``llama-ngram-mod``:
  ``llama-server --jinja -np 1 --spec-type T`` (the n-gram modes at their defaults; none
  without ``--spec-type``); ``llama-draft-simple``: the same with ``-md DRAFT``;
- ``localspec-none``, ``-ngram``, ``-model``, ``-auto``: ``python -m localspec serve
  --parallel 1 --drafter D --no-prompt-cache`` with ``LOCALSPEC_HISTORY=0`` in a private
  home (the target's models and derived drafts linked, its calibration copied, nothing
  learned), so that every server starts as a fresh process does.

Before its measured requests each server answers one short request (``--no-warmup`` to
skip). Per request it records: the decode speed the server reports (``timings``:
``predicted_n / predicted_ms``, which both servers send, with ``draft_n`` and
``draft_n_accepted``); for a streamed one also the same figure measured here for both
alike, the completion tokens (``usage``) after the first over the time from the first
content chunk to the last; whether the answer parses as JSON and validates against its
schema (with ``jsonschema`` when it is importable, else a check of the subset
``type``/``properties``/``required``/``additionalProperties``/``items``/``enum``/``const``);
and whether its text equals ``llama-none``'s first non-streamed answer to the prompt (greedy
under the same grammar should mostly agree; a difference is reported, not an error).

A table per prompt and mode (medians over the repeats), then per mode the geometric mean
over the prompts of the server's figure (non-streamed) and of the measured one (streamed),
and the ratio of the former to ``llama-none``'s and ``localspec-none``'s; every record and
server command goes to ``--out`` as JSON, each server's log beside it. Nothing else should
run on the machine meanwhile. Run it with the project's virtual environment::

    python experiments/grammar_server.py --prompts extraction.jsonl --max-tokens 256 \\
        --modes llama-none,llama-ngram-mod,localspec-none,localspec-auto --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from localspec.models.paths import cache_root

LLAMA_SERVER = Path("/work/native/build/bin/llama-server")
RESULTS = Path("/work/results/grammar_server")
LLAMA_SPEC = {
    "llama-none": [],
    "llama-ngram-simple": ["--spec-type", "ngram-simple"],
    "llama-ngram-map-k": ["--spec-type", "ngram-map-k"],
    "llama-ngram-mod": ["--spec-type", "ngram-mod"],
    "llama-draft-simple": ["--spec-type", "draft-simple"],  # with -md DRAFT
}
LOCALSPEC_DRAFTER = {
    "localspec-none": "none",
    "localspec-ngram": "ngram",
    "localspec-model": "model",
    "localspec-auto": "auto",
}
MODES = [*LLAMA_SPEC, *LOCALSPEC_DRAFTER]
REFERENCES = ("llama-none", "localspec-none")
WARMUP_TOKENS = 8


# --- prompts -----------------------------------------------------------------------------


def load_prompts(path: Path) -> list[dict[str, Any]]:
    """The prompt file's lines, each checked: a bad one is an error naming its line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SystemExit(f"--prompts {path}: {err}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{where}: not JSON ({err})") from None
        if not isinstance(obj, dict):
            raise SystemExit(f"{where}: a line must be a JSON object")
        if not isinstance(obj.get("id"), (str, int)) or isinstance(obj.get("id"), bool):
            raise SystemExit(f"{where}: id must be text or a whole number")
        if not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise SystemExit(f"{where}: prompt must be non-empty text")
        if not isinstance(obj.get("json_schema"), dict):
            raise SystemExit(f"{where}: json_schema must be a JSON object (a schema)")
        prompts.append(
            {"id": str(obj["id"]), "prompt": obj["prompt"], "schema": obj["json_schema"]}
        )
    ids = [p["id"] for p in prompts]
    if not prompts:
        raise SystemExit(f"--prompts {path}: no prompt in it")
    if len(set(ids)) != len(ids):
        raise SystemExit(f"--prompts {path}: ids must differ")
    return prompts


def shared_grammar(prompt: dict[str, Any]) -> str:
    """The GBNF localspec makes of the prompt's schema; one it cannot make is an error."""
    from localspec.errors import UsageError
    from localspec.session.constraints import constraint

    try:
        text = constraint(json_schema=prompt["schema"])
    except UsageError as err:
        raise SystemExit(f"prompt {prompt['id']}: {err.message}") from None
    assert text is not None  # a schema was given
    return text


# --- schema validation -------------------------------------------------------------------

TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        whole = isinstance(value, int) and not isinstance(value, bool)
        return whole or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    kind = TYPES.get(name)
    return kind is not None and isinstance(value, kind)


def subset_errors(value: Any, schema: Any, at: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema``'s type, properties, required, additionalProperties
    (false), items, enum and const; other keywords are not checked."""
    if not isinstance(schema, dict):
        return []
    errors: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, n) for n in names):
            return [f"{at}: not of type {kinds}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{at}: not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{at}: not {schema['const']!r}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{at}: {k!r} missing" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in props:
                errors += subset_errors(item, props[key], f"{at}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{at}: {key!r} not allowed")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += subset_errors(item, schema["items"], f"{at}[{i}]")
    return errors


def validator() -> tuple[str, Any]:
    """(its name, a function of (value, schema) to a list of errors)."""
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:
        return "the script's own check of a subset of JSON Schema", subset_errors

    def check(value: Any, schema: Any) -> list[str]:
        found = jsonschema.Draft202012Validator(schema).iter_errors(value)
        return [f"{list(e.absolute_path)}: {e.message}" for e in found]

    return f"jsonschema {getattr(jsonschema, '__version__', '')}".strip(), check


def judge(text: str, schema: dict[str, Any], check: Any) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return {"json_ok": False, "schema_ok": False, "schema_errors": [f"not JSON: {err}"]}
    errors = check(value, schema)
    return {"json_ok": True, "schema_ok": not errors, "schema_errors": errors[:5]}


# --- requests ----------------------------------------------------------------------------


def body_of(prompt: dict[str, Any], max_tokens: int, stream: bool) -> dict[str, Any]:
    """The request: the schema as ``response_format``, or the prompt's ``gbnf`` (``--grammar
    shared``) as llama.cpp-server's ``grammar`` field, which both servers take."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt["prompt"]}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if "gbnf" in prompt:
        body["grammar"] = prompt["gbnf"]
    else:
        spec = {"name": "answer", "schema": prompt["schema"], "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def server_figures(record: dict[str, Any], usage: Any, timings: Any) -> None:
    if isinstance(usage, dict):
        record["completion_tokens"] = usage.get("completion_tokens")
    if isinstance(timings, dict):
        record["predicted_n"] = timings.get("predicted_n")
        record["predicted_ms"] = timings.get("predicted_ms")
        record["server_tok_s"] = timings.get("predicted_per_second")
        record["draft_n"] = timings.get("draft_n")
        record["draft_n_accepted"] = timings.get("draft_n_accepted")


def whole(client: httpx.Client, url: str, body: dict[str, Any], record: dict[str, Any]) -> None:
    resp = client.post(url, json=body)
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:500]}")
    answer = resp.json()
    choice = answer["choices"][0]
    record["text"] = choice["message"].get("content") or ""
    record["finish_reason"] = choice.get("finish_reason")
    server_figures(record, answer.get("usage"), answer.get("timings"))


def streamed(client: httpx.Client, url: str, body: dict[str, Any], record: dict[str, Any]) -> None:
    pieces: list[str] = []
    times: list[float] = []
    usage = timings = None
    with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(
                f"HTTP {resp.status_code}: {resp.read()[:500].decode(errors='replace')}"
            )
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error event: {event['error']}")
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    pieces.append(content)
                    times.append(time.monotonic())
                if choice.get("finish_reason"):
                    record["finish_reason"] = choice["finish_reason"]
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
    record["text"] = "".join(pieces)
    record["chunks"] = len(times)
    server_figures(record, usage, timings)
    tokens = record.get("completion_tokens")
    if isinstance(tokens, int) and tokens > 1 and len(times) >= 2 and times[-1] > times[0]:
        record["measured_tok_s"] = round((tokens - 1) / (times[-1] - times[0]), 3)


def ask(
    client: httpx.Client, port: int, prompt: dict[str, Any], max_tokens: int, stream: bool
) -> dict[str, Any]:
    """One request's record; a failure is its ``error``."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    record: dict[str, Any] = {"prompt": prompt["id"], "stream": stream, "error": None}
    started = time.monotonic()
    try:
        (streamed if stream else whole)(client, url, body_of(prompt, max_tokens, stream), record)
    except (httpx.HTTPError, RuntimeError, ValueError, KeyError, IndexError, TypeError) as err:
        record["error"] = f"{type(err).__name__}: {err}"
    record["wall_s"] = round(time.monotonic() - started, 3)
    return record


# --- servers -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def private_home(root: Path) -> Path:
    """A home with the source home's models and derived drafts linked and its calibration
    copied: nothing learned, no history, no prompt cache."""
    source, home = cache_root(), root / "home"
    home.mkdir()
    for name in ("models", "derived"):
        if (source / name).is_dir():
            (home / name).symlink_to(source / name)
    if (source / "calibration").is_dir():
        shutil.copytree(source / "calibration", home / "calibration")
    return home


def command(mode: str, port: int, args: argparse.Namespace) -> list[str]:
    common = ["--threads", str(args.threads), "--ctx", str(args.ctx), "--port", str(port)]
    if mode in LLAMA_SPEC:
        cmd = [str(args.server_bin), "-m", str(args.target), "--host", "127.0.0.1", "--jinja"]
        cmd += ["-np", "1", "-c", str(args.ctx), "-t", str(args.threads), "--port", str(port)]
        if mode == "llama-draft-simple":
            cmd += ["-md", str(args.draft)]
        return cmd + LLAMA_SPEC[mode]
    cmd = [sys.executable, "-m", "localspec", "serve", "--target", str(args.target)]
    cmd += ["--draft", str(args.draft), *common, "--parallel", "1"]
    return cmd + ["--drafter", LOCALSPEC_DRAFTER[mode], "--no-prompt-cache"]


def healthy(client: httpx.Client, port: int) -> bool:
    try:
        resp = client.get(f"http://127.0.0.1:{port}/health", timeout=5)
        return resp.status_code == 200 and resp.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its own session), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            return


@contextlib.contextmanager
def served(
    mode: str, args: argparse.Namespace, client: httpx.Client, log_path: Path, home: Path
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The port of the mode's server, started here and stopped on leaving (error or not)."""
    port = free_port()
    cmd = command(mode, port, args)
    env = None
    if mode in LOCALSPEC_DRAFTER:
        env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "0"}
    print(f"[{mode}] starting: {' '.join(cmd)}", file=sys.stderr)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            started = time.monotonic()
            while not healthy(client, port):
                if proc.poll() is not None or time.monotonic() - started > args.start_timeout:
                    why = (
                        f"exited with status {proc.returncode}"
                        if proc.poll() is not None
                        else f"was not healthy after {args.start_timeout:.0f} s"
                    )
                    tail = log_path.read_text(errors="replace").splitlines()[-15:]
                    raise SystemExit(
                        "\n".join(
                            [f"the server {why}: {' '.join(cmd)}", f"the end of {log_path}:", *tail]
                        )
                    )
                time.sleep(0.5)
            load = round(time.monotonic() - started, 1)
            print(f"[{mode}] healthy after {load} s", file=sys.stderr)
            yield port, {"cmd": cmd, "log": str(log_path), "load_s": load}
        finally:
            stop(proc)


def run_mode(
    mode: str,
    prompts: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    client: httpx.Client,
    result: dict[str, Any],
) -> None:
    """The mode's server, started, asked each prompt and stopped; its facts go to
    ``result["servers"]`` and each record to ``result["records"]`` as it comes (so that an
    interrupted run keeps what it measured)."""
    log_path = args.out.with_name(f"{args.out.stem}.{mode}.log")
    with tempfile.TemporaryDirectory(prefix="grammar-server-") as tmp:
        home = private_home(Path(tmp)) if mode in LOCALSPEC_DRAFTER else Path(tmp)
        with served(mode, args, client, log_path, home) as (port, facts):
            result["servers"][mode] = facts
            if args.warmup:
                warm = ask(client, port, prompts[0], WARMUP_TOKENS, False)
                facts["warmup_error"] = warm["error"]
            for repeat in range(args.repeat):
                for prompt in prompts:
                    for stream in args.streams:
                        record = ask(client, port, prompt, args.max_tokens, stream)
                        record.update(mode=mode, repeat=repeat)
                        result["records"].append(record)
                        print(f"[{mode}] {prompt['id']} {describe(record)}", file=sys.stderr)


def describe(record: dict[str, Any]) -> str:
    kind = "stream" if record["stream"] else "whole"
    if record["error"]:
        return f"{kind}: {record['error']}"
    return f"{kind}: {record.get('completion_tokens')} tokens, {record.get('server_tok_s')} tok/s"


# --- summary -----------------------------------------------------------------------------


def geomean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v]
    return math.exp(statistics.fmean(math.log(v) for v in kept)) if kept else None


def median(values: Sequence[Any]) -> float | None:
    kept = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(kept) if kept else None


def mark(records: list[dict[str, Any]], prompts: Sequence[dict[str, Any]], check: Any) -> None:
    """Each record's JSON and schema checks and its agreement with each reference mode's
    first non-streamed answer (``same_as_llama_none``, ``same_as_localspec_none``)."""
    schemas = {p["id"]: p["schema"] for p in prompts}
    answers: dict[tuple[str, str], str] = {}
    for r in records:
        if r["mode"] in REFERENCES and not r["stream"] and not r["error"]:
            answers.setdefault((r["mode"], r["prompt"]), r["text"])
    for r in records:
        if r["error"]:
            continue
        r.update(judge(r["text"], schemas[r["prompt"]], check))
        for ref in REFERENCES:
            answer = answers.get((ref, r["prompt"]))
            r[same_key(ref)] = None if answer is None else r["text"] == answer


def same_key(ref: str) -> str:
    return "same_as_" + ref.replace("-", "_")


def agreeing(records: Sequence[dict[str, Any]], ref: str) -> str:
    """How many of the records have the reference's text, of those it can be compared with."""
    same = [r[same_key(ref)] for r in records if r.get(same_key(ref)) is not None]
    return f"{sum(same)}/{len(same)}" if same else "-"


def cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def per_prompt(records: list[dict[str, Any]], modes: Sequence[str]) -> tuple[str, dict]:
    rows = [
        "| prompt | mode | tokens | tok/s (server) | tok/s (server, stream) | tok/s (measured, "
        "stream) | drafted/accepted | JSON | schema | same as llama-none | same as localspec-none "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for prompt in dict.fromkeys(r["prompt"] for r in records):
        for mode in modes:
            mine = [r for r in records if r["mode"] == mode and r["prompt"] == prompt]
            if not mine:
                continue
            ok = [r for r in mine if not r["error"]]
            whole_runs = [r for r in ok if not r["stream"]]
            streams = [r for r in ok if r["stream"]]
            c = {
                "tokens": median([r.get("completion_tokens") for r in ok]),
                "server": median([r.get("server_tok_s") for r in whole_runs]),
                "server_stream": median([r.get("server_tok_s") for r in streams]),
                "measured": median([r.get("measured_tok_s") for r in streams]),
                "drafted": median([r.get("draft_n") for r in ok]),
                "accepted": median([r.get("draft_n_accepted") for r in ok]),
            }
            cells[(prompt, mode)] = c
            rows.append(
                f"| {prompt} | {mode} | {cell(c['tokens'], 0)} | {cell(c['server'])} "
                f"| {cell(c['server_stream'])} | {cell(c['measured'])} "
                f"| {cell(c['drafted'], 0)}/{cell(c['accepted'], 0)} "
                f"| {sum(r['json_ok'] for r in ok)}/{len(mine)} "
                f"| {sum(r['schema_ok'] for r in ok)}/{len(mine)} "
                f"| {agreeing(ok, 'llama-none')} | {agreeing(ok, 'localspec-none')} "
                f"| {len(mine) - len(ok)} |"
            )
    return "\n".join(rows), cells


def summarize(
    records: list[dict[str, Any]], modes: Sequence[str], cells: dict
) -> tuple[str, dict[str, Any]]:
    prompts = list(dict.fromkeys(r["prompt"] for r in records))
    summary: dict[str, Any] = {}
    for mode in modes:
        mine = [r for r in records if r["mode"] == mode]
        if not mine:
            continue
        ok = [r for r in mine if not r["error"]]
        summary[mode] = {
            "server_tok_s": geomean([cells.get((p, mode), {}).get("server") for p in prompts]),
            "measured_tok_s": geomean([cells.get((p, mode), {}).get("measured") for p in prompts]),
            "requests": len(mine),
            "errors": len(mine) - len(ok),
            "schema_ok": sum(r["schema_ok"] for r in ok),
            **{same_key(ref): agreeing(ok, ref) for ref in REFERENCES},
        }
    for s in summary.values():
        for ref in REFERENCES:
            base = summary.get(ref, {}).get("server_tok_s")
            s[f"vs_{ref}"] = s["server_tok_s"] / base if s["server_tok_s"] and base else None
    rows = [
        "| mode | tok/s (server, geomean) | vs llama-none | vs localspec-none "
        "| tok/s (measured, stream, geomean) | schema ok | same as llama-none "
        "| same as localspec-none | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summary.items():
        rows.append(
            f"| {mode} | {cell(s['server_tok_s'])} | {cell(s['vs_llama-none'], 2)} "
            f"| {cell(s['vs_localspec-none'], 2)} | {cell(s['measured_tok_s'])} "
            f"| {s['schema_ok']}/{s['requests']} | {s['same_as_llama_none']} "
            f"| {s['same_as_localspec_none']} | {s['errors']} |"
        )
    return "\n".join(rows), summary


# --- command line ------------------------------------------------------------------------


def mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(MODES)}")
    return modes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    models = cache_root() / "models"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, required=True, help="JSONL: id, prompt, json_schema")
    ap.add_argument("--target", type=Path, default=models / "qwen2.5-coder-1.5b.gguf")
    ap.add_argument("--draft", type=Path, default=models / "qwen2.5-coder-0.5b.gguf")
    ap.add_argument("--server-bin", type=Path, default=LLAMA_SERVER, help="llama-server")
    ap.add_argument("--modes", type=mode_list, default=MODES, help=",".join(MODES))
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=1, help="each prompt this many times")
    ap.add_argument(
        "--stream", choices=("both", "off", "only"), default="both", help="streamed requests"
    )
    ap.add_argument(
        "--grammar",
        choices=("own", "shared"),
        default="own",
        help="own: the schema as response_format, each server converting it (llama.cpp's "
        "converter lets JSON span lines, llama-cpp-python's, which localspec uses, does not); "
        "shared: both get llama-cpp-python's GBNF of it as the grammar field",
    )
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--out", type=Path, help=f"the JSON (default: a name in {RESULTS})")
    args = ap.parse_args(argv)
    for name in ("max_tokens", "threads", "ctx", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    needed = [("--target", args.target)]
    if any(m in LOCALSPEC_DRAFTER or m == "llama-draft-simple" for m in args.modes):
        needed.append(("--draft", args.draft))
    if any(m in LLAMA_SPEC for m in args.modes):
        needed.append(("--server-bin", args.server_bin))
    for option, path in needed:
        if not path.is_file():
            ap.error(f"{option} {path}: no such file")
    args.streams = {"both": (False, True), "off": (False,), "only": (True,)}[args.stream]
    args.out = args.out or RESULTS / f"grammar-server-{time.strftime('%Y%m%d-%H%M%S')}.json"
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM unwind through ``served``, which stops the server
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = load_prompts(args.prompts)
    if args.grammar == "shared":
        for prompt in prompts:
            prompt["gbnf"] = shared_grammar(prompt)
    name, check = validator()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "validator": name,
        "servers": {},
        "records": [],
    }
    records: list[dict[str, Any]] = result["records"]
    try:
        with httpx.Client(timeout=args.timeout) as client:
            for mode in args.modes:
                run_mode(mode, prompts, args, client, result)
    finally:  # what was measured is kept, also when a server failed
        mark(records, prompts, check)
        table, cells = per_prompt(records, args.modes)
        totals, summary = summarize(records, args.modes, cells)
        result["summary"] = summary
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        if records:
            print(table + "\n\n" + totals + f"\n\nschemas checked with {name}\n{args.out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; the server was stopped")
