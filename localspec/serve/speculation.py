"""A request's ``speculative`` settings, within the server's own limits.

Requests set speculation as llama.cpp's server takes it (``speculative.n_max``, ``n_min``,
``p_min``, as dotted top-level keys or a ``speculative`` object), plus
``speculative.drafter`` (a mode of ``core.params.DrafterMode``). ``speculative_fields``
turns them into ``GenerationParams`` fields over the server's defaults, so that no request
makes a token cost more work than the server's own settings allow:

- ``n_max`` is a whole number from 1 to the defaults' longest copy (``ngram_draft_max``,
  64), else a 400; the draft model's and lookahead's drafts take it up to the defaults'
  ``draft_max`` (the server's ``--draft-max``) and no further;
- ``n_min`` is a whole number of 1 or more, capped at ``n_max`` (as llama.cpp caps it);
- without ``overrides`` (``serve --no-speculative-overrides``) any setting is a 400.

An unknown setting or a value of the wrong kind is a 400 naming it (``speculative.n_min``).
"""

from __future__ import annotations

from typing import Any

from localspec.core.params import DrafterMode, GenerationParams
from localspec.serve.errors import ApiError, is_whole

# speculative.* request fields (llama.cpp's server's names) -> GenerationParams fields
SPECULATIVE_FIELDS = ("n_max", "n_min", "p_min", "drafter")
SPECULATIVE_PARAMS = {
    "draft_max": "speculative.n_max",
    "ngram_draft_max": "speculative.n_max",
    "draft_min": "speculative.n_min",
    "p_min": "speculative.p_min",
    "drafter": "speculative.drafter",
}


def speculative_fields(
    body: dict[str, Any], defaults: GenerationParams, overrides: bool = True
) -> dict[str, Any]:
    """The ``GenerationParams`` fields of a request's ``speculative`` settings (module
    docstring)."""
    settings = _settings(body)
    if settings and not overrides:
        name = f"speculative.{next(iter(settings))}"
        raise ApiError(400, f"{name}: this server takes no speculative settings "
                       "(serve --no-speculative-overrides)", param=name)  # fmt: skip
    fields: dict[str, Any] = {}
    n_max = _whole(settings, "n_max")
    if n_max is not None:
        if n_max > defaults.ngram_draft_max:
            raise ApiError(400, f"speculative.n_max is {n_max}; this server drafts at most "
                           f"{defaults.ngram_draft_max} tokens a round",
                           param="speculative.n_max")  # fmt: skip
        fields["ngram_draft_max"] = n_max
        fields["draft_max"] = min(n_max, defaults.draft_max)
    n_min = _whole(settings, "n_min")
    if n_min is not None:
        fields["draft_min"] = min(n_min, fields.get("ngram_draft_max", defaults.ngram_draft_max))
    if settings.get("p_min") is not None:
        fields["p_min"] = settings["p_min"]
    drafter = settings.get("drafter")
    if drafter is not None:
        if drafter not in tuple(DrafterMode):
            raise ApiError(400, f"speculative.drafter must be one of "
                           f"{', '.join(DrafterMode)}, not {drafter!r}",
                           param="speculative.drafter")  # fmt: skip
        fields["drafter"] = DrafterMode(drafter)
    return fields


def _settings(body: dict[str, Any]) -> dict[str, Any]:
    """The ``speculative`` object's settings and the dotted top-level keys', each known."""
    given = body.get("speculative")
    if given is not None and not isinstance(given, dict):
        raise ApiError(400, "speculative must be an object", param="speculative")
    settings = dict(given or {})
    for key, value in body.items():
        if key.startswith("speculative."):
            settings[key.removeprefix("speculative.")] = value
    unknown = [k for k in settings if k not in SPECULATIVE_FIELDS]
    if unknown:
        raise ApiError(400, f"speculative.{unknown[0]} is not a setting: use "
                       f"{', '.join('speculative.' + f for f in SPECULATIVE_FIELDS)}",
                       param=f"speculative.{unknown[0]}")  # fmt: skip
    return settings


def _whole(settings: dict[str, Any], name: str) -> int | None:
    """Setting ``name``: None when not given, else a whole number of 1 or more."""
    value = settings.get(name)
    if value is not None and (not is_whole(value) or value < 1):
        raise ApiError(400, f"speculative.{name} must be a whole number of 1 or more, not "
                       f"{value!r}", param=f"speculative.{name}")  # fmt: skip
    return value
