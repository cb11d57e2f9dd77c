"""A loaded target/draft pair, ready to complete text or hold a chat.

``open_session(options, on_progress)`` resolves the model references (paths, catalog names,
Hub references; the default pair when none is given), loads both models with the same
context size, checks that the draft's vocabulary fits the target's (llama.cpp's rules),
and measures this machine's costs for the controller once per pair (cached on disk). What
the ``auto`` controller learns about acceptance is saved per pair after every generation and
restored by the next session (``learning.LearningStore``), so a second ``localspec complete``
starts warm; a damaged or foreign state file is ignored with a warning. ``auto`` also drafts
from the user's datastores built with the target's tokenizer (``ModelOptions.stores``), and
each finished answer is added to the history of answers unless that is off
(``Session.answers``: the setting is read at each answer, and the history drafted from is
what it holds then); a damaged store is left out with a warning.

A server keeps its clients apart with ``forget_context`` (both models' caches emptied, so
no prompt's prefix is reused for another client) and ``restart_learning`` (the drafters as
they were restored at start), and gives each client its own ``answers``.

``Session.complete`` and ``Session.chat`` turn text or messages into tokens (the target's
chat template, or raw) and return the engine's event stream; ``Session.infill_tokens``
builds a fill-in-the-middle prompt from the target's FIM tokens. The models' KV caches persist
across calls, so a chat turn evaluates only the tokens that are new.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from localspec.backend.compat import check_vocabularies
from localspec.backend.devices import gpu_devices, gpu_hardware
from localspec.backend.llama import LlamaModel, LoadOptions, exact_kernels
from localspec.backend.rpc import DEFAULT_TIMEOUT, RpcLink, attach, parse_endpoints
from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder
from localspec.core.events import Event, Finished, FinishReason
from localspec.core.params import GenerationParams
from localspec.errors import (
    EXIT_FAILURE,
    ContextOverflowError,
    IncompatibleModelsError,
    InputError,
    UnsupportedByModelError,
    UsageError,
)
from localspec.models.resources import footprint
from localspec.progress import OnProgress, ProgressKind, tell
from localspec.session.answers import KeptAnswers
from localspec.session.calibrate import (
    DRAFT_SIZES,
    CostCache,
    fastest_of,
    file_identity,
    looks_disturbed,
    machine_key,
    measure_costs,
)
from localspec.session.chat_template import render_chat
from localspec.session.learning import LearningStore
from localspec.session.library import HISTORY, Library, vocabulary_fingerprint
from localspec.session.placement import ALL, ModelPlace, Placement, place
from localspec.session.store import STATE_ERRORS

HISTORY_MIN_TOKENS = 16  # shorter answers are not worth keeping
HISTORY_PROMPT_TOKENS = 64  # of the prompt, kept before each answer in the history

CALIBRATION_TEXT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nfor i in range(10):\n    print(i, fibonacci(i))\n"
)


class ModelOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str | None = None  # path, catalog name or repo_id:filename; None = default
    # A path, catalog name or repo_id:filename; "self" (SELF_DRAFT): a draft derived from the
    # target's own layers (localspec models derive-draft), derived on first use and cached.
    draft: str | None = None
    use_draft: bool = True  # False skips loading the draft model (drafter none / ngram)
    threads: int | None = Field(None, ge=1)
    n_ctx: int = Field(4096, ge=64)
    # The target's layers on the GPU: None is auto (all where they fit, see
    # session/placement.py; with rpc, all on the workers), -1 all, n that many.
    n_gpu_layers: int | None = Field(None, ge=-1)
    # The draft's: None follows the target's policy in the room it leaves; with rpc the
    # draft stays on this machine's CPU.
    draft_gpu_layers: int | None = Field(None, ge=-1)
    flash_attn: bool = True
    # llama.cpp RPC workers ("host:port") that run the target's offloaded layers; the draft
    # stays on this machine's CPU. An evaluation waiting longer than rpc_timeout is a loss.
    rpc: tuple[str, ...] = ()
    rpc_timeout: float = Field(DEFAULT_TIMEOUT, gt=0)
    rpc_split: tuple[float, ...] = ()  # share of the layers per worker; () by their memory
    # Batch-invariant target kernels: greedy output identical to plain decoding's, token
    # for token, whatever was drafted (slower; see backend.llama.exact_kernels).
    exact: bool = False
    calibrate: bool = True  # measure (or load cached) step costs for the controller
    recalibrate: bool = False  # measure even when a cached profile exists
    learn: bool = True  # restore and save what auto learned, per pair (with calibrate)
    # Datastores auto drafts from: None, every store built with the target's tokenizer
    # (the history of answers included); (), none; else those names ("history" included).
    stores: tuple[str, ...] | None = None
    history: bool = True  # add each finished answer to the history store (if it is on)
    show_download_progress: bool = True


LostHandler = Callable[[str], None]


def exit_on_lost(message: str) -> None:
    """The default answer to lost RPC workers: the evaluation waiting on them never returns,
    so say why and end the process (what was streamed stays written)."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n  hint: check the worker, then run again\n")
    sys.stderr.flush()
    os._exit(EXIT_FAILURE)


