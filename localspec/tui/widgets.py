"""Widgets of the chat screen: the input box, the transcript and its messages, the loading
panel.

``ChatInput`` sends on Enter and inserts a newline on Shift+Enter or Ctrl+J; Up in the empty
box posts ``Recall`` (the app puts the last message back for editing).
``AssistantMessage`` keeps the answer as spans of (text, origin) so it can be drawn with or
without the origin colours at any time; ``finalize`` makes the spans agree with the text the
engine reports in ``Finished`` (a stop string is not part of the answer) and parses the
answer as Markdown, once. A finished answer shows that Markdown when ``rendered`` is on, and
its origin-coloured tokens otherwise; while it streams it always shows the tokens.
``LoadingPanel`` shows the loading's progress reports (``localspec.progress``): a download
reported again with a new fraction replaces its line, by the report's kind and text.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.text import Text
from textual import events
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import LoadingIndicator, Static, TextArea

from localspec.progress import Progress, ProgressKind
from localspec.tui.conversation import Turn, answer_note
from localspec.tui.stats_panel import origin_style

# The UI shares the CPU with llama.cpp's threads: every redraw is time taken from decoding,
# so the answer is redrawn a few times a second rather than at the terminal's frame rate.
NEWLINE_KEYS = frozenset({"shift+enter", "ctrl+j", "newline"})
CODE_THEME = "monokai"  # Pygments style of fenced code in rendered answers


class ChatInput(TextArea):
    """Multi-line message box: Enter sends, Shift+Enter or Ctrl+J starts a new line."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class Recall(Message):
        """Up was pressed in the empty box."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)  # type: ignore[arg-type]

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "up" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.Recall())
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


def turn_class(turn: Turn) -> str:
    return f"turn-{turn.id}"


class UserMessage(Static):
    def __init__(self, turn: Turn) -> None:
        super().__init__(Text(turn.user), classes=f"message user {turn_class(turn)}")
        self.border_title = "You"


class AssistantMessage(Static):
    """An answer as it streams; each span remembers which drafter (if any) produced it."""

    def __init__(self, turn: Turn, colour: bool = True, rendered: bool = True) -> None:
        super().__init__(classes=f"message assistant {turn_class(turn)}")
        self.border_title = "Assistant"
        self.turn = turn
        self.spans: list[tuple[str, str | None]] = []
        self.colour = colour
        self.rendered = rendered  # a finished answer shows as Markdown
        self.markdown: Markdown | None = None  # parsed once, when the answer finishes
        self.note = ""
        self._redraw_due = False

    @property
    def shows_markdown(self) -> bool:
        return self.rendered and self.markdown is not None

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.spans)

    def on_mount(self) -> None:
        self.redraw()

    def append(self, text: str, origin: str) -> None:
        """Add a token; it shows at the next ``flush`` (the app's frame), because redrawing
        re-renders and re-lays out the whole answer."""
        if not text:
            return
        self.spans.append((text, origin))
        self._redraw_due = True

    def flush(self) -> None:
        """Show the tokens appended since the last redraw, if any."""
        if self._redraw_due:
            self.redraw()

    def set_colour(self, colour: bool) -> None:
        self.colour = colour
        self.redraw()

    def set_rendered(self, rendered: bool) -> None:
        self.rendered = rendered
        self.redraw()

    def finalize(self, text: str | None = None) -> None:
        """Settle the spans on the final text, parse it as Markdown (the only time it is
        parsed) and show how the answer ended."""
        if text is not None and text != self.text:
            self.spans = _truncate(self.spans, text) if self.text.startswith(text) else []
            if not self.spans and text:
                self.spans = [(text, None)]
        self.note = answer_note(self.turn)
        answer = self.text
        self.markdown = Markdown(answer, code_theme=CODE_THEME) if answer.strip() else None
        self.redraw()

    def redraw(self) -> None:
        self._redraw_due = False
        self.update(self.view())

    def view(self) -> RenderableType:
        """The Markdown of a finished answer (with its note), or the coloured tokens."""
        if self.markdown is None or not self.rendered:
            return self.body()
        if not self.note:
            return self.markdown
        return Group(self.markdown, Text(self.note, style="dim italic"))

    def body(self) -> Text:
        body = Text()
        for text, origin in self.spans:
            style = origin_style(origin) if (self.colour and origin is not None) else ""
            body.append(text, style=style)
        if not self.spans and not self.turn.done:
            body.append("…", style="dim")
        if self.note:
            body.append(f"\n{self.note}", style="dim italic")
        return body


def _truncate(spans: list[tuple[str, str | None]], text: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    left = len(text)
    for span, origin in spans:
        if left <= 0:
            break
        out.append((span[:left], origin))
        left -= len(span)
    return out


class Notice(Static):
    """A line from the app itself in the transcript (ready, errors, dropped turns). Its text
    often quotes model names, paths and error messages, so a string is shown literally,
    never parsed as markup."""

    def __init__(self, text: str | Text, kind: str = "info") -> None:
        super().__init__(Text(text) if isinstance(text, str) else text, classes=f"notice {kind}")


class LoadingPanel(Vertical):
    """Shown while the models load: a spinner and the latest progress reports, one a line;
    a report on the same thing as the last one (a download's new fraction) replaces it."""

    MAX_LINES = 6

    def __init__(self) -> None:
        super().__init__(id="loading")
        self.reports: list[Progress] = []

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static("Loading the models…", id="loading-title")
        yield LoadingIndicator()
        yield Static("", id="loading-lines")

    @property
    def lines(self) -> list[str]:
        return [progress_text(p) for p in self.reports]

    def add(self, progress: Progress) -> None:
        if self.reports and self.reports[-1].same_line(progress):
            self.reports[-1] = progress
        else:
            self.reports.append(progress)
        del self.reports[: -self.MAX_LINES]
        shown = Text("\n").join(
            Text(progress_text(p), style="yellow" if p.kind is ProgressKind.WARNING else "")
            for p in self.reports
        )
        self.query_one("#loading-lines", Static).update(shown)


def progress_text(progress: Progress) -> str:
    """A report as the panel writes it: a warning says so, a download its share done."""
    if progress.kind is ProgressKind.WARNING:
        return f"warning: {progress.text}"
    if progress.fraction is not None:
        return f"{progress.text} {progress.fraction:.0%}"
    return progress.text


class Transcript(VerticalScroll):
    """The conversation; stays scrolled to the end while answers stream in."""

    def on_mount(self) -> None:
        self.anchor()
