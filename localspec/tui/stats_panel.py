"""How the live statistics of the chat show (what is counted: ``tui.live.LiveStats``).

``StatsPanel`` renders a ``LiveStats`` snapshot, its rates as ``GenerationStats`` computes
them; ``speedup`` is decode tokens/s over the session's measured plain decoding speed.

Tokens are coloured by their origin, a drafter's name or ``TARGET``. ``ORIGINS`` is the one
table of the names the stats use (every shipped drafter, ``self`` for a draft model derived
from the target, the target, and ``PLAIN`` for plain steps) with their label and style;
``origin_style`` and ``origin_label`` give any other drafter a style of its own and its name
as label, so a new drafter shows without an edit here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from localspec.core.events import TARGET, RoundCompleted
from localspec.core.stats import PLAIN, GenerationStats
from localspec.tui.live import LiveStats

SPARK_CHARS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Origin:
    """How the panel and the answers show one name of the stats."""

    label: str
    style: str  # of its tokens and its legend entry ("": the terminal's own text)
    listed: bool = False  # in the legend before any of its tokens came


# Every name the stats use, in the legend's order. The legend lists the drafters ``auto``
# drafts with on any machine and the target from the start, the others once they drafted.
ORIGINS: dict[str, Origin] = {
    "model": Origin("draft model", "bold #6fcf73", listed=True),
    "ngram": Origin("n-gram", "bold #5fb3f0", listed=True),
    "store": Origin("datastore", "bold #e0a84f", listed=True),
    TARGET: Origin("target", "", listed=True),
    "prediction": Origin("prediction", "bold #f07178"),
    "self": Origin("self-draft", "bold #89ddff"),  # the draft model, derived from the target
    "lookahead": Origin("lookahead", "bold #c792ea"),
    PLAIN: Origin("plain", ""),  # plain steps, in the per-drafter counts
}
# Drafters not in the table: bold, in colours none of the table's use, chosen from the name
# so that a drafter keeps its colour from one answer (and one run) to the next.
OTHER_STYLES = ("bold #ffcb6b", "bold #f78c6c", "bold #c3e88d", "bold #82aaff")


def origin_style(origin: str) -> str:
    """The style of a token of this origin (a drafter's name, or ``TARGET``)."""
    known = ORIGINS.get(origin)
    if known is not None:
        return known.style
    return OTHER_STYLES[sum(origin.encode()) % len(OTHER_STYLES)]


def origin_label(origin: str) -> str:
    """The words for a name of the stats: the table's, or the name itself."""
    known = ORIGINS.get(origin)
    return known.label if known is not None else origin


def sparkline(values: Iterable[float]) -> str:
    """Bars for values in [0, 1] on a fixed scale, so 90% never looks like 0%."""
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[round(min(max(v, 0.0), 1.0) * top)] for v in values)


def speedup(stats: GenerationStats, plain_tokens_per_s: float | None) -> str:
    if not plain_tokens_per_s or not stats.decode_s:
        return "n/a"
    return f"{stats.decode_tokens_per_s / plain_tokens_per_s:.2f}x"


def _rate(stats: GenerationStats) -> str:
    return f"{stats.acceptance_rate:.0%}" if stats.drafted else "–"


def _tau(stats: GenerationStats) -> str:
    return f"{stats.mean_accepted_length:.2f}" if stats.rounds else "–"


def _tps(stats: GenerationStats) -> str:
    return f"{stats.decode_tokens_per_s:.1f}" if stats.decode_s else "–"


def _drafter_cell(stats: GenerationStats, key: str) -> str:
    d = stats.by_drafter.get(key)
    if d is None:
        return "–"
    if key == PLAIN:
        return f"{d.rounds} steps"
    return f"{d.accepted}/{d.drafted} {d.acceptance_rate:.0%}" if d.drafted else "0/0"


def legend(colour: bool, seen: Iterable[str] = ()) -> Text:
    """The origins' colours: those the table lists from the start, then those of ``seen``
    (the origins whose tokens came), the table's in its order first."""
    came = list(seen)
    listed = [name for name, origin in ORIGINS.items() if origin.listed or name in came]
    text = Text()
    for origin in [*listed, *(o for o in came if o not in ORIGINS)]:
        style = origin_style(origin) if colour else ""
        text.append("■ " if colour else "□ ", style=style or "dim")
        text.append(origin_label(origin), style=style)
        text.append("  ")
    if not colour:
        text.append("(off)", style="dim")
    return text


