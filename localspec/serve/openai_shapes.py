"""Requests and answers in the OpenAI API's shapes, with llama.cpp-server's ``timings``.

Refusals are ``ApiError`` (serve/errors.py). ``generation_params`` turns a request
body into ``GenerationParams``, refusing with a 400 that names the field any option that
would change the result and that localspec cannot honour (``n`` > 1, ``tools``, ...), more
than ``MAX_STOPS`` stop strings or longer ones than ``MAX_STOP_CHARS``, and a ``max_tokens``
that is not a JSON integer or is over the server's limit. ``stream_flags`` checks
``stream`` and ``stream_options``.
``completion_prompts`` reads ``/v1/completions``' ``prompt`` in every form OpenAI accepts (a
string, a list of strings, a list of token ids, a list of such lists), at most
``MAX_PROMPTS`` of them. ``usage`` and ``timings`` read a ``GenerationStats``: a request that
had several prompts passes their sum (``GenerationStats.merged``), so one ``usage`` and one
``timings`` describe it.

Predicted outputs (OpenAI's ``prediction``: ``{"type": "content", "content": ...}``, the
content a string or a list of text parts) are read by ``prediction_text``; the usage then
counts, as OpenAI defines them, the prediction's tokens that appear in the answer
(``accepted_prediction_tokens``) and those that do not (``rejected_prediction_tokens``),
per token id (``prediction_counts``, in the worker). Speculation is set per request as
llama.cpp's server takes it, within the server's limits (serve/speculation.py); the
server's options are the defaults.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from pydantic import ValidationError

from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import UsageError
from localspec.serve.errors import ApiError, is_whole
from localspec.serve.logprob_shapes import logprob_count
from localspec.serve.speculation import SPECULATIVE_PARAMS, speculative_fields
from localspec.session.tools import template_message

MAX_PROMPTS = 16  # prompts in one /v1/completions request; each is generated in turn
MAX_STOPS = 4  # stop strings in one request, as OpenAI's API allows
MAX_STOP_CHARS = 256  # characters of one stop string

# Fields whose presence (with a value other than the neutral one) would change the answer.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "functions": (None, []),
    "function_call": (None, "none"),
    "echo": (None, False),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
}


def refuse_unsupported(body: dict[str, Any]) -> None:
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise ApiError(
                400,
                f"{name}={body[name]!r} is not supported by localspec serve",
                param=name,
                code="unsupported_parameter",
            )


def generation_params(
    body: dict[str, Any],
    defaults: GenerationParams,
    max_tokens_limit: int | None = None,
    overrides: bool = True,
    chat: bool = True,
) -> GenerationParams:
    """The request's sampling fields over the server's defaults; ``max_tokens`` at most
    ``max_tokens_limit``; its ``speculative`` settings within the defaults' limits, or
    refused unless ``overrides`` (``serve.speculation``)."""
    refuse_unsupported(body)
    fields: dict[str, Any] = {}
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    limit = body.get(name)
    if limit is not None:
        # A JSON integer only: what pydantic would coerce (31.0, "200") would pass the
        # limit's check as something else than what runs.
        if not is_whole(limit) or limit < 1:
            raise ApiError(400, f"{name} must be a whole number of 1 or more, not {limit!r}",
                           param=name)  # fmt: skip
        if max_tokens_limit is not None and limit > max_tokens_limit:
            raise ApiError(400, f"{name} is {limit}; this server writes at most "
                           f"{max_tokens_limit} tokens per answer", param=name)  # fmt: skip
        fields["max_tokens"] = limit
    for field_name in ("temperature", "top_p", "top_k", "min_p", "seed"):
        if body.get(field_name) is not None:
            fields[field_name] = body[field_name]
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = stop_strings(stop)
    fields["logprobs"] = logprob_count(body, chat)
    fields.update(speculative_fields(body, defaults, overrides))
    try:
        return GenerationParams(**{**defaults.model_dump(), **fields})
    except ValidationError as err:
        first = err.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else None
        where = {"max_tokens": name, **SPECULATIVE_PARAMS}.get(where or "", where)
        raise ApiError(400, f"invalid {where}: {first['msg']}", param=where) from None


def prediction_text(body: dict[str, Any]) -> str | None:
    """The text of a request's ``prediction`` (None without one)."""
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise ApiError(400, 'prediction must be {"type": "content", "content": ...}',
                       param="prediction")  # fmt: skip
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else None
    if not parts or not all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in parts
    ):
        raise ApiError(400, "prediction.content must be a string or a list of text parts "
                       '({"type": "text", "text": ...})', param="prediction.content")  # fmt: skip
    return "".join(p["text"] for p in parts)


def stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop`` as OpenAI takes it: a string or a list of at most ``MAX_STOPS`` non-empty
    strings, each at most ``MAX_STOP_CHARS`` characters (every one is looked for after
    every token, so their number and length bound the work of each)."""
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop has {len(stops)} strings; at most {MAX_STOPS} are allowed",
                       param="stop")  # fmt: skip
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"a stop string is longer than {MAX_STOP_CHARS} characters",
                       param="stop")  # fmt: skip
    return tuple(stops)


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)`` of a request, checked before any job runs."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    include = (options or {}).get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise ApiError(400, "stream_options.include_usage must be true or false",
                       param="stream_options")  # fmt: skip
    return bool(stream), bool(include)


def usage(
    stats: GenerationStats, predicted: tuple[int, int] | None = None, n_prompts: int = 1
) -> dict[str, Any]:
    """OpenAI's usage; ``predicted``: the request's ``prediction_counts``, if it had one.
    ``cached_tokens``: the prompt's tokens not evaluated, as ``timings``' ``cache_n``."""
    prompt, completion = stats.prompt_tokens, stats.generated_tokens
    shown: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": _cached(stats, n_prompts)},
    }
    if predicted is not None:
        accepted, rejected = predicted
        shown["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        }
    return shown


def _cached(stats: GenerationStats, n_prompts: int) -> int:
    """The prompts' tokens taken from a cache (a lane's, or the prompt cache's)."""
    # The prefill evaluates all of a prompt but its last token, which its first round
    # evaluates: that one is never taken from the cache, so a prompt nothing of which was
    # cached reads 0, as in llama.cpp's server.
    return stats.prompt_tokens - min(stats.prefill_evaluated + n_prompts, stats.prompt_tokens)


def timings(stats: GenerationStats, n_prompts: int = 1) -> dict[str, Any]:
    """llama.cpp-server's names where they exist, then localspec's own. ``stats`` may sum
    ``n_prompts`` generations."""
    prompt_ms = stats.prefill_s * 1000
    predicted_ms = stats.decode_s * 1000
    evaluated = stats.prompt_tokens - _cached(stats, n_prompts)
    predicted = stats.generated_tokens
    return {
        "cache_n": stats.prompt_tokens - evaluated,
        "prompt_n": evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(evaluated / prompt_ms * 1000, 3) if prompt_ms else 0.0,
        "predicted_n": predicted,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_second": round(predicted / predicted_ms * 1000, 3) if predicted_ms else 0.0,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_target_pass": round(stats.mean_accepted_length, 4),
        "target_passes": stats.rounds,
        "by_drafter": {
            name: {
                "rounds": d.rounds,
                "drafted": d.drafted,
                "accepted": d.accepted,
                "acceptance_rate": round(d.acceptance_rate, 4),
                # Per draft position from 1: rounds that drafted that far, and accepted it.
                "drafted_at": list(d.drafted_at),
                "accepted_at": list(d.accepted_at),
            }
            for name, d in sorted(stats.by_drafter.items())
        },
    }


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        try:
            out.append(template_message(m, f"messages[{i}]"))
        except UsageError as error:
            raise ApiError(400, error.message, param="messages") from None
    return out


def _is_token_ids(value: object) -> TypeGuard[list[int]]:
    # bool is an int subclass, and true/false are no token ids.
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def completion_prompts(
    body: dict[str, Any], n_vocab: int, *, infill: bool = False
) -> list[str | list[int]]:
    """The request's prompts in order: text, or token ids checked against the vocabulary.

    Text may be empty only for an ``infill`` (the cursor at the start of the file); an
    infill takes text only, as it is placed between the model's FIM tokens."""
    prompt = body.get("prompt")
    prompts: list[str | list[int]]
    if isinstance(prompt, str) or _is_token_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise ApiError(
            400,
            "prompt must be a string, a list of strings, a list of token ids or a list of "
            "lists of token ids",
            param="prompt",
        )
    if len(prompts) > MAX_PROMPTS:
        raise ApiError(
            400, f"at most {MAX_PROMPTS} prompts per request, not {len(prompts)}", param="prompt"
        )
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            if not p and not infill:
                raise ApiError(400, f"{where} is empty", param="prompt")
        elif not _is_token_ids(p):
            raise ApiError(400, f"{where} must be a string or a non-empty list of token ids",
                           param="prompt")  # fmt: skip
        elif infill:
            raise ApiError(400, "with a suffix the prompt must be text", param="prompt")
        else:
            bad = next((t for t in p if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ApiError(
                    400,
                    f"{where} has token id {bad}, outside the vocabulary (0 to {n_vocab - 1})",
                    param="prompt",
                )
    return prompts
