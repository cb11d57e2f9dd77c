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

from localspec.bench import modes, runner
from localspec.bench.modes import BenchMode
from localspec.core import engine
from localspec.core.drafting import registry


def add_mode(name: str, value: str) -> BenchMode:
    """One more member of ``BenchMode``, which ``--modes`` then accepts like the others."""
    member = str.__new__(BenchMode, value)
    member._name_, member._value_ = name, value
    BenchMode._member_map_[name] = member
    BenchMode._value2member_map_[value] = member
    BenchMode._member_names_.append(name)
    return member


WITHOUT = "auto-without"


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in registry.drafter_names():
        names = ", ".join(registry.drafter_names())
        sys.exit(f"usage: bench_without.py DRAFTER bench ...  (DRAFTER: one of {names})")
    left_out = sys.argv[1]
    running: dict[str, str | None] = {"mode": None}
    # A mode of its own, so that --modes takes it and the summary gives it its rows; it
    # runs auto's drafter.
    modes.AUTO_MODES = (*modes.AUTO_MODES, add_mode("WITHOUT", WITHOUT))
    run_engine = runner.BenchRunner.run_engine
    build_drafters = registry.build_drafters

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

    runner.BenchRunner.run_engine = run
    engine.build_drafters = build

    from localspec.cli.app import main as localspec

    sys.argv = ["localspec", *sys.argv[2:]]
    localspec()


if __name__ == "__main__":
    main()