class Session:
    def __init__(
        self,
        target: LlamaModel,
        draft: LlamaModel | None,
        costs: CostProfile | None,
        costs_file: Path | None = None,
        learning: tuple[LearningStore, str] | None = None,
        rpc: RpcLink | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.target = target
        self.rpc = rpc  # the workers the target runs on, if any
        self.placement = placement  # where each model runs, and why
        self.closed = False
        self.costs_file = costs_file
        self.draft = draft
        self.costs = costs
        self.decoder = SpecDecoder(target, draft, costs)
        self.learning = learning  # where the auto controller's evidence is kept, and its key
        self.warnings: list[str] = []
        self.n_ctx = target.n_ctx
        self.target_label = target.description()
        self.draft_label = draft.description() if draft is not None else None
        # The files loaded, as resolved: a saved chat names them to be continued with them.
        self.target_path: Path | None = target.path
        self.draft_path: Path | None = draft.path if draft is not None else None
        self._template = target.chat_template()
        self._bos = (
            target.token_text(target.vocab_info().bos) if target.vocab_info().add_bos else ""
        )
        self.fim = target.fim_tokens()
        self.store_corpora: list[tuple[str, Any]] = []  # the datastores auto may draft from
        # The histories answers are kept in and drafted from (session/answers.py).
        self.answers: list[KeptAnswers] = []
        self._stores_on = True

    # -- datastores -------------------------------------------------------------------------

    def attach_stores(self, corpora: list[tuple[str, Any]]) -> None:
        """Let auto draft from these datastores (``(name, TokenIndex)`` pairs)."""
        self.store_corpora = list(corpora)
        self.use_stores(True)

    def use_stores(self, on: bool) -> None:
        """Draft from the attached datastores and the history, or from none (``bench``'s
        auto without them)."""
        self._stores_on = on
        self.decoder.corpora = self.store_corpora if on else []

    def _refresh_corpora(self) -> None:
        """The corpora of the answer about to begin: the stores, and the history as it is
        now (off, emptied, or grown since the last answer)."""
        corpora = list(self.store_corpora) if self._stores_on else []
        for answers in self.answers if self._stores_on else []:
            found, warnings = answers.corpora()
            corpora += found
            self._warn(warnings)
        self.decoder.corpora = corpora

    def _warn(self, warnings: list[str]) -> None:
        """Keep each distinct warning once: a server asks for an answer after another."""
        self.warnings += [w for w in dict.fromkeys(warnings) if w not in self.warnings]

    # -- clients of a server ----------------------------------------------------------------

    def forget_context(self) -> None:
        """Empty both models' caches: the next prompt is evaluated whole."""
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def restart_learning(self) -> None:
        """The drafters and controllers as this session restored them at start: nothing
        learned from the answers since carries on."""
        restored = self.decoder.restored
        self.decoder.forget_learning()
        self.decoder.restored = restored

    # -- prompts --------------------------------------------------------------------------

    def chat_tokens(
        self, messages: list[dict[str, str]], *, parse_special: bool = False
    ) -> list[int]:
        """The conversation through the chat template. Control tokens are parsed only in the
        template's own text: a message that spells ``<|im_start|>`` stays plain text unless
        ``parse_special`` lets it through."""
        real = self._render(messages)
        if parse_special or not any(self._has_control_text(m["content"]) for m in messages):
            return self._bos_for(real) + self._template_tokens(real)
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        masked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        text = self._render(masked)
        rebuilt = text
        for mark, message in zip(marks, messages, strict=True):
            rebuilt = rebuilt.replace(mark, message["content"])
        if rebuilt != real or any(text.count(mark) != 1 for mark in marks):
            # The template reshapes message text, so it cannot be kept apart from it.
            raise InputError(
                "the text contains control tokens of the model (such as <|im_start|>)",
                "remove them, or pass --parse-special to let them act as control tokens",
            )
        tokens = self._bos_for(text)
        rest = text
        for mark, message in zip(marks, messages, strict=True):
            head, rest = rest.split(mark)
            tokens += self._template_tokens(head)
            tokens += self.target.tokenize(
                message["content"], add_special=False, parse_special=False
            )
        return tokens + self._template_tokens(rest)

    def _has_control_text(self, text: str) -> bool:
        plain = self.target.tokenize(text, add_special=False, parse_special=False)
        return plain != self.target.tokenize(text, add_special=False, parse_special=True)

    def _render(self, messages: list[dict[str, str]]) -> str:
        return render_chat(self._template, messages, bos_token=self._bos)

    def _bos_for(self, text: str) -> list[int]:
        """BOS when the vocabulary adds one and the template did not write it itself."""
        if not self._bos or text.startswith(self._bos):
            return []
        return [self.target.vocab_info().bos]

    def _template_tokens(self, text: str) -> list[int]:
        if not text:
            return []
        return self.target.tokenize(text, add_special=False, parse_special=True)

    def plain_tokens(self, text: str) -> list[int]:
        """``text`` as the target reads it inside an answer: no BOS, control tokens' text
        kept as plain text (a prediction, say)."""
        return self.target.tokenize(text, add_special=False, parse_special=False)

    def text_tokens(
        self, text: str, *, raw: bool, parse_special: bool = False, system: str | None = None
    ) -> list[int]:
        """The prompt's tokens: ``text`` as one user message (after ``system``, if any)
        through the chat template, or as is with ``raw``."""
        if not text.strip():
            raise InputError("the input is empty", "give the prompt on stdin or as a file")
        if raw:
            if system:
                raise UsageError(
                    "a system prompt needs the chat template", "drop --raw or --system"
                )
            return self.target.tokenize(text, add_special=True, parse_special=parse_special)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        return self.chat_tokens(messages, parse_special=parse_special)

    def infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt, laid out as llama.cpp's server lays out an infill:
        ``[BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID`` (BOS only if the vocabulary adds
        one); the model then writes the middle. Both texts stay plain text: a control
        token's text in them is not parsed. ``UnsupportedByModelError`` when the target's
        vocabulary has no FIM tokens."""
        fim = self.fim
        if not fim.infill:
            raise UnsupportedByModelError(
                f"{self.target_label} has no fill-in-the-middle tokens",
                "use a code model trained for infill (such as Qwen2.5-Coder), or drop the suffix",
            )
        vocab = self.target.vocab_info()
        tokens = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
        tokens.append(fim.pre)
        tokens += self.target.tokenize(prefix, add_special=False, parse_special=False)
        tokens.append(fim.suf)
        tokens += self.target.tokenize(suffix, add_special=False, parse_special=False)
        tokens.append(fim.mid)
        return tokens

    def check_prompt(self, tokens: list[int], params: GenerationParams) -> None:
        """Raise what ``generate`` would for these tokens (a prompt the context cannot hold:
        ``ContextOverflowError``) without running anything."""
        self.decoder.check(tokens, params)

    def count_chat_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self.chat_tokens(messages))

    # -- generation -----------------------------------------------------------------------

    def generate(
        self, tokens: list[int], params: GenerationParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        if params.drafter.needs_draft_model and self.draft is None:
            raise InputError(
                f"--drafter {params.drafter} needs a draft model, and none is loaded",
                "pass --draft REF, or use --drafter ngram",
            )
        self._refresh_corpora()
        if params.drafter.uses_cost_model and not params.prediction:
            earlier = self._earlier_answer(tokens, params.max_tokens)
            if earlier:
                params = params.model_copy(update={"prediction": earlier})
        events = self.decoder.generate(tokens, params, cancel)
        if any(answers.keep for answers in self.answers):
            events = self._recording(events, tokens)
        if self.learning is None or not params.drafter.learns:
            return events
        return self._saving_learning(events, params)

    def _earlier_answer(self, tokens: list[int], max_tokens: int) -> tuple[int, ...]:
        """The answer the history kept for this very prompt (the same last
        ``HISTORY_PROMPT_TOKENS`` tokens: the question asked again), if it drafts from the
        history: the one kept most often (else the longest) is as good a prediction as an
        editor's, drafted from its first token. Empty when there is none."""
        tail = tokens[-HISTORY_PROMPT_TOKENS:]
        for name, corpus in self.decoder.corpora:
            if name != HISTORY:
                continue
            match = corpus.longest_match(tail, n_max=len(tail), n_min=len(tail))
            runs = corpus.continuations(match, max_tokens) if match is not None else []
            if runs:
                return runs[0][0]
        return ()

    def _recording(self, events: Iterator[Event], tokens: list[int]) -> Iterator[Event]:
        """Pass the events through; add a finished answer to the history store (before
        ``Finished`` is handed on). A cancelled answer is not kept."""
        for event in events:
            if (
                isinstance(event, Finished)
                and event.reason != FinishReason.CANCELLED
                and len(event.token_ids) >= HISTORY_MIN_TOKENS
            ):
                # With the end of its prompt (the question and the template's turn header),
                # so that asking again matches at the answer's first token.
                document = [*tokens[-HISTORY_PROMPT_TOKENS:], *event.token_ids]
                for answers in self.answers:
                    self._warn(answers.record(document))
            yield event

    def _saving_learning(
        self, events: Iterator[Event], params: GenerationParams
    ) -> Iterator[Event]:
        """Pass the events through; as the generation finishes, save what auto learned
        (before ``Finished`` is handed on: a consumer may stop reading there)."""
        assert self.learning is not None
        store, key = self.learning
        for event in events:
            if isinstance(event, Finished):
                problem = store.save(key, self.decoder.learned(params))
                if problem:
                    self.warnings.append(problem)
            yield event

    def complete(
        self,
        text: str,
        params: GenerationParams,
        *,
        raw: bool = False,
        parse_special: bool = False,
        cancel: threading.Event | None = None,
        system: str | None = None,
    ) -> Iterator[Event]:
        tokens = self.text_tokens(text, raw=raw, parse_special=parse_special, system=system)
        return self.generate(tokens, params, cancel)

    def chat(
        self,
        messages: list[dict[str, str]],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        tokens = self.chat_tokens(messages)
        # Checked here, before the first event, so a front end can offer to trim history.
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the conversation has {len(tokens)} tokens but the context holds {self.n_ctx}",
                "start a new conversation or drop the oldest turns",
                n_tokens=len(tokens),
                n_ctx=self.n_ctx,
            )
        return self.generate(tokens, params, cancel)

    def forget_learning(self) -> None:
        """The next generation starts cold: no acceptance learned in this process or saved
        by earlier ones (what ``bench --cold`` measures)."""
        self.decoder.forget_learning()

    def plain_tokens_per_s(self) -> float | None:
        return 1.0 / self.costs.plain_s if self.costs else None

    def forget_stale_costs(self) -> None:
        """Drop the cached calibration when live plain steps ran far from it, so the next
        session measures again (the live correction already served this one)."""
        if self.costs_file is None:
            return
        for controller in self.decoder.controllers():
            drift = controller.costs.plain_drift()
            if drift is not None and not 0.67 < drift < 1.5:
                self.costs_file.unlink(missing_ok=True)
                return

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.forget_stale_costs()
        if self.rpc is not None and self.rpc.lost:
            return  # freeing a target whose workers are gone would wait on them forever
        self.target.close()
        if self.draft is not None:
            self.draft.close()
        if self.rpc is not None:
            self.rpc.close()


def resolve_pair(
    options: ModelOptions, on_progress: OnProgress | None = None
) -> tuple[Path, Path | None]:
    from localspec.models.catalog import resolve_model

    # A front end that draws its own screen (no rich bars) gets a fetch's notes and shares.
    shown = True if options.show_download_progress else (on_progress or False)
    tell(on_progress, "locating the target model (fetched on first use, which can take minutes)")
    target = resolve_model(options.target, "target", progress=shown)
    draft = None
    if options.use_draft:
        ref = options.draft if options.draft else _paired_draft(options.target)
        if ref == SELF_DRAFT:
            return target, _self_draft(target, options, on_progress)
        if ref is not NO_DRAFT:
            tell(on_progress, "locating the draft model (fetched on first use)")
            draft = resolve_model(ref, "draft", progress=shown)
    return target, draft


NO_DRAFT = ""  # a target whose model family has no draft: auto drafts by copying alone
SELF_DRAFT = "self"  # --draft self: a draft of the target's own layers


def _self_draft(target: Path, options: ModelOptions, on_progress: OnProgress | None) -> Path:
    """The target's derived draft: cached, or measured and written now (once per target)."""
    from localspec.models.selfdraft import cached_derived, derived_draft

    if cached_derived(target) is None:
        tell(on_progress, "deriving a draft from the target's own layers (once per target; "
             "measures which layers to keep, about two minutes)")  # fmt: skip
    return derived_draft(target, threads=options.threads, on_progress=on_progress).path


def _paired_draft(target: str | None) -> str | None:
    """The draft for a target named without ``--draft``: a catalog target's (or a model
    optimized from one) recommended draft, ``NO_DRAFT`` where its family has none; None
    (the catalog's default draft) for the default target, a file or a Hub reference."""
    from localspec.models.catalog import load_catalog, load_registry, pair_for

    if not target or (load_catalog().get(target) is None and target not in load_registry()):
        return None
    return pair_for(target) or NO_DRAFT


def open_session(
    options: ModelOptions,
    on_progress: OnProgress | None = None,
    on_lost: LostHandler = exit_on_lost,
) -> Session:
    """Load the pair, telling ``on_progress`` each step, wait and warning (``Progress``
    values, see localspec/progress.py). With ``options.rpc``, the target's layers go to
    those workers; ``on_lost`` is called (from another thread) if they fail mid-evaluation,
    which then never returns: see backend/rpc.py."""
    if options.calibrate and options.stores:
        Library().check_exist(options.stores)  # a misspelt --store fails before any load
    target_path, draft_path = resolve_pair(options, on_progress)
    rpc = None
    if options.rpc:
        endpoints = parse_endpoints(list(options.rpc))
        tell(on_progress, f"connecting to RPC workers {', '.join(map(str, endpoints))}")
        rpc = attach(endpoints, options.rpc_timeout, on_lost)
    placement = plan_placement(options, target_path, draft_path)
    for notice in placement.notices:
        tell(on_progress, notice, ProgressKind.WARNING)
    if not rpc and not placement.target.on_gpu:
        memory_warning = _memory_warning(target_path, draft_path, options.n_ctx)
        if memory_warning:  # said before loading, which may be what runs out of memory
            tell(on_progress, memory_warning, ProgressKind.WARNING)
    load = LoadOptions(
        n_ctx=options.n_ctx,
        n_threads=options.threads,
        n_gpu_layers=placement.target.n_gpu_layers,
        flash_attn=options.flash_attn,
    )
    if options.rpc_split:
        if len(options.rpc_split) != len(options.rpc) or min(options.rpc_split) < 0:
            raise UsageError(
                f"--rpc-split gives {len(options.rpc_split)} shares for "
                f"{len(options.rpc)} worker(s)",
                "give one non-negative share per --rpc worker, e.g. --rpc-split 3,1",
            )
        target_load = replace(load, tensor_split=options.rpc_split)
    else:
        target_load = load
    if options.exact:
        exact_kernels()  # process-wide, so before either model evaluates anything
    where = f" onto {len(options.rpc)} RPC worker(s)" if rpc else ""
    if not rpc and placement.target.on_gpu:
        where = f" onto {placement.target.summary()}"
    tell(on_progress, f"loading target {target_path.name}{where}")
    # Only the target needs batch-invariant kernels: what the draft proposes never changes
    # what the target accepts, so the draft keeps the fast ones.
    target = LlamaModel(target_path, replace(target_load, exact=options.exact))
    if rpc is not None:
        rpc.watch(target)
    draft = None
    try:
        if draft_path is not None:
            draft_place = placement.draft
            assert draft_place is not None
            where = f" onto {draft_place.summary()}" if draft_place.on_gpu else ""
            tell(on_progress, f"loading draft {draft_path.name}{where}")
            draft_load = replace(load, n_gpu_layers=draft_place.n_gpu_layers)
            if options.draft == SELF_DRAFT:  # a file localspec wrote: its hint says re-derive
                from localspec.models.selfdraft import load_derived

                draft = load_derived(draft_path, draft_load, str(target_path))
            else:
                draft = LlamaModel(draft_path, draft_load)
            tell(on_progress, "checking that the draft's vocabulary fits the target's")
            report = check_vocabularies(target, draft)
            if not report.compatible:
                raise IncompatibleModelsError(
                    f"draft {draft_path.name} cannot draft for target {target_path.name}: "
                    + report.summary(),
                    "pick a draft of the target's model family (localspec models list), "
                    "or run without one: --drafter ngram",
                )
        costs, costs_file = _costs(
            options, placement, target, draft, target_path, draft_path, on_progress
        )
    except BaseException:
        target.close()
        if draft is not None:
            draft.close()
        raise
    session = Session(target, draft, costs, costs_file, rpc=rpc, placement=placement)
    if draft is not None and options.draft == SELF_DRAFT:
        session.decoder.draft_name = SELF_DRAFT  # its drafts are labelled as the target's own
    if options.calibrate and options.learn:
        _restore_learning(session, target_path, draft_path, on_progress)
    try:
        _open_stores(session, options, on_progress)
    except BaseException:  # a --store that names nothing: the models are not kept loaded
        session.close()
        raise
    return session


def _open_stores(session: Session, options: ModelOptions, on_progress: OnProgress | None) -> None:
    """Attach the datastores auto may draft from, and the history answers are kept in and
    drafted from (whether it is on is read at each answer). The tokenizer's fingerprint is
    computed only when a store or the history needs it."""
    library = Library()
    names = options.stores
    drafting = options.calibrate and names != ()  # calibrate: auto may run
    named_history = names is not None and HISTORY in names
    store_names = None if names is None else tuple(n for n in names if n != HISTORY)
    # Named stores are always opened, so that a name that does not exist is an error.
    stores = drafting and (bool(store_names) or (store_names is None and bool(library.names())))
    history = drafting and (names is None or named_history)
    if not (options.history or history or stores):
        return

    def warn(text: str) -> None:
        tell(on_progress, text, ProgressKind.WARNING)

    fingerprint = vocabulary_fingerprint(session.target, warn)
    session.answers = [
        KeptAnswers(library, fingerprint, keep=options.history, draft=history, named=named_history)
    ]
    if stores:
        opened = library.open(fingerprint, store_names)
        for warning in opened.warnings:
            warn(warning)
        if opened.stores:
            session.attach_stores(opened.stores)


def learning_store() -> LearningStore:
    from localspec.models.paths import cache_root

    return LearningStore(cache_root() / "learning")


def plan_placement(options: ModelOptions, target_path: Path, draft_path: Path | None) -> Placement:
    """Where each model of the pair will run, from the devices this build sees now (see
    session/placement.py). With RPC workers the target goes to them (all its layers unless
    told otherwise) and the draft stays on this machine's CPU: its steps are many and
    small, and a network round trip for each would cost more than the step."""
    target = footprint(target_path, options.n_ctx)
    draft = footprint(draft_path, options.n_ctx) if draft_path is not None else None
    if options.rpc:
        request = ALL if options.n_gpu_layers is None else options.n_gpu_layers
        layers = target.layers if request == ALL else min(request, target.layers)
        return Placement(
            ModelPlace(layers, target.layers, "RPC workers" if layers else "CPU"),
            ModelPlace(0, draft.layers, "CPU") if draft else None,
            "--rpc: the target's layers run on the workers, the draft on this machine",
        )
    return place(
        options.n_gpu_layers, options.draft_gpu_layers, target, draft, gpu_devices(),
        gpu_hardware(),
    )  # fmt: skip


def _restore_learning(
    session: Session, target_path: Path, draft_path: Path | None, on_progress: OnProgress | None
) -> None:
    """Start the auto controller from what earlier sessions learned for this pair, where
    it runs now: the same laptop with and without its GPU keeps two."""
    store = learning_store()
    where = session.placement.key() if session.placement else ()
    key = machine_key(file_identity(target_path), file_identity(draft_path), *where)
    session.learning = (store, key)
    learned, problem = store.load(key)
    if problem:
        tell(on_progress, problem, ProgressKind.WARNING)
    if learned is None:
        return
    try:
        session.decoder.check_learned(learned)
    except STATE_ERRORS as err:  # crafted values: a number too large for a float ...
        tell(on_progress, f"ignoring malformed learned state ({err})", ProgressKind.WARNING)
        return
    session.decoder.restored = learned


def _memory_warning(target: Path, draft: Path | None, n_ctx: int) -> str | None:
    from localspec.models.resources import estimate_memory

    needed, available = estimate_memory(target, draft, n_ctx)
    if available is None or needed <= available:
        return None
    gib = 1024**3
    return (
        f"the models and their KV caches need about {needed / gib:.1f} GiB, "
        f"but only {available / gib:.1f} GiB of memory is available"
    )


def costs_key(
    options: ModelOptions, placement: Placement, target_path: Path, draft_path: Path | None
) -> str:
    """The calibration cache's key for a pair loaded with ``options`` on this machine, its
    models placed as ``placement`` says (a CPU-only placement adds nothing, so costs
    measured before placement existed stay valid)."""
    return machine_key(
        file_identity(target_path),
        file_identity(draft_path),
        options.threads or os.cpu_count(),
        0,  # kept so that CPU profiles measured before placement keep their keys
        options.flash_attn,
        options.n_ctx,
        *(("rpc", *options.rpc, *options.rpc_split) if options.rpc else ()),  # other costs
        *(("exact",) if options.exact else ()),  # other kernels, other costs
        DRAFT_SIZES,  # a cache measured for other draft lengths is measured again
        *placement.key(),
    )


def cached_costs(
    options: ModelOptions, placement: Placement, target_path: Path, draft_path: Path | None
) -> CostProfile | None:
    """What was measured for a pair with ``options``, without loading it; None if nothing."""
    return _cost_cache().load(costs_key(options, placement, target_path, draft_path))


def _cost_cache() -> CostCache:
    from localspec.models.paths import cache_root

    return CostCache(cache_root() / "calibration")


def _costs(
    options: ModelOptions,
    placement: Placement,
    target: LlamaModel,
    draft: LlamaModel | None,
    target_path: Path,
    draft_path: Path | None,
    on_progress: OnProgress | None,
) -> tuple[CostProfile | None, Path | None]:
    if not options.calibrate:
        return None, None
    key = costs_key(options, placement, target_path, draft_path)
    cache = _cost_cache()
    costs, problem = (None, "") if options.recalibrate else cache.load_checked(key)
    if problem:
        tell(on_progress, problem, ProgressKind.WARNING)
    if costs is None:
        tell(
            on_progress,
            "measuring this machine's step costs (once per model pair)",
            ProgressKind.WAIT,
        )
        # A few hundred tokens of context, as in a typical answer: attention cost grows
        # with it, so a near-empty context would flatter every step.
        room = max(8, min(320, target.n_ctx - 80))  # leave room for the k+1 verified tokens
        context = target.tokenize(CALIBRATION_TEXT * 8, add_special=False)[:room]
        costs = measure_costs(target, draft, context)
        if looks_disturbed(costs):
            tell(
                on_progress,
                "the machine looked busy while measuring; measuring again",
                ProgressKind.WAIT,
            )
            costs = fastest_of(costs, measure_costs(target, draft, context))
        # Saved even if still disturbed: live timings correct it, and measuring again in
        # every process would cost far more than a rough start.
        problem = cache.save(key, costs)
        if problem:
            tell(on_progress, problem, ProgressKind.WARNING)
    return costs, cache.path(key)
