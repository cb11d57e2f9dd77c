"""GPU placement: the auto policy, explicit requests and their errors, the notices, and what
depends on where the models run (cost and learning keys, doctor). The device list is faked
at its boundary (``backend.devices``); a test with the ``gpu`` marker loads a model onto a
real GPU where the build and the machine have one."""

from __future__ import annotations

import json
import os

import pytest

from localspec.backend.devices import Device, Hardware
from localspec.errors import UsageError
from localspec.machine import placement as placing
from localspec.machine.placement import ALL, AUTO, parse_layers, place
from localspec.models.resources import GPU_COMPUTE_ALLOWANCE, Footprint, footprint, human
from localspec.progress import Progress, ProgressKind

GIB = 1024**3
TARGET = Footprint(layers=29, weights=int(1.0 * GIB), kv=112 << 20)
DRAFT = Footprint(layers=25, weights=int(0.46 * GIB), kv=48 << 20)
CUDA = Hardware("cuda", "NVIDIA GPU (driver found)")


def gpu(free_gib: float, name: str = "CUDA0") -> Device:
    return Device(name, "NVIDIA GeForce RTX 4060", "gpu", "CUDA", int(free_gib * GIB), 8 * GIB)


def test_auto_puts_the_whole_pair_on_a_gpu_with_room():
    placement = place(AUTO, AUTO, TARGET, DRAFT, [gpu(7.5)])
    assert (placement.target.layers, placement.draft.layers) == (29, 25)
    assert placement.target.n_gpu_layers == -1 and placement.draft.n_gpu_layers == -1
    assert placement.notices == ()
    assert placement.summary() == (
        "target on CUDA0 (all of 29 layers), draft on CUDA0 (all of 25 layers)"
    )
    assert placement.reason == (
        f"CUDA0 has {human(int(7.5 * GIB))} free; the target needs {human(TARGET.needed(29))} there"
    )


