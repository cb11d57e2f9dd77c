"""Where each model of a pair runs: all, some or none of its layers on the GPU.

``place(request, target, draft, gpus, hardware)`` is the policy, a pure function of what it
is given (the devices are listed by ``backend.devices`` and faked in tests):

- ``auto`` (the default): with a build that can offload and a GPU with room, all of the
  target's layers go there; if the whole target does not fit, as many layers as fit (a
  notice says so); without a usable GPU, the CPU. The draft follows the same policy in the
  memory the target leaves, and otherwise stays on the CPU (a notice says so).
- a number, or ``all`` (-1): that many layers, checked against the free memory first, so a
  request that cannot fit is a clear ``UsageError`` rather than a failed load.
- ``0``: the CPU. A draft left to follow the target's policy stays on the CPU too.

Memory needed on the GPU counts the weights of the offloaded layers (the file's size spread
evenly over its layers), the KV cache of the offloaded layers, and a compute allowance per
model; only ``FREE_SHARE`` of the device's free memory is planned for, since drivers, the
desktop and llama.cpp's own buffers take some. A notice appears only where a GPU is there
and cannot be used, so a machine without one stays quiet. ``Placement.reason`` always says
why, for ``doctor`` and ``--stats``.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.backend.devices import REBUILD_FOR_GPU, Device, Hardware
from localspec.errors import UsageError
from localspec.models.resources import Footprint, human

AUTO = None  # a request: None is auto, -1 all layers, n >= 0 that many
ALL = -1
FREE_SHARE = 0.9  # of a device's free memory, planned for


def parse_layers(text: str | int | None, option: str = "--gpu-layers") -> int | None:
    """``auto`` -> None, ``all`` or -1 -> -1, a whole number >= 0 -> itself."""
    if text is None:
        return AUTO
    word = str(text).strip().lower()
    if word == "auto":
        return AUTO
    if word in ("all", "-1"):
        return ALL
    if word.isdigit():
        return int(word)
    raise UsageError(
        f"invalid {option} {text!r}", "write auto, all, 0 (the CPU) or a number of layers"
    )


@dataclass(frozen=True)
class ModelPlace:
    """One model's place: ``layers`` of its ``total`` offloadable layers on ``device``."""

    layers: int
    total: int
    device: str  # the GPU's name(s), "CPU" when nothing is offloaded
    needed: int = 0  # bytes planned for on the GPU

    @property
    def on_gpu(self) -> bool:
        return self.layers > 0

    @property
    def n_gpu_layers(self) -> int:
        """What llama.cpp is given: -1 for every layer, so none is left out by rounding."""
        return -1 if self.layers >= self.total else self.layers

    def summary(self) -> str:
        if not self.on_gpu:
            return "CPU"
        share = "all" if self.layers >= self.total else f"{self.layers}"
        return f"{self.device} ({share} of {self.total} layers)"

    def to_dict(self) -> dict[str, object]:
        return {"device": self.device, "gpu_layers": self.layers, "layers": self.total}


@dataclass(frozen=True)
class Placement:
    target: ModelPlace
    draft: ModelPlace | None
    reason: str
    notices: tuple[str, ...] = ()
    # The GPUs placed on, as (description, total memory): ggml's names (CUDA0) say nothing
    # of which card it is, and a home may be shared by machines with different ones.
    gpus: tuple[tuple[str, int], ...] = ()

    def key(self) -> tuple[object, ...]:
        """What measured costs depend on: nothing more on a CPU-only placement (so costs
        measured before GPUs were placed stay valid), else each model's device and layers,
        and which GPUs they are."""
        places = [self.target] + ([self.draft] if self.draft else [])
        if not any(p.on_gpu for p in places):
            return ()
        return (*((p.device, p.layers) for p in places), *self.gpus)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict() if self.draft else None,
            "reason": self.reason,
        }

    def summary(self) -> str:
        draft = f", draft on {self.draft.summary()}" if self.draft else ""
        return f"target on {self.target.summary()}{draft}"


