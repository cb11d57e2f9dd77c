"""A real browser against the server: a page of another origin on 127.0.0.1 tries to drive
it with ``fetch``, with and without ``no-cors``, and must neither read an answer nor leave
a trace; a page of an origin ``--cors-origin`` lists can. Headless Chromium (Debian's
``chromium``); without it the test is skipped, unless ``LOCALSPEC_REQUIRE_BROWSER=1`` (which
CI sets) makes a missing or broken browser a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localspec.core.params import GenerationParams
from localspec.serve.access import Access
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions
from localspec.storage.library import Library
from tests.serving import serving

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
REQUIRED = os.environ.get("LOCALSPEC_REQUIRE_BROWSER") == "1"
WAIT_S = 60

PAGE = """<!doctype html><meta charset="utf-8"><title>elsewhere</title><script>
const body = JSON.stringify({messages: [{role: "user", content: "PROMPT"}], max_tokens: 8});
async function attempt(url, init) {
  try {
    const r = await fetch(url, init);
    let text = "";
    try { text = await r.text(); } catch (e) { text = "unreadable: " + e; }
    return {type: r.type, status: r.status, text: text};
  } catch (e) {
    return {error: String(e)};
  }
}
(async () => {
  const report = {
    cors: await attempt("API/v1/chat/completions",
      {method: "POST", headers: {"Content-Type": "application/json"}, body}),
    nocors: await attempt("API/v1/chat/completions", {method: "POST", mode: "no-cors", body}),
    nocors_json: await attempt("API/v1/chat/completions",
      {method: "POST", mode: "no-cors", headers: {"Content-Type": "application/json"}, body}),
    models: await attempt("API/v1/models", {}),
    allowed: await attempt("ALLOWED/v1/chat/completions",
      {method: "POST", headers: {"Content-Type": "application/json"}, body}),
  };
  await fetch("/report", {method: "POST", body: JSON.stringify(report)});
})();
</script>"""


def browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


class Page:
    """A web server of its own origin: serves ``html``, and takes the page's report."""

    def __init__(self) -> None:
        self.html = ""
        self.report: dict | None = None
        self.done = threading.Event()
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = page.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                page.report = json.loads(self.rfile.read(length))
                self.send_response(204)
                self.end_headers()
                page.done.set()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_browser(binary: str, url: str, profile) -> subprocess.Popen:
    return subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_page_of_another_origin_can_neither_drive_nor_read_the_server(tiny_pair, tmp_path):
    binary = browser()
    if binary is None:
        if REQUIRED:
            pytest.fail("LOCALSPEC_REQUIRE_BROWSER=1 but no chromium is installed")
        pytest.skip("no chromium on PATH (apt-get install chromium); CI runs this test")
    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1,
                           calibrate=False, stores=(), history=False)  # fmt: skip
    session = open_session(options)
    params = GenerationParams(max_tokens=8, drafter="none")
    try:
        # Both servers keep every client's answers (--history): a request that ran leaves
        # a trace there. The second lists the page's origin, as its owner would.
        with serving(session, defaults=params, history=True) as refused:
            page = Page()
            allowed_access = Access(cors_origins=(page.origin,))
            with serving(session, defaults=params, access=allowed_access) as allowed:
                page.html = PAGE.replace("API", refused.url).replace("ALLOWED", allowed.url)
                report = _visit(binary, page, tmp_path)
            submitted = refused.worker.submitted
        histories = Library().histories()
    finally:
        session.close()

    for name in ("cors", "models"):
        assert "error" in report[name], (name, report[name])  # the browser saw no answer
    for name in ("nocors", "nocors_json"):
        # no-cors: whatever came back is opaque to the page (and the server refused it).
        assert "error" in report[name] or report[name]["type"] == "opaque", report[name]
        assert not report[name].get("text"), report[name]
    assert submitted == 0 and histories == []  # nothing ran, nothing was kept
    # The same browser reads an answer from a server that lists the page's origin.
    answer = report["allowed"]
    assert answer.get("status") == 200, answer
    assert json.loads(answer["text"])["choices"][0]["message"]["content"] is not None


def _visit(binary: str, page: Page, tmp_path) -> dict:
    """Open the page in a headless browser; its report once it has run."""
    proc = run_browser(binary, page.origin + "/", tmp_path / "profile")
    try:
        if not page.done.wait(WAIT_S):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"the browser did not run the page within {WAIT_S} s: {err[-2000:]}")
        assert page.report is not None
        return page.report
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        page.close()