def test_the_draft_stays_on_the_cpu_when_only_the_target_fits():
    room = (TARGET.needed(29) + DRAFT.needed(25) // 2) / placing.FREE_SHARE / GIB
    placement = place(AUTO, AUTO, TARGET, DRAFT, [gpu(room)])
    assert placement.target.layers == 29
    assert placement.draft.layers == 0 and placement.draft.device == "CPU"
    (notice,) = placement.notices
    assert notice.startswith("the draft stays on the CPU")


def test_a_target_too_large_for_the_gpu_offloads_the_layers_that_fit():
    room_gib = (TARGET.needed(12) + 1000) / placing.FREE_SHARE / GIB
    placement = place(AUTO, AUTO, TARGET, DRAFT, [gpu(room_gib)])
    assert placement.target.layers == 12
    assert placement.target.n_gpu_layers == 12
    assert placement.draft.layers == 0
    assert any("only 12 of the target's 29 layers fit" in n for n in placement.notices)


def test_a_gpu_without_room_for_one_layer_leaves_the_pair_on_the_cpu():
    placement = place(AUTO, AUTO, TARGET, DRAFT, [gpu(0.3)])
    assert not placement.target.on_gpu and not placement.draft.on_gpu
    assert any("target stays on the CPU" in n for n in placement.notices)


def test_no_gpu_stays_quiet_unless_the_machine_has_one_the_build_cannot_use():
    quiet = place(AUTO, AUTO, TARGET, DRAFT, [])
    assert quiet.notices == ()
    assert quiet.reason == "this llama.cpp build has no GPU backend with a device"
    assert quiet.key() == ()
    loud = place(AUTO, AUTO, TARGET, DRAFT, [], CUDA)
    (notice,) = loud.notices
    assert "cannot use it" in notice and "LOCALSPEC_BACKEND=cuda bash scripts/setup.sh" in notice


def test_explicit_layers_without_a_gpu_are_an_error_with_the_rebuild_hint():
    with pytest.raises(UsageError) as err:
        place(10, AUTO, TARGET, DRAFT, [], CUDA)
    assert "--gpu-layers 10" in err.value.message
    assert "LOCALSPEC_BACKEND=cuda" in err.value.hint
    with pytest.raises(UsageError, match="--draft-gpu-layers all"):
        place(AUTO, ALL, TARGET, DRAFT, [])


def test_more_layers_than_fit_is_an_error_that_says_how_many_do():
    room_gib = (TARGET.needed(12) + 1000) / placing.FREE_SHARE / GIB
    with pytest.raises(UsageError) as err:
        place(ALL, AUTO, TARGET, DRAFT, [gpu(room_gib)])
    assert "--gpu-layers all: 29 of the target's layers need about" in err.value.message
    assert err.value.hint == "use --gpu-layers auto, or at most 12"
    assert place(12, 0, TARGET, DRAFT, [gpu(room_gib)]).target.layers == 12


def test_zero_keeps_the_pair_on_the_cpu_and_the_draft_can_be_kept_there_alone():
    cpu = place(0, AUTO, TARGET, DRAFT, [gpu(7.5)])
    assert not cpu.target.on_gpu and not cpu.draft.on_gpu
    assert cpu.reason == "--gpu-layers 0 keeps the target on the CPU"
    split = place(AUTO, 0, TARGET, DRAFT, [gpu(7.5)])
    assert split.target.layers == 29 and split.draft.device == "CPU"
    assert split.summary() == "target on CUDA0 (all of 29 layers), draft on CPU"


def test_memory_of_every_gpu_counts_and_rpc_workers_are_not_gpus():
    two = place(AUTO, AUTO, TARGET, DRAFT, [gpu(0.9, "CUDA0"), gpu(0.9, "CUDA1")])
    assert two.target.layers == 29 and two.target.device == "CUDA0+CUDA1"
    worker = Device("RPC[10.0.0.2:50052]", "remote", "gpu", "RPC", 8 * GIB, 8 * GIB)
    assert not worker.is_gpu
    metal = Device("Metal", "Apple M2", "igpu", "Metal", 10 * GIB, 16 * GIB)
    assert metal.is_gpu


def test_placement_key_is_empty_on_the_cpu_and_names_device_and_layers_on_a_gpu():
    assert place(AUTO, AUTO, TARGET, DRAFT, []).key() == ()
    on_gpu = place(AUTO, AUTO, TARGET, DRAFT, [gpu(7.5)])
    assert on_gpu.key() == (
        ("CUDA0", 29), ("CUDA0", 25), ("NVIDIA GeForce RTX 4060", 8 * GIB)
    )  # fmt: skip


def test_costs_measured_on_one_gpu_are_not_another_gpus(tiny_pair):
    """A home shared by machines whose first GPU ggml calls CUDA0 on both."""
    from localspec.machine.costcache import costs_key
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft))
    big = Device("CUDA0", "NVIDIA A100-SXM4-80GB", "gpu", "CUDA", 70 * GIB, 80 * GIB)
    keys = {
        costs_key(options, place(AUTO, AUTO, TARGET, DRAFT, [card]), target, draft)
        for card in (gpu(7.5), big, gpu(6.0))  # the same card with less free: the same key
    }
    assert len(keys) == 2


@pytest.mark.parametrize(
    ("text", "layers"),
    [(None, AUTO), ("auto", AUTO), ("ALL", ALL), ("-1", ALL), ("0", 0), ("33", 33)],
)
def test_parse_layers(text, layers):
    assert parse_layers(text) == layers


@pytest.mark.parametrize("text", ["many", "-2", "1.5", ""])
def test_parse_layers_refuses_anything_else(text):
    with pytest.raises(UsageError, match="invalid --gpu-layers"):
        parse_layers(text)


def test_footprint_reads_layers_and_kv_from_the_file(tiny_pair):
    target, _, _ = tiny_pair
    shape = footprint(target, 1024)
    # 2 blocks + the output layer; f16 K and V: 2 kv heads x 16 dims x 2 x 2 bytes per cell
    assert shape.layers == 3
    assert shape.kv == 2 * 1024 * 2 * 16 * 2 * 2
    assert shape.weights == target.stat().st_size
    assert shape.needed(0) == 0
    assert shape.needed(3) == shape.weights + shape.kv + GPU_COMPUTE_ALLOWANCE


