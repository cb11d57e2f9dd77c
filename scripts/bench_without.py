"""``localspec bench`` with one more mode: ``auto`` without one drafter, in the same run.

    python scripts/bench_without.py DRAFTER bench [bench options] --modes none,auto,auto-without

The mode ``auto-without`` runs ``auto`` with DRAFTER (a registry name: lookahead, model,
ngram, prediction, store) taken out of its drafters, interleaved with the other modes of the
same process, so that what a drafter costs or brings to ``auto`` is measured side by side on
the same prompts and the same machine state. Every run starts from fresh drafters (the
bench's planners are kept per mode's parameters, which the two modes share).
"""

from __future__ import annotations

import sys

from localspec.bench import runner
from localspec.core import engine
from localspec.core.drafting import registry

WITHOUT = "auto-without"


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in registry.drafter_names():
        names = ", ".join(registry.drafter_names())
        sys.exit(f"usage: bench_without.py DRAFTER bench ...  (DRAFTER: one of {names})")
    left_out = sys.argv[1]
    running: dict[str, str | None] = {"mode": None}
    runner.AUTO_MODES = (*runner.AUTO_MODES, WITHOUT)
    parse_modes, run_engine = runner.parse_modes, runner.BenchRunner.run_engine
    build_drafters = registry.build_drafters

    def parse(text: str) -> tuple[str, ...]:
        asked = [m.strip() for m in text.split(",")]
        modes = parse_modes(",".join(m for m in asked if m != WITHOUT))
        return (*modes, WITHOUT) if WITHOUT in asked else modes

    def run(self, tokens, mode, *args, **kwargs):
        running["mode"] = mode
        self.session.decoder.forget_learning()
        try:
            return run_engine(self, tokens, mode, *args, **kwargs)
        finally:
            running["mode"] = None
            self.session.decoder.forget_learning()

    def build(params, resources):
        drafters = build_drafters(params, resources)
        if running["mode"] == WITHOUT:
            drafters.pop(left_out, None)
        return drafters

    runner.parse_modes = parse
    runner.BenchRunner.run_engine = run
    engine.build_drafters = build

    from localspec.cli.app import main as localspec

    sys.argv = ["localspec", *sys.argv[2:]]
    localspec()


if __name__ == "__main__":
    main()
