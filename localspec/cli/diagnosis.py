"""What ``localspec doctor`` reports: can localspec run here, on what, and with what.

``diagnose(options)`` loads no model. It gathers the llama.cpp build (versions, CPU
features, the GPU backends and RPC compiled in), the devices with their free memory, where
each model of the pair would run (``plan_placement``, the policy every command uses), the
models on disk, the cost profiles measured on this machine and the home directory.
``Diagnosis.problems`` lists what stops localspec from running (an empty list: it can): a
model file that is missing, unreadable, truncated or of more blocks than llama.cpp loads
among them (``model_problem`` reads its header); ``Diagnosis.notes`` what runs, but slower
than it could, and cached measurements it ignores (damaged or crafted: measured again).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError, ModelFileError


@dataclass
class Diagnosis:
    home: str
    build: dict[str, Any] | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    pair: dict[str, Any] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    cost_profiles: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verification: dict[str, Any] = field(default_factory=dict)
    suggestion: dict[str, Any] | None = None
    prompt_cache: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "notes": self.notes,
            "home": self.home,
            "build": self.build,
            "devices": self.devices,
            "pair": self.pair,
            "models": self.models,
            "cost_profiles": self.cost_profiles,
            "verification": self.verification,
            "suggestion": self.suggestion,
            "prompt_cache": self.prompt_cache,
        }


def diagnose(options: Any) -> Diagnosis:
    """Everything ``doctor`` shows, for the pair ``options`` (a ``ModelOptions``) names."""
    from localspec.models.paths import cache_root

    home = cache_root()
    report = Diagnosis(home=str(home))
    problem = _writable(home)
    if problem:
        report.problems.append(problem)
    if not _build(report):
        return report
    _pair(report, options)
    _verification(report)
    _suggestion(report, options)
    _models(report)
    _cost_profiles(report, home / "calibration")
    _prompt_cache(report)
    return report


def _prompt_cache(report: Diagnosis) -> None:
    """The prompt cache on disk: its folder, what it holds, and its bounds."""
    from localspec.models.paths import prompt_cache_dir
    from localspec.session.sizes import default_bounds
    from localspec.storage.prompt_cache import DiskTier

    root = prompt_cache_dir()
    memory, disk = default_bounds(root)
    listed = DiskTier(root, disk).listing()
    report.prompt_cache = {
        "folder": str(root), "entries": len(listed),
        "bytes": sum(item.nbytes for item in listed),
        "default_disk_bound": disk, "default_memory_bound": memory,
    }  # fmt: skip


def _writable(home: Path) -> str | None:
    """Why localspec cannot keep models, measurements and conversations in ``home``."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=home, prefix=".doctor-"):
            pass
    except OSError as err:
        return (
            f"the localspec home {home} is not writable ({err.strerror or err}); "
            "set LOCALSPEC_HOME to a folder you can write"
        )
    return None


def _build(report: Diagnosis) -> bool:
    """The build and its devices; False when llama.cpp cannot even be loaded."""
    try:
        from localspec.backend.devices import build_info, devices, gpu_hardware
    except (ImportError, OSError) as err:  # llama_cpp missing, or its library unloadable
        report.problems.append(
            f"llama-cpp-python cannot be loaded ({err}); run scripts/setup.sh again"
        )
        return False
    info = build_info()
    report.build = info.to_dict()
    found = devices()
    report.devices = [d.to_dict() for d in found]
    hardware = gpu_hardware()
    if hardware is not None and not info.gpu_offload:
        report.notes.append(
            f"this machine has an {hardware.description}, but this llama.cpp build has no "
            f"backend for it: LOCALSPEC_BACKEND={hardware.backend} bash scripts/setup.sh"
        )
    return True


def _pair(report: Diagnosis, options: Any) -> None:
    """Where each model of the pair would run, for the files already on disk."""
    from localspec.machine.costcache import cached_costs
    from localspec.models.catalog import Role, default_name, locate_model, looks_like_path
    from localspec.session.plan import plan_placement

    paths: dict[str, Path | None] = {}
    refs: tuple[tuple[Role, str | None], ...] = (
        ("target", options.target),
        ("draft", options.draft),
    )
    for role, ref in refs:
        path: Path | None = None
        try:
            path = locate_model(ref, role)
            if path is None and ref and looks_like_path(ref):  # nothing fetches it
                raise ModelFileError(f"model file not found: {ref}", "check the path")
            if path is not None and (note := model_problem(path)):
                report.notes.append(note)
        except LocalspecError as err:
            report.problems.append(f"{role}: {_said(err)}")
            path = None
        paths[role] = path
        report.pair[role] = {"ref": ref or default_name(role), "path": _str(path)}
    if paths["target"] is None:
        report.pair["placement"] = None
        report.notes.append(
            "the target is not on disk yet: the first `localspec complete` fetches it "
            "(or `localspec models pull`)"
        )
        return
    try:
        placement = plan_placement(options, paths["target"], paths["draft"])
    except LocalspecError as err:
        report.problems.append(_said(err))
        report.pair["placement"] = None
        return
    report.pair["placement"] = {**placement.to_dict(), "summary": placement.summary()}
    report.notes.extend(placement.notices)
    measured = cached_costs(options, placement, paths["target"], paths["draft"])
    report.pair["plain_step_ms"] = round(measured.plain_s * 1000, 2) if measured else None


