"""The grammar side-by-side (experiments/grammar_server.py) without a model: its prompt file
checks, its schema check, the records it reads from a server's answers (whole and streamed,
from a canned server), and its summary's ratios and agreement counts."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.scripts import EXPERIMENTS, load_script

SCRIPT = EXPERIMENTS / "grammar_server.py"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ANSWER = '{"name": "Ann", "age": 3}'


@pytest.fixture(scope="module")
def gs():
    return load_script(SCRIPT, "grammar_server")


def test_the_subset_check_finds_each_kind_of_break(gs):
    assert gs.subset_errors({"name": "x", "age": 1, "tags": ["a"]}, SCHEMA) == []
    assert gs.subset_errors({"name": "x", "age": 1.0}, SCHEMA) == []  # 1.0 is an integer
    assert gs.subset_errors({"name": "x", "age": "1"}, SCHEMA) == ["$.age: not of type integer"]
    assert gs.subset_errors({"name": "x", "age": True}, SCHEMA) == ["$.age: not of type integer"]
    assert gs.subset_errors({"name": "x"}, SCHEMA) == ["$: 'age' missing"]
    assert gs.subset_errors({"name": "x", "age": 1, "more": 2}, SCHEMA) == ["$: 'more' not allowed"]
    assert gs.subset_errors({"name": "x", "age": 1, "tags": ["a", "c"]}, SCHEMA) == [
        "$.tags[1]: not one of ['a', 'b']"
    ]
    assert gs.subset_errors([], SCHEMA) == ["$: not of type object"]


def test_judge_tells_text_that_is_not_json_from_json_off_the_schema(gs):
    check = gs.subset_errors
    assert gs.judge(ANSWER, SCHEMA, check) == {
        "json_ok": True,
        "schema_ok": True,
        "schema_errors": [],
    }
    off = gs.judge('{"name": "Ann"}', SCHEMA, check)
    assert off["json_ok"] and not off["schema_ok"]
    cut = gs.judge('{"name": "An', SCHEMA, check)
    assert not cut["json_ok"] and cut["schema_errors"][0].startswith("not JSON")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("not json", "p.jsonl:2: not JSON"),
        ('{"id": 1, "prompt": "x"}', "p.jsonl:2: json_schema must be"),
        ('{"id": 1, "prompt": " ", "json_schema": {}}', "p.jsonl:2: prompt must be"),
        ('{"id": true, "prompt": "x", "json_schema": {}}', "p.jsonl:2: id must be"),
        ('{"id": 0, "prompt": "y", "json_schema": {}}', "ids must differ"),
    ],
)
def test_a_bad_prompt_line_is_an_error_naming_it(gs, tmp_path, line, said):
    path = tmp_path / "p.jsonl"
    first = json.dumps({"id": 0, "prompt": "x", "json_schema": SCHEMA})
    path.write_text(first + "\n" + line + "\n")
    with pytest.raises(SystemExit) as raised:
        gs.load_prompts(path)
    assert said in str(raised.value)


def test_the_body_carries_the_schema_or_the_shared_grammar(gs):
    prompt = {"id": "p", "prompt": "Extract.", "schema": SCHEMA}
    body = gs.body_of(prompt, 64, stream=True)
    assert body["response_format"]["json_schema"] == {
        "name": "answer",
        "schema": SCHEMA,
        "strict": True,
    }
    assert body["temperature"] == 0 and body["max_tokens"] == 64
    assert body["stream_options"] == {"include_usage": True}
    shared = gs.body_of({**prompt, "gbnf": 'root ::= "x"'}, 64, stream=False)
    assert shared["grammar"] == 'root ::= "x"' and "response_format" not in shared


TIMINGS = {"predicted_n": 9, "predicted_ms": 300.0, "predicted_per_second": 30.0,
           "draft_n": 6, "draft_n_accepted": 4}  # fmt: skip
USAGE = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}


class Canned(BaseHTTPRequestHandler):
    """An answer in llama-server's shapes: whole, or three content chunks then usage."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["max_tokens"] == 1:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "no"}}')
            return
        self.send_response(200)
        if not body["stream"]:
            answer = {
                "choices": [{"message": {"content": ANSWER}, "finish_reason": "stop"}],
                "usage": USAGE,
                "timings": TIMINGS,
            }
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(answer).encode())
            return
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = [ANSWER[:8], ANSWER[8:16], ANSWER[16:]]
        events = [{"choices": [{"delta": {"content": p}, "finish_reason": None}]} for p in pieces]
        events[-1]["choices"][0]["finish_reason"] = "stop"
        events.append({"choices": [], "usage": USAGE, "timings": TIMINGS})
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def canned_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_record_reads_the_servers_figures_whole_and_streamed(gs, canned_port):
    prompt = {"id": "p", "prompt": "Extract.", "schema": SCHEMA}
    with httpx.Client(timeout=10) as client:
        whole = gs.ask(client, canned_port, prompt, 64, False)
        streamed = gs.ask(client, canned_port, prompt, 64, True)
        failed = gs.ask(client, canned_port, prompt, 1, False)
    for record in (whole, streamed):
        assert record["error"] is None and record["text"] == ANSWER
        assert record["completion_tokens"] == 9 and record["server_tok_s"] == 30.0
        assert (record["draft_n"], record["draft_n_accepted"]) == (6, 4)
        assert record["finish_reason"] == "stop"
    assert streamed["chunks"] == 3 and streamed["measured_tok_s"] > 0
    assert "measured_tok_s" not in whole
    assert failed["error"].startswith("RuntimeError: HTTP 400")


