"""Modal screens: the key help (F1) and the context-overflow choice.

``OverflowScreen`` dismisses with "fresh" (start a new conversation and send the message
there), "drop" (drop the oldest turns until the message fits) or "cancel" (keep the message
in the input box). When the message does not fit even alone, only "cancel" is offered.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Markdown, Static

HELP = """\
# localspec chat

| key | does |
| --- | --- |
| Enter | send the message |
| Shift+Enter, Ctrl+J | new line in the message |
| Escape, Ctrl+C | stop the answer (what was written so far is kept) |
| Ctrl+N | new conversation |
| Up | in the empty box: the last message again, to edit |
| Ctrl+S | save the transcript (Markdown) and the conversation (JSON) here |
| Ctrl+T | answers as rendered Markdown, or as tokens coloured by origin |
| Ctrl+R | answer the last message again (a new seed when sampling) |
| Ctrl+O | copy the last code block of the last answer |
| F2 | origin colours on/off |
| F3 | statistics panel on/off (narrow terminals show one line of figures instead) |
| F1 | this help |
| Ctrl+Q | quit |

**Edits.** `/edit PATH what to change` sends the file with your instruction and asks for the
whole new file; the answer is drafted from the file itself (a prediction), so the parts it
keeps come several tokens per pass.

**JSON answers.** `/schema FILE your message` sends the message and makes the answer JSON
that matches the JSON schema in FILE (as `complete --json-schema` does); say in the message
what the answer should hold. The schema's keys and punctuation are drafted without a model.

**Saved conversations.** After each answer the conversation is saved in the
`conversations` folder of the localspec home (not with `--no-save`);
`localspec chat --recent` lists them and `--resume last` (or FILE) continues one.

**Colours.** While an answer is written its tokens are coloured by origin; once it is
finished it shows as Markdown (Ctrl+T shows the coloured tokens again). Green tokens were
drafted by the draft model and accepted by the target, blue ones came from n-gram lookup in
the prompt and the text so far, plain ones are the target's own. The output is the target's
either way: drafting only changes the speed.

**Figures.** *acceptance* is accepted / drafted tokens; *tokens/pass* is how many tokens
one target forward pass yields (1 without drafting); *speedup* is decode tokens/s over the
plain decoding speed measured on this machine. *answer* is the last answer, *chat* the
whole conversation.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Markdown(HELP)
            yield Static("Escape closes", classes="dialog-hint")


class OverflowScreen(ModalScreen[str]):
    BINDINGS = [Binding("escape", "choose('cancel')", "Cancel")]

    def __init__(self, n_tokens: int, n_ctx: int, alone: bool) -> None:
        super().__init__()
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        self.alone = alone

    def compose(self) -> ComposeResult:
        with Vertical(id="overflow-box"):
            yield Static("The conversation does not fit in the context", classes="dialog-title")
            if self.alone:
                text = (
                    f"This message alone needs {self.n_tokens} tokens and the context holds "
                    f"{self.n_ctx}, with room kept for the answer. Shorten it, or restart "
                    "with a larger context (--ctx N)."
                )
            else:
                text = (
                    f"With this message the prompt needs {self.n_tokens} tokens; the context "
                    f"holds {self.n_ctx}, with room kept for the answer. Start afresh with "
                    "just this message, or drop the oldest turns until it fits (they stay "
                    "in the transcript)."
                )
            yield Static(text)
            with Horizontal(classes="dialog-buttons"):
                if not self.alone:
                    yield Button("Start afresh", id="fresh", variant="primary")
                    yield Button("Drop oldest turns", id="drop", variant="warning")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
