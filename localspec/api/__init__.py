"""The Python API: a target/draft pair loaded once, completing text and holding chats.

::

    import localspec

    with localspec.load() as pair:  # the default pair, as ``localspec complete`` loads it
        stream = pair.stream_complete("def fib(n):", max_tokens=30)
        for piece in stream.pieces():
            print(piece, end="", flush=True)
        print(stream.result.stats.decode_tokens_per_s)

The contract:

- ``load(target=None, draft=None, **options) -> Speculator`` loads a pair with the command
  line's model options, spelt as Python keywords (``ctx``, ``gpu_layers``, ``drafter``,
  ...), from the same cache and home as the command line (``LOCALSPEC_HOME``): a model
  fetched by one is there for the other.
- ``Speculator.complete(prompt, **options)`` and ``chat(messages, **options)`` return a
  ``Completion`` (text, token ids, finish reason, final ``GenerationStats``, tool calls);
  ``stream_complete`` and ``stream_chat`` take the same arguments and return a ``Stream`` of
  the engine's own events (``localspec.core.events``) as they come. Streaming has methods
  of its own rather than a ``stream=True`` flag so that each method has one return type
  (which a reader, and a type checker, can tell from its name) and so the stream can carry
  what a generator cannot: ``cancel()``, the text so far, and the ``result`` at the end.
- The options of a generation are ``GenerationParams``' fields (``max_tokens``,
  ``temperature``, ``seed``, ``drafter``, ``stop``, ...), with ``prediction`` given as text.
  ``complete`` sends the prompt through the target's chat template, as the command line
  does, unless ``raw=True``; ``chat`` takes OpenAI-style messages.
- ``chat`` takes ``tools`` and ``tool_choice`` in OpenAI's shapes, shown to the model
  through the target's own template (a template without tools is a ``UsageError``), as
  ``serve`` does: the calls come back as ``Completion.tool_calls`` in OpenAI's shape, with
  finish reason ``tool_calls``, and go back with their results as ``tool`` messages.
- Greedy output (``temperature=0``, the default) is the target's own, whatever the drafter.
- Nothing is printed: loading reports to ``on_progress`` if given, and warnings are kept in
  ``Speculator.warnings`` and ``Completion.warnings``.
- Nothing of the user's is drafted from unless asked: no datastore and not the history of
  answers, unless ``stores`` names them (a drafted answer's ``stats.by_drafter`` would show
  what they hold, as ``serve``'s ``timings`` would).
- Nothing of the user's is written unless asked: answers join the history of answers only
  with ``history=True``, and what ``auto`` learns of acceptance is saved for the next
  process only with ``learn=True`` (what the command line saved is still read, so a script
  starts warm). The measured costs of this machine are cached as the command line caches
  them: they describe the machine, not the user.
- Errors are ``localspec.errors.LocalspecError`` subclasses with ``message`` and ``hint``:
  ``UsageError`` for an option that cannot work (an unknown name, a bad value, a drafter
  the loaded pair cannot run), ``InputError`` for an unusable prompt, and loading's and
  generation's own as the command line reports them.
- One generation at a time: starting another ends the stream before it (after its current
  round, so the models stay consistent); while another thread reads that stream, starting
  one is a ``UsageError``. ``Stream.cancel()`` and ``close()`` (the stream's or the pair's)
  may come from any thread: closing waits for the round under way before it frees anything.

``load`` is here; ``Speculator`` is api/speculator.py, ``Stream`` and ``Completion``
api/stream.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from localspec.api.speculator import Speculator
from localspec.backend.rpc import DEFAULT_TIMEOUT as DEFAULT_RPC_TIMEOUT
from localspec.core.params import DrafterMode
from localspec.options.generation import drafter_mode
from localspec.options.model import ModelChoice, Spelling
from localspec.options.stores import PromptCacheChoice
from localspec.progress import OnProgress, Progress, ProgressKind
from localspec.session.open import open_session
from localspec.storage.prompt_cache import DISK, MEMORY

# How ``load`` names an option in an error, and where its options are described.
LOAD = Spelling("", "_", "see help(localspec.load)")


def _size_text(size: str | int | None) -> str | None:
    return None if size is None else str(size)


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    *,
    drafter: str | DrafterMode = DrafterMode.AUTO,
    threads: int | None = None,
    ctx: int = 4096,
    gpu_layers: str | int | None = None,
    draft_gpu_layers: str | int | None = None,
    exact: bool = False,
    rpc: str | Sequence[str] | None = None,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    rpc_split: str | Sequence[float] | None = None,
    stores: Sequence[str] | None = (),
    history: bool = False,
    learn: bool = False,
    calibrate: bool | None = None,
    prompt_cache: bool = True,
    prompt_cache_size: str | int | None = None,
    on_progress: OnProgress | None = None,
) -> Speculator:
    """Load a target/draft pair, as ``localspec complete`` does with the same options.

    ``target``, ``draft``: a path, a catalog name or ``repo:file`` (None: the default pair,
    or the target's recommended draft); ``draft="self"`` or ``drafter="self"``: a draft
    derived from the target's own layers. ``drafter``: the generations' default (auto,
    model, ngram, self, lookahead, none); it decides what is loaded (``ngram``, ``lookahead``
    and ``none`` load no draft model) and whether this machine's costs are measured
    (``auto``, ``lookahead``; ``calibrate`` overrides that). ``threads``: CPU threads (None:
    all cores). ``ctx``: context size in tokens. ``gpu_layers``, ``draft_gpu_layers``:
    ``"auto"`` (None), ``"all"`` (-1), 0 (the CPU) or a number of layers. ``exact``: greedy
    output identical to plain decoding's token for token (slower kernels). ``rpc``,
    ``rpc_timeout``, ``rpc_split``: the target's layers on llama.cpp RPC workers (a lost
    worker ends the process, as on the command line: its evaluation never returns).
    ``stores``: the datastores ``auto`` drafts from: none by default, as ``localspec serve``
    (a service built on a pair would let its users probe them through ``Completion.stats``);
    names (``"history"``: the history of answers), or None for every one built with the
    target's tokenizer, the history included. ``history``: add each answer
    to the history of answers. ``learn``: save what ``auto`` learned for the next process.
    ``prompt_cache``: restore prompts computed before (in this process, or saved on disk by
    an earlier one) and keep each answer's, each tier bounded by ``prompt_cache_size``
    (``"2GB"``, a number of bytes; None: ``$LOCALSPEC_PROMPT_CACHE_SIZE``, else from this
    machine's memory and free disk).
    ``on_progress``: called with each ``localspec.progress.Progress`` of the loading.
    """
    # The keywords named as ModelChoice's fields are the command line's model options,
    # read and checked as they are there (options/model.py).
    choice = ModelChoice.of(locals())
    mode = drafter_mode(drafter, LOAD)
    chosen = {} if calibrate is None else {"calibrate": calibrate}
    options = choice.options(
        mode,
        spelling=LOAD,
        stores=(stores,) if isinstance(stores, str) else stores,
        history=history,
        show_download_progress=False,
        # What was learned is restored (a warm start); without learn, this script's answers
        # add nothing to it.
        save_learning=learn,
        **PromptCacheChoice(_size_text(prompt_cache_size), not prompt_cache).fields(
            (MEMORY, DISK), LOAD
        ),
        **chosen,
    )
    warnings: list[str] = []

    def told(progress: Progress) -> None:
        if progress.kind is ProgressKind.WARNING:
            warnings.append(progress.text)
        if on_progress is not None:
            on_progress(progress)

    # A callback of its own also keeps downloads from drawing progress bars on the terminal.
    session = open_session(options, on_progress=told)
    return Speculator(session, mode, warnings)
