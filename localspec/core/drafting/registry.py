"""The drafters there are, and which modes draft with them.

``build_drafters(params, resources)`` builds, in registry order, every drafter the mode
``params.drafter`` drafts with, but those ``params.left_out`` names, that can be built from
``resources`` (a draft model's drafter needs a draft model). The order is the order offers
are weighed in (a tie goes to the first). Adding a drafter is one module with a
``build(params, resources)`` function and one line here; the engine and the controller do
not change. Drafters are keyed by their own ``name``: the draft model's drafter is named
``self`` when the draft model was derived from the target (``Resources.draft_name``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from localspec.core.drafting import lookahead, model, ngram, prediction, store
from localspec.core.drafting.base import Drafter, Resources
from localspec.core.params import DrafterMode, GenerationParams

AUTO, MODEL, NGRAM = DrafterMode.AUTO, DrafterMode.MODEL, DrafterMode.NGRAM
SELF, LOOKAHEAD = DrafterMode.SELF, DrafterMode.LOOKAHEAD


@dataclass(frozen=True)
class Registration:
    name: str
    build: Callable[[GenerationParams, Resources], Drafter | None]
    modes: tuple[DrafterMode, ...]  # the modes that draft with it
    uses_draft_model: bool = False  # built only where a draft model is loaded


REGISTRY = (
    Registration(ngram.NAME, ngram.build, (AUTO, NGRAM)),
    Registration(prediction.NAME, prediction.build, (AUTO,)),
    Registration(store.NAME, store.build, (AUTO,)),
    Registration(model.NAME, model.build, (AUTO, MODEL, SELF), uses_draft_model=True),
    Registration(lookahead.NAME, lookahead.build, (AUTO, LOOKAHEAD)),
)


def build_drafters(
    params: GenerationParams, resources: Resources, *, draft_model_only: bool = False
) -> dict[str, Drafter]:
    """``draft_model_only``: just the drafters that draft with the draft model (for a draft
    model that was loaded after the others were built)."""
    drafters: dict[str, Drafter] = {}
    resources = replace(resources, policy=params.drafter.policy)  # one policy for them all
    for entry in REGISTRY:
        if draft_model_only and not entry.uses_draft_model:
            continue
        if params.drafter in entry.modes and entry.name not in params.left_out:
            drafter = entry.build(params, resources)
            if drafter is not None:
                drafters[drafter.name] = drafter  # the draft model's may be "self"
    return drafters


def drafter_names() -> tuple[str, ...]:
    return tuple(entry.name for entry in REGISTRY)
