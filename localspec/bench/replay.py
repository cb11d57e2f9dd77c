"""``localspec bench replay DIR``: a bench run's greedy answers replayed at a machine's costs.

With greedy decoding a draft is accepted as far as it agrees with the answer the target gave,
so a recorded answer is all the target the engine needs to make its choices again
(``core.replay``): a change to a drafter or the controller shows in a replay before any
benchmark, and another machine's costs (a GPU's) can price the same answers. ``read_run``
reads DIR, as ``localspec bench --out DIR`` wrote it: its first answer of mode ``none`` to
every prompt (``records.jsonl``) and the run's settings (``summary.json``'s meta: the costs
the cost model started from, the prompts, the chat template, the target). ``replay_run``
replays each answer, per cost profile:

- ``auto`` as a fresh ``localspec complete`` starts it (cold, no datastore, no history),
  the draft model included when the pair has one (its greedy choice and confidence after
  every prefix of the answer are read once from the real model: ``DraftChoices``);
- the draft model alone, at its fixed policy (``model``, with a draft model);
- llama.cpp's ``ngram-simple`` (``replay_ngram_simple``),

each as its estimated speedup over plain decoding of the same answer at the same costs, and
``auto``'s choices (drafter, drafted, accepted per drafting round). The profiles: the run's
own costs unless a file gives others, a ``CostProfile`` (JSON) or the device check's
``device_check.json`` (one per pair of shapes). ``render`` gives the table per profile and
category (geometric means over answers). An estimate, not a benchmark: the costs are taken
as exact, and at another machine's costs the answers are still this pair's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.bench.modes import BASELINE
from localspec.bench.prompts import (
    CATEGORIES,
    CHECK_SETS,
    PREDICTION_CATEGORIES,
    STORE_CATEGORIES,
    BenchPrompt,
    load_prompt_file,
    load_prompts,
)
from localspec.bench.summary import geometric_mean
from localspec.core.costs import CostProfile
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.replay import DraftChoices, replay, replay_ngram_simple
from localspec.errors import InputError, UsageError
from localspec.progress import OnProgress
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions

RUN_HINT = "pass a folder that localspec bench --out wrote"
SHIPPED = "shipped sets"  # the meta's prompt_file when the run read no file of the user's
MODEL, NGRAM_SIMPLE = DrafterMode.MODEL.value, "ngram-simple"


@dataclass(frozen=True)
class Run:
    """What a bench run left: its ``none`` answers (records as JSON) and its meta."""

    directory: Path
    answers: list[dict[str, Any]]
    meta: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """One recorded answer, as token ids, ready to replay."""

    category: str
    prompt_id: str
    prompt: list[int]
    tokens: list[int]
    draft: DraftChoices | None = None


def _loads(text: str, where: str) -> Any:
    """JSON, or an ``InputError`` naming ``where`` (nesting too deep included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{where} is not JSON a replay reads: it is nested too deep", RUN_HINT
                         ) from None  # fmt: skip
    except ValueError:
        raise InputError(f"{where} is not JSON", RUN_HINT) from None


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}", RUN_HINT) from None
    except ValueError:  # bad UTF-8
        raise InputError(f"{path} is not JSON", RUN_HINT) from None
    return _loads(text, str(path))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _damaged(where: str, what: str) -> InputError:
    return InputError(f"{where}: {what}", RUN_HINT)


def _meta(path: Path) -> dict[str, Any]:
    """``summary.json``'s meta, each field a replay reads of the type the bench writes."""
    summary = _read_json(path)
    meta = summary.get("meta", {}) if isinstance(summary, dict) else None
    if not isinstance(meta, dict):
        raise _damaged(str(path), "its meta is not a JSON object")
    kinds = {"temperature": (int, float), "max_tokens": (int,), "prompt_file": (str,),
             "target": (str,), "costs": (dict,)}  # fmt: skip
    for key, types in kinds.items():
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise _damaged(str(path), f"its meta's {key} is {json.dumps(value)[:40]}")
    return meta


def _answer_record(record: Any, where: str) -> dict[str, Any] | None:
    """``record`` if it is an answer to replay (the first of mode ``none``), None if it is
    another; an ``InputError`` if it is not a record the bench writes."""
    if not isinstance(record, dict):
        raise _damaged(where, "not a JSON object")
    first = record.get("repeat") in (None, 0)
    if not (record.get("mode") == BASELINE and first and record.get("token_ids")):
        return None
    for key in ("category", "prompt_id"):
        if not isinstance(record.get(key), str):
            raise _damaged(where, f"its {key} is missing or not a string")
    tokens = record["token_ids"]
    if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
        raise _damaged(where, "its token_ids are not a list of token ids")
    return record


