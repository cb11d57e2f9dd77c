"""Log-probabilities in OpenAI's shapes, from the target's own distribution
(``TokenEmitted.logprob``, read off the rows verification read).

``logprob_count(body, chat)`` reads a request's asking: chat's ``logprobs`` (a boolean) and
``top_logprobs`` (0 to 20), the completions' ``logprobs`` (0 to 5 alternatives); each refusal
a 400 naming the field. ``chat_entry`` is one token of chat's ``logprobs.content``;
``completion_logprobs`` the completions' ``tokens``, ``token_logprobs``, ``top_logprobs`` and
``text_offset`` of an answer.
"""

from __future__ import annotations

from typing import Any

from localspec.core.events import Logprob, TokenEmitted
from localspec.serve.errors import ApiError, is_whole

MAX_CHAT_TOP, MAX_COMPLETION_TOP = 20, 5


def logprob_count(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives to report per token (None: no log-probabilities)."""
    asked = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if asked not in (None, True, False):
            raise ApiError(400, "logprobs must be true or false", param="logprobs")
        if top is not None and (not is_whole(top) or not 0 <= top <= MAX_CHAT_TOP):
            raise ApiError(400, f"top_logprobs must be a whole number from 0 to {MAX_CHAT_TOP}",
                           param="top_logprobs")  # fmt: skip
        if top and not asked:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (top or 0) if asked else None
    if asked is None or asked is False:
        return None
    if not is_whole(asked) or not 0 <= asked <= MAX_COMPLETION_TOP:
        raise ApiError(400, f"logprobs must be a whole number from 0 to {MAX_COMPLETION_TOP}",
                       param="logprobs")  # fmt: skip
    return int(asked)


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_entry(logprob: Logprob) -> dict[str, Any]:
    return {
        "token": _text(logprob.piece),
        "logprob": logprob.logprob,
        "bytes": list(logprob.piece),
        "top_logprobs": [
            {"token": _text(piece), "logprob": value, "bytes": list(piece)}
            for _, piece, value in logprob.top
        ],
    }


def chat_logprobs(emitted: list[TokenEmitted]) -> dict[str, Any]:
    return {"content": [chat_entry(e.logprob) for e in emitted if e.logprob is not None]}


def completion_logprobs(emitted: list[TokenEmitted]) -> dict[str, Any]:
    shown = [e.logprob for e in emitted if e.logprob is not None]
    offsets, at = [], 0
    for lp in shown:
        offsets.append(at)
        at += len(_text(lp.piece))
    return {
        "tokens": [_text(lp.piece) for lp in shown],
        "token_logprobs": [lp.logprob for lp in shown],
        "top_logprobs": [{_text(piece): value for _, piece, value in lp.top} for lp in shown],
        "text_offset": offsets,
    }