# -- what depends on the placement --------------------------------------------------------


def _fake_devices(monkeypatch, found, hardware=None):
    from localspec.session import plan as plan_module

    monkeypatch.setattr(plan_module, "gpu_devices", lambda: [d for d in found if d.is_gpu])
    monkeypatch.setattr(plan_module, "gpu_hardware", lambda: hardware)


def test_plan_placement_uses_the_devices_and_rpc_keeps_the_draft_here(monkeypatch, tiny_pair):
    from localspec.session.pair import ModelOptions
    from localspec.session.plan import plan_placement

    target, draft, _ = tiny_pair
    _fake_devices(monkeypatch, [gpu(4)])
    plan = plan_placement(ModelOptions(), target, draft)
    assert plan.target.layers == 3 and plan.draft.layers == 3
    rpc = plan_placement(ModelOptions(rpc=("127.0.0.1:50052",)), target, draft)
    assert rpc.target.device == "RPC workers" and rpc.target.layers == 3
    assert rpc.draft.device == "CPU"


def test_costs_are_kept_per_placement_and_cpu_keys_do_not_move(monkeypatch, tiny_pair):
    from localspec.machine.costcache import costs_key
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    options = ModelOptions()
    cpu = place(AUTO, AUTO, footprint(target, 4096), footprint(draft, 4096), [])
    on_gpu = place(AUTO, AUTO, footprint(target, 4096), footprint(draft, 4096), [gpu(4)])
    draft_here = place(AUTO, 0, footprint(target, 4096), footprint(draft, 4096), [gpu(4)])
    keys = {costs_key(options, p, target, draft) for p in (cpu, on_gpu, draft_here)}
    assert len(keys) == 3
    # The key a CPU-only pair had before placement existed (0 layers offloaded).
    from localspec.machine.calibrate import DRAFT_SIZES, file_identity, machine_key

    threads = os.cpu_count()
    legacy = machine_key(
        file_identity(target), file_identity(draft), threads, 0, True, 4096, DRAFT_SIZES
    )
    assert costs_key(options, cpu, target, draft) == legacy


def test_a_session_on_the_cpu_says_why_and_warns_only_when_a_gpu_is_idle(monkeypatch, tiny_pair):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256, calibrate=False)
    for hardware, expected in ((None, []), (CUDA, ["cannot use it"])):
        _fake_devices(monkeypatch, [], hardware)
        said: list[Progress] = []
        session = open_session(options, on_progress=said.append)
        try:
            assert session.placement.summary() == "target on CPU, draft on CPU"
            warnings = [p.text for p in said if p.kind is ProgressKind.WARNING]
            assert len(warnings) == len(expected)
            for text, words in zip(warnings, expected, strict=True):
                assert words in text
        finally:
            session.close()


def test_asking_for_layers_no_gpu_can_take_fails_before_any_load(monkeypatch, tiny_pair):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    _fake_devices(monkeypatch, [])
    options = ModelOptions(target=str(target), draft=str(draft), n_gpu_layers=5, calibrate=False)
    with pytest.raises(UsageError, match="no GPU to offload layers to"):
        open_session(options)


# -- doctor -------------------------------------------------------------------------------