def read_run(directory: Path) -> Run:
    """The first greedy answer of mode ``none`` to every prompt of the run in ``directory``;
    an ``InputError`` naming the file (and line) of anything the bench would not write."""
    records = directory / "records.jsonl"
    try:
        lines = records.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise InputError(f"cannot read {records}: {err.strerror}", RUN_HINT) from None
    except ValueError:  # bad UTF-8
        raise InputError(f"{records} is not JSON lines", RUN_HINT) from None
    meta = _meta(directory / "summary.json")
    if meta.get("temperature", 0.0) != 0.0:
        raise UsageError(
            f"{directory} holds sampled answers (temperature {meta['temperature']}): a replay "
            "follows greedy ones",
            "replay a run of the bench at its default --temperature 0",
        )
    answers = []
    for n, line in enumerate(lines, 1):
        where = f"{records}, line {n}"
        record = _answer_record(_loads(line, where), where)
        if record is not None:
            answers.append(record)
    if not answers:
        raise InputError(f"{records} holds no answer of mode none", RUN_HINT)
    return Run(directory, answers, meta)


def prompt_texts(run: Run, prompts: Path | None) -> dict[tuple[str, str], str]:
    """Each prompt's text by (category, id): from ``prompts`` if given, else from the file
    the run read, else from every set the bench ships."""
    given = prompts
    recorded = run.meta.get("prompt_file", SHIPPED)
    if given is None and recorded != SHIPPED:
        given = Path(recorded)
        if not given.is_file():
            raise UsageError(
                f"the run read its prompts from {recorded}, which is not there",
                "pass --prompts FILE (the file the bench ran)",
            )
    found: list[BenchPrompt] = []
    if given is not None:
        found = load_prompt_file(given)
    else:
        for category in CATEGORIES + STORE_CATEGORIES + PREDICTION_CATEGORIES + CHECK_SETS:
            found += load_prompts([category])
    texts: dict[tuple[str, str], str] = {}
    for p in found:  # two check sets may hold the same prompt: the same text
        texts.setdefault((p.category, p.id), p.prompt)
    return texts


def profiles(run: Run, costs: Path | None, measured: CostProfile | None) -> dict[str, Any]:
    """The cost profiles to replay at, by name: a file's, else the run's, else ``measured``
    (this machine's, for a run that recorded none)."""
    if costs is not None:
        data = _read_json(costs)
        try:
            if "pairs" in data:  # the device check's: a profile per pair of shapes
                return {
                    name: CostProfile.from_dict(p["costs"]) for name, p in data["pairs"].items()
                }
            return {costs.stem: CostProfile.from_dict(data)}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError(
                f"{costs} holds no cost profile",
                "pass a CostProfile's JSON, or the device check's device_check.json",
            ) from None
    if run.meta.get("costs"):
        try:
            return {"this run": CostProfile.from_dict(run.meta["costs"])}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _damaged(f"{run.directory / 'summary.json'}", "its meta's costs are not a "
                           "cost profile") from None  # fmt: skip
    if measured is None:
        raise UsageError(f"{run.directory} records no costs", "pass --costs FILE")
    return {"this machine": measured}


def replay_answer(
    answer: Answer, costs: CostProfile, max_tokens: int, ends: Callable[[int], bool]
) -> dict[str, Any]:
    """One answer's estimated speedups over plain decoding, and auto's drafting rounds."""
    plain = len(answer.tokens) * costs.plain_s
    params = GenerationParams(max_tokens=max(max_tokens, len(answer.tokens)))
    auto = replay(answer.prompt, answer.tokens, costs, params, ends, draft=answer.draft)
    row: dict[str, Any] = {
        "category": answer.category,
        "prompt_id": answer.prompt_id,
        "tokens": len(answer.tokens),
        "auto": round(plain / auto.seconds, 4),
    }
    if answer.draft is not None:
        fixed = params.model_copy(update={"drafter": DrafterMode.MODEL})
        model = replay(answer.prompt, answer.tokens, costs, fixed, ends, draft=answer.draft)
        row[MODEL] = round(plain / model.seconds, 4)
    simple_s, _, _ = replay_ngram_simple(answer.prompt, answer.tokens, costs)
    row[NGRAM_SIMPLE] = round(plain / simple_s, 4)
    row["plain_steps"] = sum(1 for r in auto.rounds if not r.drafted)
    row["drafts"] = [[r.drafter, r.drafted, r.accepted] for r in auto.rounds if r.drafted]
    return row