def _verification(report: Diagnosis) -> None:
    """Where greedy verification picks the target's tokens, as the next load will."""
    from localspec.environment import DEVICE_VERIFY, device_verification

    try:
        setting = device_verification()
    except LocalspecError as err:
        report.problems.append(_said(err))
        return
    placement = report.pair.get("placement") or {}
    target = placement.get("target") or {}
    offloaded = bool(target) and target.get("gpu_layers") == target.get("layers")
    on = setting if setting is not None else offloaded
    if on:
        why = (
            "llama.cpp's backend sampler picks each verified token where the logits are "
            "computed; only token ids come back"
        )
    elif setting is None:
        why = "the target's output layer runs on the CPU, where reading its rows costs less"
    else:
        why = "every verified position's logits row is read on the host"
    report.verification = {
        "greedy": "device" if on else "host",
        "setting": {None: "auto", True: "1", False: "0"}[setting],
        "why": f"{why} ({DEVICE_VERIFY}=auto|1|0)",
    }


def _suggestion(report: Diagnosis, options: Any) -> None:
    """A target that suits the GPU's free memory, when it is not the one chosen."""
    from localspec.machine.suggest import suggest_target
    from localspec.session import plan as planning

    if report.build is None or not report.build.get("gpu_offload"):
        return
    found = suggest_target(planning.gpu_devices(), options.n_ctx)
    if found is None:
        return
    report.suggestion = found.to_dict()
    if report.pair.get("target", {}).get("ref") != found.target:
        report.notes.append(found.line())


def _models(report: Diagnosis) -> None:
    from localspec.models import catalog

    for entry in catalog.load_catalog().models.values():
        where = catalog.locate_model(entry.name)
        if where is not None:
            report.models.append(
                {"name": entry.name, "role": entry.role, "path": str(where),
                 "bytes": where.stat().st_size}
            )  # fmt: skip


def model_problem(path: Path) -> str | None:
    """A ``ModelFileError`` unless ``path``'s header reads whole, its block count is one
    llama.cpp loads and the file is as long as its tensors need (not truncated). A block
    count the header cache gave is read again from the file before the file is blamed: if
    the file's own is sound, the damage was the cache's (now replaced), and a note says so."""
    from localspec.models.derive import checked_block_count
    from localspec.models.gguf import HEADER_CACHE, check_gguf, data_end, read_metadata

    check_gguf(path)
    try:
        needed, size = data_end(path)
        meta = read_metadata(path)
    except (OSError, ValueError) as err:
        raise ModelFileError(f"cannot read the GGUF header of {path}: {err}",
                             "the file is damaged: download it again") from None  # fmt: skip
    if size < needed:
        raise ModelFileError(f"{path} is truncated: {size} bytes of the {needed} its tensors "
                             "need", "download it again")  # fmt: skip
    count = meta.get(f"{meta.get('general.architecture')}.block_count")
    if count is None:
        return None
    try:
        checked_block_count(path, count)
    except ModelFileError:
        meta = read_metadata(path, fresh=True)  # the file's own, kept in the cache's place
        checked_block_count(path, meta.get(f"{meta.get('general.architecture')}.block_count"))
        return (f"the header cache ({HEADER_CACHE} in localspec's home) held damaged values "
                f"for {path}; they were read again from the file, which is sound")  # fmt: skip
    return None


def _cost_profiles(report: Diagnosis, directory: Path) -> None:
    """The step costs measured on this machine, newest first; a file that is not one (a
    link to nothing, crafted values) is a note: it is measured again when needed."""
    from localspec.core.costs import CostProfile
    from localspec.statefiles import STATE_ERRORS, read_json

    if not directory.is_dir():
        return
    files = sorted(directory.glob("*.json"), key=_modified, reverse=True)
    for path in files:
        data, problem = read_json(path)
        try:
            plain = CostProfile.from_dict(data).plain_s if data is not None else None
        except STATE_ERRORS as err:
            problem = f"{path} holds impossible values ({err})"
            plain = None
        if plain is None:
            report.notes.append(
                f"ignoring cached step costs: {problem or f'{path} cannot be read'}"
            )
            continue
        report.cost_profiles.append(
            {"file": str(path), "plain_step_ms": round(plain * 1000, 2),
             "measured": int(_modified(path))}
        )  # fmt: skip


def _modified(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _said(err: LocalspecError) -> str:
    """An error's message and its hint, as one line."""
    return f"{err.message} ({err.hint})" if err.hint else err.message


def _str(path: Path | None) -> str | None:
    return os.fspath(path) if path is not None else None
