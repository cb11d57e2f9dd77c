#!/usr/bin/env python3
"""What the chat's screen costs decoding: plain decoding of the same prompts in a fresh
`localspec complete` process and in a fresh `localspec chat` app (Textual, headless, at
120x40, streaming tokens into the transcript and redrawing the stats panel as it does on a
terminal, then rendering the answer as Markdown), interleaved, decode tokens/s side by side.

    python experiments/chat_overhead.py --prompts 4 --max-tokens 200 --repeat 2

`--app` runs one chat answer and prints its stats as JSON (the script runs itself so).
A benchmark, not a test: one run's tok/s moves by several percent with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys

PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring and an example.",
    "Explain the difference between a process and a thread, with a short example in Python.",
    "Write a bash script that backs up a directory into a dated tar.gz file.",
    "Write a JavaScript function that groups an array of objects by a key.",
    "Write a SQL query that lists customers with more than three orders last month.",
    "Explain what a Python generator is and when to use one, with code.",
]


async def _chat_once(prompt: str, max_tokens: int) -> dict:
    from localspec.core.params import GenerationParams
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions
    from localspec.tui.app import ChatApp

    options = ModelOptions(use_draft=False, calibrate=True, show_download_progress=False)
    params = GenerationParams(max_tokens=max_tokens, drafter="none")
    app = ChatApp(
        lambda progress, on_lost: open_session(options, progress, on_lost), params, autosave=False
    )
    async with app.run_test(size=(120, 40)) as pilot:
        while app.chat.session is None and app.chat.load_error is None:
            await pilot.pause(0.1)
        if app.chat.load_error:
            raise SystemExit(f"chat could not load: {app.chat.load_error}")
        app.chat.send(prompt)
        # asyncio's sleep, not the pilot's pause: that one waits for the screen to update,
        # which would add redraws a user's terminal does not get
        while app.chat.generating:
            await asyncio.sleep(0.05)
        await pilot.pause(0.2)
        return app.chat.conversation.turns[-1].stats.to_dict()


def _complete_once(prompt: str, max_tokens: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "localspec", "complete", "--json", "--drafter", "none",
         "--max-tokens", str(max_tokens)],
        input=prompt, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"complete failed: {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])["stats"]


def _app_once(prompt: str, max_tokens: int) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--app", "--max-tokens", str(max_tokens)],
        input=prompt, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"chat failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--app", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.app:
        stats = asyncio.run(_chat_once(sys.stdin.read(), opts.max_tokens))
        print(json.dumps(stats))
        return 0
    rows = []
    for _ in range(opts.repeat):
        for i, prompt in enumerate(PROMPTS[: opts.prompts]):
            # alternate which runs first, so neither always follows the other
            order = ("complete", "chat") if i % 2 == 0 else ("chat", "complete")
            speed = {}
            for kind in order:
                run = _complete_once if kind == "complete" else _app_once
                stats = run(prompt, opts.max_tokens)
                speed[kind] = (stats["decode_tokens_per_s"], stats["generated_tokens"])
            rows.append((i, speed))
            print(f"prompt {i}: complete {speed['complete'][0]:.2f} tok/s "
                  f"({speed['complete'][1]} tokens), chat {speed['chat'][0]:.2f} tok/s "
                  f"({speed['chat'][1]} tokens)", file=sys.stderr, flush=True)  # fmt: skip
    complete = statistics.geometric_mean([s["complete"][0] for _, s in rows])
    chat = statistics.geometric_mean([s["chat"][0] for _, s in rows])
    print("| runs | complete tok/s | chat tok/s | chat / complete |")
    print("| ---: | ---: | ---: | ---: |")
    print(f"| {len(rows)} | {complete:.2f} | {chat:.2f} | {chat / complete:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
