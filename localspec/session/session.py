"""A loaded target/draft pair, ready to complete text or hold a chat (``Session``; built by
``open.open_session``).

``Session.complete`` and ``Session.chat`` turn text or messages into tokens (the target's
chat template, or raw: ``prompts.Prompts``) and return the engine's event stream;
``Session.infill_tokens`` builds a fill-in-the-middle prompt from the target's FIM tokens.
``Session.generate`` runs a request's preflight (``core.preflight``) as it is asked:
a request the pair cannot run raises its typed error before the first event.
The models' KV caches persist across calls, so a chat turn evaluates only the tokens that
are new.

Around the engine's stream the session keeps what lasts: what the ``auto`` controller learns
about acceptance is saved per pair after every generation with the pair's limits
(``learn_with``; ``storage.learning``), so the next session starts warm; ``auto`` drafts
from the attached datastores and the history of answers, and each finished answer is added
to that history unless that is off (``Session.answers``: the setting is read at each
answer, and the history drafted from is what it holds then). What goes wrong there without
stopping the answer (a history that cannot be read or written, learned state that cannot be
saved) is an ``EngineWarning`` among the answer's events, each once in a session: warnings
travel to every front end that one way, as the engine's own do. A calibration that live
timings show to be far off is dropped at ``close``, so the next session measures again.

A server keeps its clients apart with ``forget_context`` (both models' caches emptied, so
no prompt's prefix is reused for another client) and ``restart_learning`` (the drafters as
they were restored at start), and gives each client its own ``answers`` (``own_answers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localspec.backend.lanes import Turn
from localspec.backend.llama import LlamaLane, LlamaModel
from localspec.backend.rpc import RpcLink
from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder
from localspec.core.events import EngineWarning, Event, Finished, PrefillDone
from localspec.core.params import GenerationParams, Policy
from localspec.core.planner import planner_key
from localspec.core.preflight import PairFacts, check_request
from localspec.machine.placement import Placement
from localspec.session.loading import DraftSlot, LaneSlot
from localspec.session.pair import SELF_DRAFT
from localspec.session.prompt_state import PromptState
from localspec.session.prompts import Prompts
from localspec.session.tools import NONE, Tools, answer_grammar, takes_tools, tool_call_token
from localspec.storage.answers import KeptAnswers, earlier_answer, kept_document
from localspec.storage.learning import LearningStore

# A prefill of fewer tokens is too short to time a token's evaluation by.
MEASURED_PREFILL = 16


class Session:
    def __init__(
        self,
        target: LlamaLane,
        draft: LlamaLane | None,
        costs: CostProfile | None,
        costs_file: Path | None = None,
        learning: tuple[LearningStore, str] | None = None,
        rpc: RpcLink | None = None,
        placement: Placement | None = None,
        slot: DraftSlot | LaneSlot | None = None,
        *,
        derived: bool = False,
        restored: dict | None = None,
        prompt_state: PromptState | None = None,
        answers: list[KeptAnswers] | None = None,
        stores: list[tuple[str, Any]] | None = None,
    ) -> None:
        """``draft``: a loaded draft model; or ``slot``: the pair's draft model, loaded at
        once, in the background or when needed (session/loading.py). ``derived``: that draft
        model was derived from the target's own layers (``--draft self``): its drafts are
        labelled as the target's own, and the ``self`` drafter drafts with it. ``restored``:
        what ``auto`` learned in earlier sessions, to start from; ``learning``: where what
        it learns is saved (None: nowhere). ``prompt_state``: the prompt cache this session
        restores prompts from and keeps its answers in (session/prompt_state.py); None keeps
        none. ``answers``: the histories answers are kept in and drafted from; ``stores``:
        the datastores auto drafts from (``(name, TokenIndex)`` pairs)."""
        self.target = target
        self.rpc = rpc  # the workers the target runs on, if any
        self.placement = placement  # where each model runs, and why
        self.closed = False
        self.costs_file = costs_file
        self.slot = slot
        self._draft = draft
        self.costs = costs
        if slot is not None and slot.model is not None:
            draft = slot.model
        pending = slot if slot is not None and draft is None else None
        self.derived = derived and (draft is not None or slot is not None)
        self.store_corpora = list(stores or [])  # the datastores auto may draft from
        self.corpora = list(self.store_corpora)  # what the next answer drafts from
        # A lane of several is timed by its own work, and lets the others have their round
        # after each of its own (backend/lanes.py).
        self.decoder = SpecDecoder(
            target, draft, costs, pending_draft=pending, corpora=lambda: self.corpora,
            draft_name=SELF_DRAFT if self.derived else "model", restored=restored,
            clock=target.clock.now if target.scheduled else None, round_ended=target.pass_on,
        )  # fmt: skip
        self._restored = restored
        self.prompt_state = prompt_state
        self.lane_of: Session | None = None  # the session whose pair a lane's session shares
        self.learning = learning  # where the auto controller's evidence is kept, and its key
        self._said: set[str] = set()  # the warnings said: each once in a session
        self.n_ctx = target.n_ctx
        self.prompts = Prompts(target)
        self.target_label = self.prompts.label
        described = draft.description() if slot is None and draft is not None else None
        self.draft_label: str | None = slot.label if slot is not None else described
        # Where greedy verification picks the target's tokens: "device" (llama.cpp's
        # backend sampler; only token ids come back) or "host" (from logits rows).
        self.verification: str = target.greedy_where
        # The files of the pair, as resolved: a saved chat names them to be continued with
        # them (the draft's even where it was not loaded: it is the pair's).
        self.target_path: Path | None = target.path
        draft_file = draft.path if draft is not None else None
        self.draft_path: Path | None = slot.path if slot is not None else draft_file
        self.fim = self.prompts.fim
        # The histories answers are kept in and drafted from (storage/answers.py).
        self.answers = list(answers or [])
        self._stores_on = True
        self._lanes: list[Session] = [self]  # a pair of several lanes: a session each
        if isinstance(target, LlamaModel):
            self._lanes += [self._lane(target, i) for i in range(1, target.lanes)]

    # -- the draft model --------------------------------------------------------------------

    @property
    def draft(self) -> LlamaLane | None:
        """The draft model if it is loaded now (it may load later: ``has_draft``)."""
        return self.slot.model if self.slot is not None else self._draft

    @property
    def has_draft(self) -> bool:
        """Whether the pair has a draft model, loaded or not: a drafter that needs it then
        waits for its load."""
        return self.slot is not None or self._draft is not None

    @property
    def facts(self) -> PairFacts:
        """What the preflight of a request needs to know of this pair."""
        return PairFacts(self.n_ctx, self.has_draft, self.derived)

    @property
    def draft_summary(self) -> str | None:
        """One line on the draft model: loaded, loading or left unloaded, and why."""
        return self.slot.summary() if self.slot is not None else None

    def draft_status(self) -> dict[str, Any] | None:
        """What became of the draft model and why (``--json``); None without one."""
        return self.slot.to_dict() if self.slot is not None else None

    # -- datastores -------------------------------------------------------------------------

    def use_stores(self, on: bool) -> None:
        """Draft from the attached datastores and the history, or from none (``bench``'s
        auto without them); its lanes' sessions the same."""
        for lane in self._lanes:
            lane._stores_on = on
            lane.corpora = list(lane.store_corpora) if on else []

    def _refresh_corpora(self) -> list[str]:
        """The corpora of the answer about to begin: the stores, and the history as it is
        now (off, emptied, or grown since the last answer). Returns what went wrong."""
        corpora = list(self.store_corpora) if self._stores_on else []
        problems: list[str] = []
        for answers in self.answers if self._stores_on else []:
            found, warnings = answers.corpora()
            corpora += found
            problems += warnings
        self.corpora = corpora
        return problems

    def _warnings(self, problems: list[str]) -> Iterator[EngineWarning]:
        """Each problem not said before in this session, as an event: a server answers
        one request after another, a chat one turn after another."""
        for problem in dict.fromkeys(problems):
            if problem not in self._said:
                self._said.add(problem)
                yield EngineWarning(problem)

    # -- lanes (backend/lanes.py) -----------------------------------------------------------

    def lanes(self) -> list[Session]:
        """A session for each lane of the pair (this one is lane 0), each with its own cached
        tokens, drafters and learning over the same loaded models; the datastores, the
        learning store and the limits learned with are this one's. Closing a lane's session
        frees nothing: this one frees the pair. They are built with this one."""
        return list(self._lanes)

    def _lane(self, target: LlamaModel, i: int) -> Session:
        slot = LaneSlot(self.slot, i) if isinstance(self.slot, DraftSlot) else None
        draft = self._draft.lane(i) if isinstance(self._draft, LlamaModel) else None
        lane = Session(
            target.lane(i), draft, self.costs, None, self.learning,
            placement=self.placement, slot=slot, derived=self.derived, restored=self._restored,
            prompt_state=dataclasses.replace(self.prompt_state) if self.prompt_state else None,
            # The same datastores and histories (a server's clients: their own).
            stores=self.store_corpora, answers=self.answers,
        )  # fmt: skip
        lane.lane_of = self
        lane.decoder.planners.home = self.decoder.planners.home
        return lane

    @contextlib.contextmanager
    def turn(
        self, *, first: bool = False, client: str = "", gather: bool = False
    ) -> Iterator[Turn]:
        """Hold this lane's turn among the pair's lanes (backend/lanes.py) while a request
        of ``client`` runs on it (``first``: an interactive one; ``gather``: its rounds may
        be evaluated with the other lanes'); its engine passes it on after every round."""
        with self.target.turn(first=first, client=client, gather=gather) as held:
            yield held

    # -- clients of a server ----------------------------------------------------------------

    def forget_context(self, client: str | None = None) -> None:
        """Empty both models' caches: the next prompt is evaluated whole, or restored from
        what ``client`` (a server's client; None: the same owner) saved before. What they
        held is kept in the prompt cache's memory first, for its own client."""
        if self.prompt_state is not None:
            self.prompt_state.stash(self.target, self.draft)
            if client is not None:
                self.prompt_state.owner = client
        self.target.reset()
        draft = self.draft
        if draft is not None:
            draft.reset()

    def own_answers(self, own: list[KeptAnswers]) -> None:
        """The histories of the client about to be served: those every client shares, and
        ``own`` (its own, in place of the last client's)."""
        self.answers = [answers for answers in self.answers if not answers.client] + own

    def restart_learning(self) -> None:
        """The drafters and controllers as this session restored them at start: nothing
        learned from the answers since carries on."""
        self.decoder.forget_learning(keep_restored=True)

    # -- prompts (session/prompts.py) -------------------------------------------------------

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        parse_special: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        return self.prompts.chat_tokens(messages, parse_special=parse_special, tools=tools)

    def plain_tokens(self, text: str) -> list[int]:
        return self.prompts.plain_tokens(text)

    def text_tokens(
        self, text: str, *, raw: bool, parse_special: bool = False, system: str | None = None
    ) -> list[int]:
        return self.prompts.text_tokens(text, raw=raw, parse_special=parse_special, system=system)

    def infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        return self.prompts.infill_tokens(prefix, suffix)

    def preflight(self, tokens: list[int], params: GenerationParams) -> None:
        """Refuse what ``generate`` would refuse for these tokens (``core.preflight``),
        running nothing: a server checks every prompt of a request before the first runs."""
        check_request(self.facts, tokens, params)

    def count_chat_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(self.chat_tokens(messages))

    # -- generation -----------------------------------------------------------------------

    def generate(
        self,
        tokens: list[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        *,
        grammar: str | None = None,
        tools: Tools | None = None,
    ) -> Iterator[Event]:
        """``grammar``: GBNF the answer must match (``session.constraints`` checked it),
        compiled here for the target's vocabulary. ``tools``: the answer's tool calls must
        match the functions offered (``session.tools``; lazily, from the model's tool-call
        token on, when the choice is ``auto``)."""
        # Checked now, before the first event: a front end can offer to trim a conversation
        # that does not fit. A draft model still loading is waited for here when the drafter
        # needs it, so that a failed load is raised here too.
        check_request(self.facts, tokens, params)
        matcher = answer_grammar(self.target, self.prompts, grammar, tools)
        if params.drafter.needs_draft_model:
            self.decoder.join_draft(wait=True)
        problems = self._refresh_corpora()
        if params.drafter.policy is Policy.PRICED and not params.prediction:
            earlier = earlier_answer(self.corpora, tokens, params.max_tokens)
            if earlier:
                params = params.model_copy(update={"prediction": earlier})
        restored = None
        if self.prompt_state is not None:
            slot = self.slot if isinstance(self.slot, DraftSlot) and not self.slot.settled else None
            restored = self.prompt_state.restore(self.target, self.draft, tokens, problems, slot)
        events = self.decoder.generate(tokens, params, cancel, restored=restored, grammar=matcher)
        if self.prompt_state is not None:
            events = self._keeping_prompt(events, self.prompt_state)
        if problems:
            events = self._warned(events, problems)
        if any(answers.keep for answers in self.answers):
            events = self._recording(events, tokens)
        if self.learning is None or not params.drafter.learns:
            return events
        return self._saving_learning(events, params)

    def takes_tools(self) -> bool:
        """Whether the target's chat template takes tools (``tool_call_token``)."""
        return takes_tools(self.target, self.prompts)

    def tool_call_token(self) -> int:
        """The token that opens a tool call in the target's chat template (session/tools.py)."""
        return tool_call_token(self.target, self.prompts)

    def _keeping_prompt(self, events: Iterator[Event], state: PromptState) -> Iterator[Event]:
        """Pass the events through; as the answer finishes (before ``Finished`` is handed
        on: a consumer may stop reading there), keep the models' state in the prompt cache,
        at the prefill rate this answer measured."""
        prefill_s = 0.0
        for event in events:
            if isinstance(event, PrefillDone) and event.evaluated_tokens >= MEASURED_PREFILL:
                restore_s = event.restored.seconds if event.restored is not None else 0.0
                prefill_s = max(0.0, event.seconds - restore_s) / event.evaluated_tokens
            elif isinstance(event, Finished):
                problem = state.keep(self.target, self.draft, prefill_s)
                yield from self._warnings([problem] if problem else [])
            yield event

    def _warned(self, events: Iterator[Event], problems: list[str]) -> Iterator[Event]:
        """The events, the problems met as the answer began said after its first
        (``PrefillDone``)."""
        for index, event in enumerate(events):
            yield event
            if index == 0:
                yield from self._warnings(problems)

    def _recording(self, events: Iterator[Event], tokens: list[int]) -> Iterator[Event]:
        """Pass the events through; add a finished answer to the history store (before
        ``Finished`` is handed on). A cancelled answer is not kept."""
        for event in events:
            document = kept_document(tokens, event) if isinstance(event, Finished) else None
            if document is not None:
                for answers in self.answers:
                    yield from self._warnings(answers.record(document))
            yield event

    def _saving_learning(
        self, events: Iterator[Event], params: GenerationParams
    ) -> Iterator[Event]:
        """Pass the events through; as the generation finishes, save what auto learned
        (before ``Finished`` is handed on: a consumer may stop reading there), if these are
        the limits the pair learns with (``learn_with``)."""
        assert self.learning is not None
        store, key = self.learning
        for event in events:
            if isinstance(event, Finished) and self.decoder.planners.is_home(params):
                problem = store.save(key, self.decoder.learned(params))
                # Said once, however many answers fail to save it.
                yield from self._warnings([problem] if problem else [])
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
        grammar: str | None = None,
    ) -> Iterator[Event]:
        tokens = self.text_tokens(text, raw=raw, parse_special=parse_special, system=system)
        return self.generate(tokens, params, cancel, grammar=grammar)

    def chat(
        self,
        messages: list[dict[str, str]],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        *,
        grammar: str | None = None,
        tools: Tools | None = None,
    ) -> Iterator[Event]:
        """``tools``: the functions offered, shown to the model through its template."""
        if tools is not None and tools.choice != NONE:
            self.tool_call_token()  # refused before the template renders them
        shown = tools.shown if tools is not None else None
        tokens = self.chat_tokens(messages, tools=shown or None)
        return self.generate(tokens, params, cancel, grammar=grammar, tools=tools)

    def learn_with(self, params: GenerationParams) -> None:
        """What ``auto`` learns is saved for the pair from generations with ``params``'
        limits only (a server's defaults): one with limits of its own (a request's
        ``speculative`` settings) learns apart and is not saved. Until this is called, the
        first generation's limits are the pair's."""
        self.decoder.planners.home = planner_key(params)

    def forget_learning(self) -> None:
        """The next generation starts cold: no acceptance learned in this process or saved
        by earlier ones (what ``bench --cold`` measures)."""
        self.decoder.forget_learning()

    def plain_tokens_per_s(self) -> float | None:
        return 1.0 / self.costs.plain_s if self.costs else None

    def forget_stale_costs(self) -> None:
        """Drop the cached calibration when live plain steps ran far from it, so the next
        session measures again (the live correction already served this one). Not after
        rounds shared with other lanes: their steps' times were shares of joint batches."""
        if self.costs_file is None or self.target.scheduled:
            return
        for controller in self.decoder.controllers():
            drift = controller.costs.plain_drift()
            if drift is not None and not 0.67 < drift < 1.5:
                self.costs_file.unlink(missing_ok=True)
                return

    def close(self, *, free: bool = True) -> None:
        """End the session: a draft model still loading is stopped, and the models are
        freed unless ``free`` is false (a process about to end leaves them to the system)."""
        if self.closed:
            return
        self.closed = True
        if self.lane_of is not None:
            return  # lane 0's session frees the pair
        self.forget_stale_costs()
        if self.rpc is not None and self.rpc.lost:
            return  # freeing a target whose workers are gone would wait on them forever
        if free:
            self.target.close()
        if self.slot is not None:
            self.slot.close(free=free)
        elif self._draft is not None and free:
            self._draft.close()
        if self.rpc is not None:
            self.rpc.close()