def _group(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means over answers, auto's lowest, and what auto drafted with (tokens)."""
    out: dict[str, Any] = {"answers": len(rows)}
    for key in ("auto", MODEL, NGRAM_SIMPLE):
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = round(geometric_mean(values) or 0.0, 4)
    out["lowest_auto"] = min(r["auto"] for r in rows)
    drafted: dict[str, int] = {}
    for r in rows:
        for drafter, n, _ in r["drafts"]:
            drafted[drafter] = drafted.get(drafter, 0) + n
    out["auto_drafted"] = drafted
    return out


def replay_run(
    answers: list[Answer], costs: dict[str, CostProfile], max_tokens: int,
    ends: Callable[[int], bool],
) -> dict[str, Any]:  # fmt: skip
    """Per profile: every answer's row, and the groups per category and over all."""
    result: dict[str, Any] = {}
    for name, profile in costs.items():
        rows = [replay_answer(a, profile, max_tokens, ends) for a in answers]
        categories = dict.fromkeys(r["category"] for r in rows)
        result[name] = {
            "categories": {c: _group([r for r in rows if r["category"] == c]) for c in categories},
            "overall": _group(rows),
            "answers": rows,
        }
    return result


def _cell(group: dict[str, Any], key: str) -> str:
    return f"{group[key]:.2f}x" if key in group else "-"


def render(result: dict[str, Any]) -> str:
    """The table: per profile, a row per category and one over all answers."""
    lines = [
        "| costs | category | answers | auto | lowest auto | model | ngram-simple "
        "| auto / ngram-simple | auto drafted (tokens) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, replayed in result.items():
        groups = [*replayed["categories"].items(), ("all (geo-mean)", replayed["overall"])]
        for category, g in groups:
            ratio = g["auto"] / g[NGRAM_SIMPLE]
            mix = ", ".join(f"{k} {v}" for k, v in sorted(g["auto_drafted"].items())) or "-"
            cells = [name, category, str(g["answers"]), _cell(g, "auto"),
                     f"{g['lowest_auto']:.2f}x", _cell(g, MODEL), _cell(g, NGRAM_SIMPLE),
                     f"{ratio:.2f}", mix]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draft_choices(draft: Any, prompt: list[int], answer: list[int], vocab: int) -> DraftChoices:
    """The draft model's greedy choice and its confidence after every prefix of the answer."""
    found = draft.greedy([*prompt, *answer], len(answer) + 1, confidence=True, vocab=vocab)
    draft.reset()
    return DraftChoices(found.ids, list(found.top_p or []))


def _answers(run: Run, texts: dict[tuple[str, str], str], session: Any) -> list[Answer]:
    """The run's answers whose prompts were found, tokenized as the run did; the draft
    model's choices along each when the pair has one."""
    raw = not run.meta.get("chat_template", True)
    draft = session.slot.wait() if session.slot is not None else None
    answers = []
    for record in run.answers:
        text = texts.get((record["category"], record["prompt_id"]))
        if text is None:
            continue
        prompt = session.text_tokens(text, raw=raw)
        tokens = list(record["token_ids"])
        if any(t >= session.target.n_vocab for t in tokens):  # not this target's answer
            raise UsageError(
                f"{record['category']} {record['prompt_id']}'s answer holds token ids past "
                f"{session.target_label}'s vocabulary of {session.target.n_vocab}",
                "pass the --target the bench ran with",
            )
        choices = None
        if draft is not None:
            choices = draft_choices(draft, prompt, tokens, session.target.n_vocab)
        answers.append(Answer(record["category"], record["prompt_id"], prompt, tokens, choices))
    return answers


def replay_dir(
    directory: Path,
    options: ModelOptions,
    *,
    costs: Path | None = None,
    prompts: Path | None = None,
    on_progress: OnProgress | None = None,
) -> tuple[dict[str, Any], int]:
    """``localspec bench replay``: the replay of the run in ``directory`` with the pair of
    ``options`` (its target's tokenizer, its draft model if it loads one), and how many
    answers were left out because their prompt was not found."""
    run = read_run(directory)
    texts = prompt_texts(run, prompts)
    needs_costs = costs is None and not run.meta.get("costs")
    options = options.model_copy(
        update={"calibrate": needs_costs, "learn": False, "history": False, "stores": (),
                "draft_on_demand": False}
    )  # fmt: skip
    session = open_session(options, on_progress=on_progress)
    try:
        recorded = run.meta.get("target")
        if recorded and recorded != session.target_label:
            raise UsageError(
                f"the run's answers are {recorded}'s, not {session.target_label}'s",
                "pass the --target (and --draft) the bench ran with",
            )
        answers = _answers(run, texts, session)
        if not answers:
            raise UsageError(
                f"none of the prompts of {directory}'s answers was found",
                "pass --prompts FILE (the file the bench ran)",
            )
        max_tokens = int(run.meta.get("max_tokens") or 0)
        found = profiles(run, costs, session.costs)
        result = replay_run(answers, found, max_tokens, session.target.is_eog)
    finally:
        session.close()
    return result, len(run.answers) - len(answers)
