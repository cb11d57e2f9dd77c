"""What a busy server has done, for ``GET /metrics`` in Prometheus' text format (0.0.4).

``Metrics`` is fed by the worker (serve/worker.py) from its lanes' threads: ``ended(job,
outcome)`` once per queued request (``OUTCOMES``: its answer completed, its client left,
the server stopped, it failed or was refused as it started, or the queue was full),
``observe(job, event, now)`` with every event of a running job. From the events it counts
the tokens prompted and generated and the drafted and accepted ones per drafter, read from
each answer's ``Finished`` stats (the figures its ``timings`` shows, so that the two agree),
with the drafted and accepted tokens per drafter and draft position (position k counts a
round that drafted k tokens or more, and one that accepted k or more: the per-request
``drafted_at`` and ``accepted_at``), and times each answer's first token (from when it was
queued) and the gaps between its tokens into histograms. ``render(waiting, running,
lanes)`` writes it all, with the queue's length and the busy lanes read at that moment.
Nothing here names a client or holds a request's text.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

from localspec.core.events import Finished, TokenEmitted

OUTCOMES = ("completed", "cancelled", "stopped", "failed", "queue_full")
# Histogram buckets, in seconds: a first token waits for the queue and the prefill; the gap
# between tokens is a round's time shared by the tokens it emitted.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFIX = "localspec_"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.total += 1
        self.sum += seconds
        for i, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.counts[i] += 1


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.prompt_tokens = 0  # tokens in the prompts
        self.evaluated_tokens = 0  # of them, evaluated (not found in a lane's cache)
        self.generated_tokens = 0
        self.restored_tokens = 0  # of the prompts, restored from the prompt cache
        self.restores = 0  # answers whose prompt was restored
        self.rounds = 0  # target passes
        self.drafted: Counter[str] = Counter()  # by drafter
        self.accepted: Counter[str] = Counter()
        # By (drafter, draft position from 1).
        self.position_drafted: Counter[tuple[str, int]] = Counter()
        self.position_accepted: Counter[tuple[str, int]] = Counter()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.token_gap = Histogram(TOKEN_BUCKETS)
        self._last_token: dict[int, float] = {}  # a running job's last token, by id(job)

    def ended(self, job: Any, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            self._last_token.pop(id(job), None)

    def observe(self, job: Any, event: Any, now: float) -> None:
        with self._lock:
            if isinstance(event, TokenEmitted):
                last = self._last_token.get(id(job))
                if last is None:
                    self.ttft.observe(max(0.0, now - job.since))
                else:
                    self.token_gap.observe(max(0.0, now - last))
                self._last_token[id(job)] = now
            elif isinstance(event, Finished):
                self._finished(event)

    def _finished(self, event: Finished) -> None:
        stats = event.stats
        self.prompt_tokens += stats.prompt_tokens
        # As the answer's timings count them (its prompt_n): see openai_shapes.timings.
        self.evaluated_tokens += min(stats.prefill_evaluated + 1, stats.prompt_tokens)
        self.generated_tokens += stats.generated_tokens
        if stats.restored_tokens:
            self.restores += 1
            self.restored_tokens += stats.restored_tokens
        self.rounds += stats.rounds
        for name, by in stats.by_drafter.items():
            self.drafted[name] += by.drafted
            self.accepted[name] += by.accepted
            for k, n in enumerate(by.drafted_at, 1):
                self.position_drafted[name, k] += n
            for k, n in enumerate(by.accepted_at, 1):
                self.position_accepted[name, k] += n

    def render(self, waiting: int, running: int, lanes: int) -> str:
        """The text format: each family's HELP and TYPE, then its samples."""
        with self._lock:
            out: list[str] = []
            counter = _family(out, "counter")
            gauge = _family(out, "gauge")
            counter("requests_total", "Queued requests, by how they ended.",
                    [({"outcome": o}, self.outcomes[o]) for o in OUTCOMES])  # fmt: skip
            gauge("queue_waiting", "Requests waiting for a lane.", [({}, waiting)])
            gauge("lanes_busy", "Lanes running a request.", [({}, running)])
            gauge("lanes", "Lanes: requests run at once.", [({}, lanes)])
            counter("prompt_tokens_total", "Tokens in the answered prompts.",
                    [({}, self.prompt_tokens)])  # fmt: skip
            counter("prompt_evaluated_tokens_total", "Prompt tokens evaluated (not reused "
                    "from a lane's cache), as timings.prompt_n.",
                    [({}, self.evaluated_tokens)])  # fmt: skip
            counter("generated_tokens_total", "Tokens generated.", [({}, self.generated_tokens)])
            counter("prompt_cache_hits_total", "Answers whose prompt's prefix was restored "
                    "from the prompt cache.", [({}, self.restores)])  # fmt: skip
            counter("prompt_cache_restored_tokens_total", "Prompt tokens restored from the "
                    "prompt cache (part of those not evaluated).",
                    [({}, self.restored_tokens)])  # fmt: skip
            counter("target_passes_total", "Target evaluations of the answers' rounds.",
                    [({}, self.rounds)])  # fmt: skip
            names = sorted(self.drafted)
            counter("draft_tokens_total", "Tokens drafted, by drafter.",
                    [({"drafter": n}, self.drafted[n]) for n in names])  # fmt: skip
            counter("draft_accepted_tokens_total", "Drafted tokens the target accepted, by "
                    "drafter.", [({"drafter": n}, self.accepted[n]) for n in names])  # fmt: skip
            at = sorted(self.position_drafted)
            drafted_at = [(_at(key), self.position_drafted[key]) for key in at]
            accepted_at = [(_at(key), self.position_accepted[key]) for key in at]
            counter("draft_position_drafted_total", "Rounds that drafted a token at this "
                    "position of the draft (from 1), by drafter.", drafted_at)  # fmt: skip
            counter("draft_position_accepted_total", "Rounds whose draft was accepted up to "
                    "this position or past it, by drafter.", accepted_at)  # fmt: skip
            _histogram(out, "time_to_first_token_seconds", "From queued to the answer's "
                       "first token.", self.ttft)  # fmt: skip
            _histogram(out, "inter_token_latency_seconds", "Between two tokens of an "
                       "answer.", self.token_gap)  # fmt: skip
            return "\n".join(out) + "\n"


def _at(key: tuple[str, int]) -> dict[str, str]:
    return {"drafter": key[0], "position": str(key[1])}


def _family(out: list[str], kind: str) -> Any:
    def write(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {PREFIX}{name} {help_text}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        for labels, value in samples:
            out.append(f"{PREFIX}{name}{_labels(labels)} {_number(value)}")

    return write


def _histogram(out: list[str], name: str, help_text: str, h: Histogram) -> None:
    out.append(f"# HELP {PREFIX}{name} {help_text}")
    out.append(f"# TYPE {PREFIX}{name} histogram")
    for bound, count in zip(h.buckets, h.counts, strict=True):
        out.append(f'{PREFIX}{name}_bucket{{le="{bound}"}} {count}')
    out.append(f'{PREFIX}{name}_bucket{{le="+Inf"}} {h.total}')
    out.append(f"{PREFIX}{name}_sum {_number(h.sum)}")
    out.append(f"{PREFIX}{name}_count {h.total}")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
