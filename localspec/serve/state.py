"""What a server holds while it runs: ``ServerState``, shared by its endpoints, its loader and
its shutdown.

The server's own settings come from its options (defaults, access, limits). The pair is
loaded in the background: until ``serve_with(worker)`` the endpoints answer that it is
loading, and a loading that fails leaves ``load_error`` (the server then stops, see
serve/server.py). ``serve_with`` first copies the facts of the worker's session that the
endpoints read (the model's name, its vocabulary, whether it has FIM tokens, which draft it
runs with): from then on the session is the worker's, used on the worker's threads alone,
never from the event loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from localspec.core.params import GenerationParams
from localspec.serve.access import Access
from localspec.serve.worker import GenerationWorker


@dataclass
class ServerState:
    defaults: GenerationParams
    access: Access = field(default_factory=Access)
    max_body: int = 1 << 20
    body_timeout_s: float = 30.0  # for a request's whole body to arrive
    max_tokens_limit: int | None = None  # the most new tokens a request may ask for
    speculative_overrides: bool = True  # a request may set speculative.* (within limits)
    timings: bool = True  # False (--no-timings): answers carry no ``timings`` object
    # Control-token text in a /v1/completions prompt acts as control tokens (never in chat).
    parse_special: bool = False
    worker: GenerationWorker | None = None
    # The loaded pair, as the endpoints know it (copied by ``serve_with``).
    model_id: str = "localspec"
    draft_id: str | None = None
    placement: dict[str, Any] | None = None  # where each model runs (machine/placement.py)
    n_vocab: int = 0  # the target's vocabulary size: a prompt's token ids are below it
    infill: bool = False  # the target has FIM tokens: /v1/completions takes a suffix
    tools: bool = False  # the target's chat template takes tools and has a tool-call token
    load_error: Exception | None = None  # why the pair could not be loaded
    loading: bool = False  # the pair is being loaded (cli/serve.py's loader thread)
    loader: threading.Thread | None = None  # that thread: it stops at its next step
    closing: bool = False  # told to stop: a pair loaded now is freed, not served

    def serve_with(self, worker: GenerationWorker) -> None:
        """Answer from ``worker``'s session: its facts copied here first, then the worker,
        whose presence tells the endpoints that the pair is loaded."""
        session = worker.session
        self.model_id = session.target.path.stem
        self.draft_id = session.draft_path.stem if session.draft_path is not None else None
        self.placement = session.placement.to_dict() if session.placement else None
        self.n_vocab = session.target.n_vocab
        self.infill = session.fim.infill
        self.tools = session.takes_tools()
        self.worker = worker
