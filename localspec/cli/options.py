"""The options several commands share, declared once as option groups (``cli.groups``).

- ``PairChoice``: which target and draft, and where they run (``doctor``);
- ``ModelChoice``: that, plus the RPC workers and ``--exact`` (every command that loads the
  pair); ``options(...)`` checks the values and returns the ``ModelOptions``;
- ``StoreChoice``: the datastores to draft from (``complete``, ``chat``);
- ``SamplingChoice`` and ``DraftingChoice``: how tokens are sampled and drafted;
  ``SamplingChoice.params(...)`` checks them and returns the ``GenerationParams``.

Bad values are ``UsageError``s worded by ``session.options``, as for the Python API.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from localspec.backend.rpc import DEFAULT_TIMEOUT as DEFAULT_RPC_TIMEOUT
from localspec.backend.rpc import parse_endpoints
from localspec.core.params import DrafterMode, GenerationParams
from localspec.errors import UsageError
from localspec.session.options import (
    build_params,
    command_line,
    model_options,
    pair_options,
    parse_shares,
)
from localspec.session.pair import ModelOptions
from localspec.session.placement import parse_layers

TargetOpt = Annotated[str | None, typer.Option(help="target: path, catalog name or repo:file")]
DraftOpt = Annotated[
    str | None,
    typer.Option(
        help="draft: path, catalog name or repo:file; self: derived from the target's layers"
    ),
]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU threads (default: all cores)")]
CtxOpt = Annotated[int, typer.Option(help="context size in tokens")]
GpuLayersOpt = Annotated[
    str | None,
    typer.Option(
        metavar="auto|all|N",
        help="target layers on the GPU (or on the --rpc workers): auto (default) puts all "
        "of them there when this build can offload and they fit, else runs on the CPU; "
        "all, 0 (the CPU) or a number of layers",
    ),
]
DraftGpuLayersOpt = Annotated[
    str | None,
    typer.Option(
        metavar="auto|all|N",
        help="draft layers on the GPU: auto (default) follows --gpu-layers in the memory "
        "the target leaves; 0 keeps the draft on the CPU",
    ),
]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="run the target's layers on llama.cpp RPC workers (localspec worker on each "
        "machine); the draft stays on this one",
    ),
]
RpcTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--rpc-timeout",
        help="seconds one target evaluation may wait on the RPC workers before the answer "
        "ends with an error",
    ),
]
RpcSplitOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc-split",
        metavar="N,N,...",
        help="share of the target's layers per --rpc worker, e.g. 3,1 (default: by each "
        "worker's free memory)",
    ),
]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="greedy output identical to plain decoding's, token for token, whatever the "
        "drafter (batch-invariant kernels; slower)",
    ),
]
TemperatureOpt = Annotated[float, typer.Option(help="0 is greedy")]
DrafterOpt = Annotated[
    DrafterMode,
    typer.Option(
        help="auto (cost model), model, ngram, self (a draft of the target's own layers), "
        "lookahead (the target's own guesses; exact when sampling), or none (plain decoding)"
    ),
]


@dataclass(frozen=True)
class PairChoice:
    """Which target and draft, and where their layers run."""

    target: TargetOpt = None
    draft: DraftOpt = None
    threads: ThreadsOpt = None
    ctx: CtxOpt = 4096
    gpu_layers: GpuLayersOpt = None
    draft_gpu_layers: DraftGpuLayersOpt = None

    def options(
        self, drafter: DrafterMode | None = None, *, command: str = "complete", **fields: Any
    ) -> ModelOptions:
        """The checked ``ModelOptions``, ``fields`` (``stores``, ``recalibrate``...) added.
        With a ``drafter``, whether the draft is loaded and the costs measured follow from
        it (``session.options.model_options``) unless ``fields`` set them. A bad value is a
        ``UsageError`` whose hint points at ``command``'s help."""
        spelling = command_line(command)
        values = {**self._values(), **fields}
        if drafter is not None:
            return model_options(drafter, spelling=spelling, **values)
        return pair_options(spelling=spelling, **values)

    def _values(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "draft": self.draft,
            "threads": self.threads,
            "n_ctx": self.ctx,
            "n_gpu_layers": parse_layers(self.gpu_layers),
            "draft_gpu_layers": parse_layers(self.draft_gpu_layers, "--draft-gpu-layers"),
        }


@dataclass(frozen=True)
class ModelChoice(PairChoice):
    """The pair and where it runs, on this machine or on RPC workers, and its kernels."""

    rpc: RpcOpt = None
    rpc_timeout: RpcTimeoutOpt = DEFAULT_RPC_TIMEOUT
    rpc_split: RpcSplitOpt = None
    exact: ExactOpt = False

    @classmethod
    def of(cls, source: Any) -> ModelChoice:
        """The choice held by an object with one attribute per option (a command's values)."""
        return cls(**{field.name: getattr(source, field.name) for field in dataclasses.fields(cls)})

    def _values(self) -> dict[str, Any]:
        return {
            **super()._values(),
            "exact": self.exact,
            "rpc": tuple(map(str, parse_endpoints(self.rpc))) if self.rpc else (),
            "rpc_timeout": self.rpc_timeout,
            "rpc_split": parse_shares(self.rpc_split),
        }


@dataclass(frozen=True)
class StoreChoice:
    """The datastores to draft from, and whether answers join the history store."""

    store: Annotated[
        list[str] | None,
        typer.Option(
            "--store",
            metavar="NAME",
            help="draft from this datastore (repeatable; default: every store built with the "
            "target's tokenizer, the history of answers included)",
        ),
    ] = None
    no_store: Annotated[bool, typer.Option("--no-store", help="draft from no datastore")] = False
    no_history: Annotated[
        bool, typer.Option("--no-history", help="do not add answers to the history store")
    ] = False

    def fields(self) -> dict[str, Any]:
        """The ``ModelOptions`` fields they set: ``stores`` and ``history``."""
        if self.store and self.no_store:
            raise UsageError("--store and --no-store contradict each other", "give one of them")
        stores = () if self.no_store else (tuple(self.store) if self.store else None)
        return {"stores": stores, "history": not self.no_history}


@dataclass(frozen=True)
class DraftingChoice:
    """Which drafter, and how long and how branched its drafts may be."""

    drafter: DrafterOpt = DrafterMode.AUTO
    draft_max: Annotated[int, typer.Option(help="longest draft per round")] = 16
    no_trees: Annotated[
        bool,
        typer.Option(
            "--no-trees",
            help="verify single draft chains only (auto otherwise verifies competing drafts "
            "as one draft tree when that is expected to pay; greedy decoding only)",
        ),
    ] = False


@dataclass(frozen=True)
class SamplingChoice:
    """How the next token is chosen (greedy unless ``temperature`` is above 0)."""

    temperature: TemperatureOpt = 0.0
    top_k: Annotated[int, typer.Option(help="sampling: keep the k most likely (0: off)")] = 40
    top_p: Annotated[float, typer.Option(help="sampling: nucleus mass (1: off)")] = 0.95
    min_p: Annotated[float, typer.Option(help="sampling: drop below min-p x top (0: off)")] = 0.05
    seed: Annotated[int | None, typer.Option(help="sampling seed")] = None

    def params(self, drafting: DraftingChoice, **fields: Any) -> GenerationParams:
        """The checked ``GenerationParams`` of these and ``drafting``'s values, with
        ``fields`` (``max_tokens``, ``trace``...)."""
        return build_params(
            **dataclasses.asdict(self),
            drafter=drafting.drafter,
            draft_max=drafting.draft_max,
            trees=not drafting.no_trees,
            **fields,
        )
