"""Which target suits a GPU, and how doctor says it: devices faked where doctor reads them
(the build and the GPUs ggml reports), the catalog as shipped."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localspec.backend import devices as device_module
from localspec.backend.devices import BuildInfo, Device
from localspec.cli.app import app
from localspec.machine.placement import FREE_SHARE
from localspec.machine.suggest import planned_bytes, suggest_target
from localspec.models.catalog import load_catalog

GB = 10**9


def gpu(free_gb: float, name: str = "CUDA0") -> Device:
    return Device(name, "NVIDIA H100", "gpu", "CUDA", int(free_gb * GB), 80 * GB)


@pytest.mark.parametrize(
    ("free_gb", "target"),
    [
        (2.5, None),  # not even the 1.5B target fits with its draft
        (4.0, "qwen2.5-coder-1.5b"),
        (8.0, "qwen2.5-coder-7b"),
        (16.0, "qwen2.5-coder-14b"),
        (30.0, "qwen2.5-coder-32b"),
    ],
)
def test_the_largest_target_that_fits_with_its_draft_is_suggested(free_gb, target):
    found = suggest_target([gpu(1.0, "CUDA1"), gpu(free_gb)])
    if target is None:
        assert found is None
        return
    assert found is not None and found.target == target and found.device == "CUDA0"
    catalog = load_catalog()
    pair = planned_bytes(catalog.models[target].size) + planned_bytes(
        catalog.models[found.draft].size
    )
    assert found.need == pair <= found.room == int(free_gb * GB * FREE_SHARE)
    assert found.draft == catalog.defaults.draft
    assert ("7B" in found.reason) == (target != catalog.defaults.target)


def test_no_gpu_no_suggestion():
    assert suggest_target([]) is None


def test_a_longer_context_needs_more_room():
    assert planned_bytes(GB, 16384) > planned_bytes(GB) > GB


def _fake_gpu_build(monkeypatch, found: list[Device]) -> None:
    from localspec.session import plan as plan_module

    real = device_module.build_info()
    monkeypatch.setattr(
        device_module,
        "build_info",
        lambda: BuildInfo(real.llama_cpp_python, ("CPU", "CUDA"), True, real.rpc, "CUDA"),
    )
    monkeypatch.setattr(plan_module, "gpu_devices", lambda: found)
    monkeypatch.setattr(plan_module, "gpu_hardware", lambda: None)


def test_doctor_suggests_a_target_for_the_gpu_and_says_how_it_verifies(monkeypatch, tiny_pair):
    target, draft, _ = tiny_pair
    _fake_gpu_build(monkeypatch, [gpu(10.0)])
    args = ["doctor", "--json", "--target", str(target), "--draft", str(draft)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["suggestion"]["target"] == "qwen2.5-coder-7b"
    assert any(n.startswith("for this GPU: --target qwen2.5-coder-7b") for n in report["notes"])
    # The tiny target goes whole onto the faked GPU, so auto verifies on the device.
    assert report["verification"] == {
        **report["verification"],
        "greedy": "device",
        "setting": "auto",
    }
    monkeypatch.setenv("LOCALSPEC_DEVICE_VERIFY", "0")
    text = CliRunner().invoke(app, args[:1] + args[2:]).output
    assert "verification     greedy on the host" in text
    assert "note: for this GPU: --target qwen2.5-coder-7b (with qwen2.5-coder-0.5b" in text


def test_doctor_suggests_nothing_for_a_cpu_build_nor_a_bad_switch(monkeypatch, tiny_pair):
    target, draft, _ = tiny_pair
    args = ["doctor", "--json", "--target", str(target), "--draft", str(draft)]
    monkeypatch.setenv("LOCALSPEC_DEVICE_VERIFY", "yes")
    result = CliRunner().invoke(app, args)
    report = json.loads(result.output)
    assert result.exit_code == 1 and report["suggestion"] is None
    assert any("LOCALSPEC_DEVICE_VERIFY='yes' is neither" in p for p in report["problems"])
    monkeypatch.setenv("LOCALSPEC_DEVICE_VERIFY", "auto")
    report = json.loads(CliRunner().invoke(app, args).output)
    assert report["verification"]["greedy"] == "host"  # a CPU build: the target on the CPU
    assert "runs on the CPU" in report["verification"]["why"]
