"""A target's self-speculative draft: derived once from its own layers, kept in the cache.

Contract:

- ``derived_draft(target, threads=...)`` returns the cached ``Derived`` for ``target`` or
  makes it: measures candidate layer subsets (``layerchoice.choose_layers``), derives the
  best into the cache and records the choice. With ``layers`` it derives exactly those,
  without measuring (numbers from an earlier measurement of the same subset are kept), and
  that becomes the target's recorded choice. ``refresh`` measures (or derives) again.
- ``cached_derived(target)`` reads the recorded choice without any model work: ``None``
  when there is none, when it is unreadable (it is measured again later) or when its file
  is gone.
- Files: the target's folder (``derived.derived_dir``: one per target size and time, so
  a changed target is derived again) holds ``layers-<list>.gguf`` and ``choice.json``
  (every candidate's numbers). Both are written under temporary names and renamed; the
  files are 0600, as the models' are, in a 0700 folder. A lock keeps two processes from
  deriving the same target at once; under it, a derivation first removes what an
  interrupted one left, and only the recorded choice's file is kept.
- ``load_derived`` loads a derived file; llama.cpp's refusal is a ``ModelFileError`` whose
  hint says how to derive it again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.backend.llama import LoadOptions
from localspec.errors import LocalspecError, ModelFileError
from localspec.models.derive import (
    Source,
    check_layers,
    checked_block_count,
    compact_layers,
    open_source,
    write_derived,
)
from localspec.models.derived import (
    CHOICE_FILE,
    derived_dir,
    locked,
    private_dir,
    read_record,
    remove_leftovers,
)
from localspec.models.gguf import check_gguf, read_metadata
from localspec.models.layerchoice import (
    DRAFT_LENGTHS,
    Candidate,
    Choice,
    choose_layers,
    expected_speedup,
    load_derived,
    pick,
)
from localspec.progress import OnProgress, tell
from localspec.statefiles import STATE_ERRORS, write_file

__all__ = [
    "Candidate",
    "Derived",
    "cached_derived",
    "choose_layers",
    "derived_draft",
    "derived_dir",
    "expected_speedup",
    "load_derived",
    "pick",
]

FORMAT = 1
CHECK_OPTIONS = LoadOptions(n_ctx=256, tree_seqs=0)  # a derived file's load check


@dataclass(frozen=True)
class Derived:
    """A target's derived draft. ``agreement``, ``step_ratio``, ``expected_speedup`` and
    ``draft_length`` (the best k) are ``None`` for layers given by hand and never measured."""

    path: Path
    layers: tuple[int, ...]
    n_layers: int
    agreement: float | None
    step_ratio: float | None
    expected_speedup: float | None
    draft_length: int | None
    candidates: tuple[Candidate, ...]

    @property
    def measured(self) -> bool:
        return self.agreement is not None


def derived_name(layers: Sequence[int]) -> str:
    return f"layers-{compact_layers(layers).replace(',', '_')}.gguf"


def cached_derived(target: Path) -> Derived | None:
    """The recorded choice for ``target`` if its file is there; never loads a model."""
    try:
        found = _read_choice(derived_dir(target))
    except OSError:
        return None
    return found if found is not None and found.path.is_file() else None


def derived_draft(
    target: Path,
    *,
    threads: int | None,
    on_progress: OnProgress | None = None,
    layers: Sequence[int] | None = None,
    refresh: bool = False,
) -> Derived:
    """The cached derived draft of ``target``, or a new one (module docstring)."""
    target = check_gguf(Path(target))
    n_layers = block_count(target)
    wanted = check_layers(layers, n_layers) if layers is not None else None
    directory = derived_dir(target)
    private_dir(directory)
    choice: Choice | None = None
    with locked(directory, on_progress):
        remove_leftovers(directory)  # of a derivation interrupted before this one
        record = None if refresh else _read_choice(directory)
        if record is not None and wanted in (None, record.layers):
            if not record.path.is_file():
                tell(on_progress, f"deriving {record.path.name} again from {target.name}")
                _derive_checked(open_source(target), record.layers, record.path)
            return record
        source = open_source(target)  # parsed once: a large vocabulary takes seconds
        if wanted is None:
            choice = choose_layers(
                target, threads=threads, on_progress=on_progress, workdir=directory, source=source
            )
            found = _from_choice(directory, choice)
        else:
            earlier = _read_choice(directory)
            found = _given(directory, wanted, n_layers, earlier.candidates if earlier else ())
        tell(on_progress, f"deriving {found.path.name} from {target.name}")
        _derive_checked(source, found.layers, found.path)
        _write_choice(directory, found, target, choice)
        _remove_others(directory, found.path)
        return found


def block_count(path: Path) -> int:
    """``{arch}.block_count`` from the header; ``ModelFileError`` when there is none."""
    try:
        meta = read_metadata(path)
        arch = meta.get("general.architecture")
        count = meta.get(f"{arch}.block_count") if isinstance(arch, str) else None
    except (OSError, ValueError) as err:
        raise ModelFileError(f"cannot read the GGUF header of {path}: {err}") from None
    if count is None:
        raise ModelFileError(
            f"{path} has no block count: not a layered model",
            "a self-draft needs a transformer model with blocks of layers",
        )
    return checked_block_count(path, count)


def _from_choice(directory: Path, choice: Choice) -> Derived:
    best = choice.chosen
    return Derived(
        path=directory / derived_name(best.layers),
        layers=best.layers,
        n_layers=choice.n_layers,
        agreement=best.agreement,
        step_ratio=best.step_ratio,
        expected_speedup=best.expected_speedup,
        draft_length=best.draft_length,
        candidates=choice.candidates,
    )


def _given(
    directory: Path, layers: tuple[int, ...], n_layers: int, measured: tuple[Candidate, ...]
) -> Derived:
    """Layers given by hand, with the numbers of an earlier measurement of them, if any."""
    same = next((c for c in measured if c.layers == layers), None)
    return Derived(
        path=directory / derived_name(layers),
        layers=layers,
        n_layers=n_layers,
        agreement=same.agreement if same else None,
        step_ratio=same.step_ratio if same else None,
        expected_speedup=same.expected_speedup if same else None,
        draft_length=same.draft_length if same else None,
        candidates=measured,
    )


def _derive_checked(source: Source, layers: Sequence[int], dest: Path) -> None:
    """Derive ``dest`` and make sure llama.cpp loads it; a refused file is removed."""
    write_derived(source, layers, dest)  # written 0600, as a temporary file is
    try:
        load_derived(dest, CHECK_OPTIONS, str(source.path)).close()
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


# --- choice.json ----------------------------------------------------------------------


def _write_choice(directory: Path, found: Derived, target: Path, choice: Choice | None) -> None:
    record: dict[str, Any] = {
        "format": FORMAT,
        "target": str(target.resolve()),
        "file": found.path.name,
        "n_layers": found.n_layers,
        "layers": list(found.layers),
        "agreement": found.agreement,
        "step_ratio": found.step_ratio,
        "expected_speedup": found.expected_speedup,
        "draft_length": found.draft_length,
        "candidates": [asdict(c) for c in found.candidates],
    }
    if choice is not None:
        record["measurement"] = {
            "verify_ratio": {str(k): v for k, v in choice.verify_ratio.items()},
            "target_step_ms": choice.target_step_s * 1000,
            "calibration_tokens": choice.calibration_tokens,
            "seconds": choice.seconds,
        }
    write_file(directory / CHOICE_FILE, (json.dumps(record, indent=2) + "\n").encode())


def _read_choice(directory: Path) -> Derived | None:
    """The recorded choice, or ``None`` when absent, damaged (it is measured again when
    asked for) or not one this version wrote."""
    data = read_record(directory)
    if data is None or data.get("format") != FORMAT:
        return None
    try:
        return _choice_of(directory, data)
    except (LocalspecError, *STATE_ERRORS):
        return None  # damaged or crafted: measured again when asked for


def _choice_of(directory: Path, data: dict[str, Any]) -> Derived | None:
    """A ``choice.json``'s record, every value checked (raises one of ``STATE_ERRORS``
    or a ``UsageError`` on a crafted one)."""
    n_layers = int(data["n_layers"])
    layers = check_layers(data["layers"], n_layers)
    candidates = tuple(
        Candidate(
            layers=check_layers(c["layers"], n_layers),
            label=str(c["label"]),
            agreement=_measured(c["agreement"], 1.0),
            step_ratio=_measured(c["step_ratio"]),
            expected_speedup=_measured(c["expected_speedup"]),
            draft_length=_length(c["draft_length"]),
        )
        for c in data["candidates"]
    )
    name = str(data["file"])
    if name != derived_name(layers):  # never a path outside this folder
        return None
    return Derived(
        path=directory / name,
        layers=layers,
        n_layers=n_layers,
        agreement=_number(data["agreement"], 1.0),
        step_ratio=_number(data["step_ratio"]),
        expected_speedup=_number(data["expected_speedup"]),
        draft_length=None if data["draft_length"] is None else _length(data["draft_length"]),
        candidates=candidates,
    )


MAX_RATIO = 1e6  # a measured ratio or speedup beyond this is no measurement


def _measured(value: object, top: float = MAX_RATIO) -> float:
    """A measured number: finite, from 0 to ``top``; ``ValueError`` otherwise."""
    x = float(value)  # type: ignore[arg-type]
    if not 0.0 <= x <= top:  # NaN and infinities fail too
        raise ValueError(f"not a measured value: {value!r}")
    return x


def _number(value: object, top: float = MAX_RATIO) -> float | None:
    """A measured number, or None for layers given by hand and never measured."""
    return None if value is None else _measured(value, top)


def _length(value: object) -> int:
    """A draft length as ``layerchoice`` measures them."""
    if not isinstance(value, int) or not 1 <= value <= max(DRAFT_LENGTHS):
        raise ValueError(f"not a measured draft length: {value!r}")
    return value


# --- the folder ---------------------------------------------------------------------


def _remove_others(directory: Path, keep: Path) -> None:
    """Earlier derived files of this target: only the recorded choice is kept."""
    for path in directory.glob("layers-*.gguf"):
        if path != keep:
            path.unlink(missing_ok=True)