def place(
    target_request: int | None,
    draft_request: int | None,
    target: Footprint,
    draft: Footprint | None,
    gpus: list[Device],
    hardware: Hardware | None = None,
) -> Placement:
    """Place the pair (see the module docstring); ``UsageError`` for a request that cannot
    be met."""
    if draft_request is AUTO and target_request == 0:
        draft_request = 0  # --gpu-layers 0 alone keeps the whole pair on the CPU
    if not gpus:
        return _on_cpu(target_request, draft_request, target, draft, hardware)
    names = "+".join(d.name for d in gpus)
    room = int(sum(d.free for d in gpus) * FREE_SHARE)
    notices: list[str] = []
    target_place = _fit("target", "--gpu-layers", target_request, target, room, names, notices)
    draft_place = None
    if draft is not None:
        left = room - target_place.needed
        draft_place = _fit(
            "draft", "--draft-gpu-layers", draft_request, draft, left, names, notices,
            whole_only=True,
        )  # fmt: skip
    free = human(sum(d.free for d in gpus))
    if target_place.on_gpu:
        reason = f"{names} has {free} free; the target needs {human(target_place.needed)} there"
    elif target_request == 0:
        reason = "--gpu-layers 0 keeps the target on the CPU"
    else:
        reason = f"{names} has {free} free, too little for any of the target's layers"
    gpu_ids = tuple((d.description, d.total) for d in gpus)
    return Placement(target_place, draft_place, reason, tuple(notices), gpu_ids)


def _on_cpu(
    target_request: int | None,
    draft_request: int | None,
    target: Footprint,
    draft: Footprint | None,
    hardware: Hardware | None,
) -> Placement:
    """No GPU to offload to: asking for layers is an error, auto is the CPU."""
    asked = (("--gpu-layers", target_request), ("--draft-gpu-layers", draft_request))
    for option, request in asked:
        if request not in (AUTO, 0):
            raise UsageError(
                f"{option} {'all' if request == ALL else request}: this llama.cpp build has "
                "no GPU to offload layers to",
                _rebuild_hint(hardware) or "leave it at auto, or 0 for the CPU",
            )
    notices = []
    if hardware is not None and target_request is AUTO:
        notices.append(
            f"this machine has an {hardware.description}, but this llama.cpp build cannot use "
            f"it, so the models run on the CPU; {_rebuild_hint(hardware)}"
        )
    reason = (
        "--gpu-layers 0 keeps the pair on the CPU"
        if target_request == 0
        else "this llama.cpp build has no GPU backend with a device"
    )
    cpu = ModelPlace(0, target.layers, "CPU")
    draft_place = ModelPlace(0, draft.layers, "CPU") if draft else None
    return Placement(cpu, draft_place, reason, tuple(notices))


def _rebuild_hint(hardware: Hardware | None) -> str:
    if hardware is None:
        return ""
    return "rebuild llama.cpp for it: " + REBUILD_FOR_GPU.format(backend=hardware.backend)


def _fit(
    role: str,
    option: str,
    request: int | None,
    model: Footprint,
    room: int,
    names: str,
    notices: list[str],
    whole_only: bool = False,
) -> ModelPlace:
    """How many of ``model``'s layers go to the GPU given ``room`` bytes (see ``place``).
    ``whole_only``: auto places all layers or none (half a draft on the GPU saves little
    and takes memory from the target)."""
    if request == 0:
        return ModelPlace(0, model.layers, "CPU")
    wanted = model.layers if request in (AUTO, ALL) else min(request, model.layers)
    fitting = _layers_fitting(model, room)
    if request is not AUTO:
        if wanted > fitting:
            raise UsageError(
                f"{option} {'all' if request == ALL else request}: {wanted} of the {role}'s "
                f"layers need about {human(model.needed(wanted))} on {names}, which has "
                f"{human(max(room, 0))} to spare",
                f"use {option} auto, or at most {fitting}"
                + (" (0 keeps it on the CPU)" if fitting == 0 else ""),
            )
        return ModelPlace(wanted, model.layers, names, model.needed(wanted))
    if fitting >= model.layers:
        return ModelPlace(model.layers, model.layers, names, model.needed(model.layers))
    if whole_only or fitting == 0:
        notices.append(
            f"the {role} stays on the CPU: it needs about {human(model.needed(model.layers))} "
            f"on {names}, which has {human(max(room, 0))} to spare"
        )
        return ModelPlace(0, model.layers, "CPU")
    notices.append(
        f"only {fitting} of the {role}'s {model.layers} layers fit on {names} "
        f"({human(max(room, 0))} to spare); the rest run on the CPU"
    )
    return ModelPlace(fitting, model.layers, names, model.needed(fitting))


def _layers_fitting(model: Footprint, room: int) -> int:
    """The most layers whose ``needed`` is within ``room``."""
    low, high = 0, model.layers
    while low < high:
        mid = (low + high + 1) // 2
        if model.needed(mid) <= room:
            low = mid
        else:
            high = mid - 1
    return low