def record(mode, prompt, tok_s, text=ANSWER, stream=False, error=None):
    return {"mode": mode, "prompt": prompt, "stream": stream, "error": error, "text": text,
            "completion_tokens": 9, "server_tok_s": tok_s, "repeat": 0}  # fmt: skip


def test_the_summary_takes_geometric_means_and_ratios_and_counts_agreement(gs):
    prompts = [{"id": p, "prompt": "x", "schema": SCHEMA} for p in ("a", "b")]
    records = [
        record("llama-none", "a", 10.0),
        record("llama-none", "b", 40.0),
        record("localspec-none", "a", 5.0, text='{"name": "Ann",  "age": 3}'),
        record("localspec-none", "b", 20.0),
        record("localspec-auto", "a", 40.0),
        record("localspec-auto", "b", 40.0, text='{"name": "Ann"}'),
        record("localspec-auto", "b", None, error="RuntimeError: HTTP 500", stream=True),
    ]
    gs.mark(records, prompts, gs.subset_errors)
    modes = ["llama-none", "localspec-none", "localspec-auto"]
    table, cells = gs.per_prompt(records, modes)
    totals, summary = gs.summarize(records, modes, cells)
    assert summary["llama-none"]["server_tok_s"] == pytest.approx(20.0)
    assert summary["localspec-none"]["vs_llama-none"] == pytest.approx(0.5)
    assert summary["localspec-auto"]["vs_localspec-none"] == pytest.approx(4.0)
    auto = summary["localspec-auto"]
    assert (auto["requests"], auto["errors"], auto["schema_ok"]) == (3, 1, 1)
    assert auto["same_as_llama_none"] == "1/2" and auto["same_as_localspec_none"] == "0/2"
    assert "| a | localspec-auto | 9 | 40.0 |" in table
    assert "| localspec-auto | 40.0 | 2.00 | 4.00 |" in totals


HEALTHY = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps({"status": "ok"}).encode())
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_server_that_does_not_come_up_is_an_error_naming_its_command(gs, tmp_path, monkeypatch):
    dead = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    monkeypatch.setattr(gs, "command", lambda mode, port, args: dead)
    args = argparse.Namespace(start_timeout=30.0)
    log = tmp_path / "s.log"
    with (
        httpx.Client() as client,
        pytest.raises(SystemExit) as raised,
        gs.served("llama-none", args, client, log, tmp_path),
    ):
        pass
    said = str(raised.value)
    assert "exited with status 3" in said and "raise SystemExit(3)" in said
    assert "no model here" in said  # the end of its log


def test_a_server_is_stopped_on_leaving_also_on_an_error(gs, tmp_path, monkeypatch):
    started = []

    def command(mode, port, args):
        started.append(port)
        return [sys.executable, "-c", HEALTHY, str(port)]

    monkeypatch.setattr(gs, "command", command)
    args = argparse.Namespace(start_timeout=60.0)
    log = tmp_path / "s.log"
    with httpx.Client() as client:
        with (
            pytest.raises(KeyboardInterrupt),
            gs.served("llama-none", args, client, log, tmp_path) as (port, facts),
        ):
            assert gs.healthy(client, port) and facts["cmd"][-1] == str(port)
            raise KeyboardInterrupt
        assert not gs.healthy(client, started[0])