def test_doctor_json_lists_build_devices_and_where_the_pair_would_run(monkeypatch, tiny_pair):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, draft, _ = tiny_pair
    _fake_devices(monkeypatch, [gpu(6)])
    result = CliRunner().invoke(
        app, ["doctor", "--json", "--target", str(target), "--draft", str(draft)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True and report["problems"] == []
    assert "CPU" in report["build"]["backends"]
    assert isinstance(report["build"]["system_info"], str) and report["build"]["system_info"]
    assert any(d["type"] == "cpu" for d in report["devices"])
    placement = report["pair"]["placement"]
    assert placement["target"] == {"device": "CUDA0", "gpu_layers": 3, "layers": 3}
    assert report["pair"]["plain_step_ms"] is None  # nothing measured in this home yet
    assert report["home"].endswith("home")


def test_doctor_text_and_a_home_it_cannot_write_is_a_failure(monkeypatch, tmp_path, tiny_pair):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, draft, _ = tiny_pair
    _fake_devices(monkeypatch, [], CUDA)
    args = ["doctor", "--target", str(target), "--draft", str(draft)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "would run        target on CPU, draft on CPU" in result.output
    assert "note: this machine has an NVIDIA GPU (driver found), but this llama.cpp" in (
        result.output
    )
    assert result.output.rstrip().endswith("localspec can run here")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LOCALSPEC_HOME", str(blocker / "home"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "problem: the localspec home" in result.output and "not writable" in result.output
    assert result.output.rstrip().endswith("localspec cannot run here")


def test_bad_gpu_layers_on_the_command_line_is_a_usage_error(tiny_pair):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, _, _ = tiny_pair
    result = CliRunner().invoke(
        app, ["complete", "--target", str(target), "--drafter", "none", "--gpu-layers", "most"]
    )
    assert result.exit_code == 2, result.output
    assert "error: invalid --gpu-layers 'most'" in result.output


# -- a real GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_auto_offloads_a_real_model_to_the_gpu(tiny_pair):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    session = open_session(
        ModelOptions(target=str(target), draft=str(draft), n_ctx=256, calibrate=False)
    )
    try:
        assert session.placement.target.on_gpu and session.placement.draft.on_gpu
        tokens = session.target.tokenize("hello", add_special=False)
        assert session.target.forward(tokens, 1).shape == (1, session.target.n_vocab)
    finally:
        session.close()


# -- which draft a target gets ------------------------------------------------------------


def test_a_catalog_target_gets_its_own_familys_draft_or_none(monkeypatch, tmp_path):
    from localspec.models import catalog
    from localspec.session import pair as pair_module

    resolved: list[tuple[str | None, str]] = []

    def fake_resolve(ref, role, **_):
        resolved.append((ref, role))
        return tmp_path / f"{ref or 'default-' + role}.gguf"

    monkeypatch.setattr(catalog, "resolve_model", fake_resolve)
    options = pair_module.ModelOptions
    _, draft = pair_module.resolve_pair(options(target="llama-3.1-8b"))
    assert resolved[-1] == ("llama-3.2-1b", "draft") and draft.name == "llama-3.2-1b.gguf"
    _, draft = pair_module.resolve_pair(options(target="smollm2-135m"))
    assert draft is None and resolved[-1] == ("smollm2-135m", "target")
    pair_module.resolve_pair(options(target="/models/any.gguf"))
    assert resolved[-1] == (None, "draft")  # a file: the catalog's default draft
    pair_module.resolve_pair(options(target="smollm2-135m", draft="qwen2.5-coder-0.5b"))
    assert resolved[-1] == ("qwen2.5-coder-0.5b", "draft")  # --draft always wins


def test_doctor_reports_missing_truncated_and_crafted_models_and_survives_its_calibration_dir(
    monkeypatch, tmp_path, tiny_pair, isolated_home
):
    from typer.testing import CliRunner

    from localspec.cli.app import app
    from tests.test_gguf_header import with_block_count

    target, draft, _ = tiny_pair
    _fake_devices(monkeypatch, [])
    calibration = isolated_home / "calibration"
    calibration.mkdir(parents=True)
    (calibration / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    (calibration / "huge.json").write_text('{"plain_s": 1' + "0" * 400 + ', "verify_s": {}}')
    (calibration / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (calibration / "inf.json").write_text('{"plain_s": 1e999, "verify_s": {"1": 0.1}}')
    (calibration / "good.json").write_text('{"plain_s": 0.05, "verify_s": {"1": 0.07}}')
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    crafted = with_block_count(tmp_path / "crafted.gguf", 1_000_000)
    cases = {
        str(tmp_path / "missing.gguf"): "model file not found",
        str(truncated): "is truncated",
        str(crafted): "block count of 1000000",
    }
    for model, says in cases.items():
        result = CliRunner().invoke(
            app, ["doctor", "--json", "--target", model, "--draft", str(draft)]
        )
        assert result.exit_code == 1, result.output
        report = json.loads(result.output)
        assert any(p.startswith("target: ") and says in p for p in report["problems"]), report
    result = CliRunner().invoke(app, ["doctor", "--target", str(target), "--draft", str(draft)])
    assert result.exit_code == 0, result.output
    assert "plain step 50.0 ms" in result.output
    ignored = [line for line in result.output.splitlines() if "ignoring cached step" in line]
    assert len(ignored) == 4, result.output


def test_a_target_file_of_another_tokenizer_never_fetches_the_default_draft(monkeypatch, tiny_pair):
    """Its header says the catalog's default draft cannot draft for it: no download only to
    refuse it; auto answers without a draft model, and the user is told why."""
    from localspec.models import fetch
    from localspec.session import pair as pair_module

    def no_fetch(*args, **kwargs):
        raise AssertionError("the default draft was fetched")

    monkeypatch.setattr(fetch, "pull", no_fetch)
    target, _, _ = tiny_pair  # a SentencePiece ("llama") tokenizer, not Qwen2's
    said: list = []
    path, draft = pair_module.resolve_pair(pair_module.ModelOptions(target=str(target)),
                                           said.append)  # fmt: skip
    assert path == target and draft is None
    assert any("does not share" in getattr(p, "text", str(p)) for p in said), said

    from localspec.core.params import GenerationParams
    from localspec.session.open import open_session

    session = open_session(pair_module.ModelOptions(target=str(target), threads=1, n_ctx=256))
    try:
        assert session.draft_path is None
        events = list(session.complete("the cat", GenerationParams(max_tokens=4)))
        assert events[-1].token_ids
    finally:
        session.close()


def test_a_target_file_of_the_default_drafts_tokenizer_gets_the_default_draft(
    monkeypatch, tiny_pair
):
    from localspec.models import catalog, gguf
    from localspec.session import pair as pair_module

    target, _, _ = tiny_pair
    resolved: list = []

    def fake_resolve(ref, role, **_):
        resolved.append((ref, role))
        return target

    monkeypatch.setattr(catalog, "resolve_model", fake_resolve)
    monkeypatch.setattr(catalog, "locate_model", lambda ref, role="target": None)
    monkeypatch.setattr(gguf, "read_metadata", lambda path, wanted=None: {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"})  # fmt: skip
    pair_module.resolve_pair(pair_module.ModelOptions(target=str(target)))
    assert resolved[-1] == (None, "draft")  # Qwen2's tokenizer: the default draft fits


@pytest.mark.parametrize("value", [float("inf"), 100_000])
def test_doctor_blames_a_damaged_header_cache_not_a_sound_model_file(monkeypatch, tiny_pair, value):
    """A block count the header cache (headers.json) holds that no model has: the model is
    not reported as damaged, and the cache holds the file's own values again (an infinite
    count is never taken from it; a count past llama.cpp's is read again from the file, and
    a note says the damage was the cache's)."""
    from typer.testing import CliRunner

    from localspec.cli.app import app
    from localspec.models import gguf

    target, draft, _ = tiny_pair
    monkeypatch.setattr(gguf, "_READ_CACHE", {})
    real = gguf.read_metadata(target)  # kept in this home's headers.json
    key = f"{real['general.architecture']}.block_count"
    cache = gguf._cache_file()
    kept = json.loads(cache.read_text())
    kept[str(target.resolve())]["values"][key] = value
    cache.write_text(json.dumps(kept))
    monkeypatch.setattr(gguf, "_READ_CACHE", {})  # a new process
    _fake_devices(monkeypatch, [])
    result = CliRunner().invoke(
        app, ["doctor", "--json", "--target", str(target), "--draft", str(draft)]
    )
    report = json.loads(result.output)
    assert report["problems"] == [], report["problems"]
    noted = [n for n in report["notes"] if "header cache" in n]
    assert bool(noted) is (value != float("inf")), report["notes"]
    fixed = json.loads(cache.read_text())[str(target.resolve())]["values"]
    assert fixed[key] == real[key]