def summary_line(live: LiveStats, plain_tokens_per_s: float | None) -> Text:
    """The answer's figures in one line, for terminals too narrow for the panel."""
    a = live.answer
    return Text(
        f"accepted {_rate(a)} · {_tau(a)}/pass · {_tps(a)} tok/s · "
        f"{speedup(a, plain_tokens_per_s)} · F3 panel"
    )


def render_stats(
    live: LiveStats, plain_tokens_per_s: float | None, n_ctx: int, where: str = ""
) -> Group:
    """The panel's figures; ``where`` says where the models run (``Placement.summary``)."""
    answer, chat = live.answer, live.chat
    figures = Table.grid(padding=(0, 1), expand=True)
    figures.add_column(ratio=1)
    figures.add_column(justify="right")
    figures.add_column(justify="right")
    figures.add_row(Text("", style="bold"), Text("answer", "bold"), Text("chat", "bold"))
    figures.add_row("decode tok/s", _tps(answer), _tps(chat))
    plain = f"{plain_tokens_per_s:.1f}" if plain_tokens_per_s else "n/a"
    figures.add_row("plain tok/s", "", plain)
    figures.add_row(
        "speedup", speedup(answer, plain_tokens_per_s), speedup(chat, plain_tokens_per_s)
    )
    figures.add_row("acceptance", _rate(answer), _rate(chat))
    figures.add_row("tokens/pass", _tau(answer), _tau(chat))
    figures.add_row("tokens", str(answer.generated_tokens), str(chat.generated_tokens))
    figures.add_row("target passes", str(answer.rounds), str(chat.rounds))

    drafters = Table.grid(padding=(0, 1), expand=True)
    drafters.add_column(ratio=1)
    drafters.add_column(justify="right")
    drafters.add_column(justify="right")
    drafters.add_row(Text("accepted/drafted", "bold"), "", "")
    for key in sorted(chat.by_drafter, key=lambda k: (k == PLAIN, k)):
        drafters.add_row(origin_label(key), _drafter_cell(answer, key), _drafter_cell(chat, key))

    parts: list[RenderableType] = [figures, Text(""), drafters, Text("")]
    parts.append(_last_round(live.last_round))
    parts.append(Text.assemble(("acceptance, last rounds", "bold")))
    parts.append(Text(sparkline(live.recent) or "–", style="#6fcf73"))
    parts.append(Text(""))
    parts.append(_context(live.context_tokens, n_ctx))
    if where:
        parts += [Text(""), Text.assemble(("runs on ", "bold"), where)]
    return Group(*parts)


def _last_round(last: RoundCompleted | None) -> Text:
    text = Text.assemble(("draft length ", "bold"))
    if last is None:
        text.append("–")
    elif not last.drafter:
        text.append("0 (plain step)")
    else:
        text.append(f"{last.drafted} ({origin_label(last.drafter)}, {last.accepted} accepted)")
    if last is not None and last.reason:
        text.append(f"\n{last.reason}", style="dim")
    return text


def _context(used: int, n_ctx: int) -> Text:
    if not n_ctx:  # no session yet
        return Text.assemble(("context ", "bold"), "–")
    share = used / n_ctx if n_ctx else 0.0
    width = 20
    filled = min(width, round(share * width))
    style = "red" if share > 0.9 else "yellow" if share > 0.75 else "green"
    text = Text.assemble(("context ", "bold"), f"{used} / {n_ctx} tokens\n")
    text.append("━" * filled, style=style)
    text.append("━" * (width - filled), style="dim")
    return text


class StatsPanel(Static):
    """The right-hand panel: legend, figures, per-drafter counts, sparkline, context."""

    def show(
        self,
        live: LiveStats,
        plain_tokens_per_s: float | None,
        n_ctx: int,
        colour: bool,
        where: str = "",
    ) -> None:
        self.group = Group(
            legend(colour, live.chat.by_origin),
            Text(""),
            render_stats(live, plain_tokens_per_s, n_ctx, where),
        )
        self.update(self.group)
