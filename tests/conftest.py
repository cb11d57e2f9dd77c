"""Shared fixtures. No test reads the user's real cache or config: every test runs with
LOCALSPEC_HOME and HF_HOME in a temporary directory. Slow tests (marker ``slow``) use the
real default pair from a test-only cache in the repository (``.test-cache/``, fetched from
its PyPI source on first use)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_MODEL_HOME = Path(os.environ.get("LOCALSPEC_TEST_HOME", REPO / ".test-cache"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a llama.cpp build with a GPU backend that sees a device."""
    wanting = [item for item in items if "gpu" in item.keywords]
    if not wanting:
        return
    from localspec.backend.devices import compiled_backends, gpu_devices

    if gpu_devices():
        return
    skip = pytest.mark.skip(
        reason=f"no GPU: this llama.cpp build has {', '.join(compiled_backends())} and sees no "
        "GPU device (LOCALSPEC_BACKEND=cuda|vulkan|metal bash scripts/setup.sh builds one)"
    )
    for item in wanting:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def isolated_session_home(tmp_path_factory):
    """Fixtures wider than one test (a module's session, a server) are set up before the
    per-test home below exists: they get a temporary home of their own."""
    base = tmp_path_factory.mktemp("session-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_HOME", str(base / "home"))
        mp.setenv("HF_HOME", str(base / "hf"))
        yield base / "home"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "home"


@pytest.fixture(autouse=True)
def hub_publishes(monkeypatch):
    """The sha256 the (fake) Hub publishes per ``(repo, filename)``. By default it is the
    digest of the file a test's fake download served, as an honest Hub's would be; a test
    sets another to play a Hub whose file does not match. No test reaches the real Hub."""
    from localspec.models import fetch, paths, transfer

    published: dict[tuple[str, str], str] = {}

    def sha256(repo: str, filename: str, revision: str | None) -> str:
        if (repo, filename) in published:
            return published[(repo, filename)]
        served = list(paths.cache_root().glob(f"downloads/*/hub/{filename}"))
        assert served, f"no fake download of {repo}/{filename} to publish a digest for"
        return transfer.sha256_file(served[0])

    monkeypatch.setattr(fetch, "_hub_sha256", sha256)
    return published


@pytest.fixture
def no_hub(monkeypatch):
    """Fail any test that would reach the Hugging Face Hub."""
    from localspec.models import fetch

    def refuse(**kwargs):
        raise AssertionError("the Hub was called")

    monkeypatch.setattr(fetch, "_hf_hub_download", refuse)


@pytest.fixture
def no_pip(monkeypatch):
    """Fail any test that would download from the package index."""
    from localspec.models import pypi

    def refuse(package, version, directory):
        raise AssertionError("pip was called")

    monkeypatch.setattr(pypi, "_pip_download", refuse)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A compatible tiny target/draft pair and an incompatible draft, written by the test."""
    from tests.tiny_gguf import write_tiny_llama

    d = tmp_path_factory.mktemp("tiny")
    target = write_tiny_llama(d / "target.gguf", seed=1)
    draft = write_tiny_llama(d / "draft.gguf", seed=2)
    alien = write_tiny_llama(d / "alien.gguf", seed=1, vocab=["▁zzz", "▁qqq", "xy"])
    return target, draft, alien


@pytest.fixture(scope="session")
def fim_pair(tmp_path_factory):
    """A compatible tiny target/draft pair whose vocabulary has Qwen2.5-Coder's FIM tokens."""
    from tests.tiny_gguf import QWEN_FIM, write_tiny_llama

    d = tmp_path_factory.mktemp("tiny-fim")
    target = write_tiny_llama(d / "fim-target.gguf", seed=1, fim=QWEN_FIM)
    draft = write_tiny_llama(d / "fim-draft.gguf", seed=2, fim=QWEN_FIM)
    return target, draft


@pytest.fixture(scope="session")
def real_pair_home():
    """LOCALSPEC_HOME holding the real default pair (downloaded once per test cache)."""
    from localspec.models.catalog import resolve_model

    old = os.environ.get("LOCALSPEC_HOME")
    os.environ["LOCALSPEC_HOME"] = str(TEST_MODEL_HOME)
    try:
        target = resolve_model(None, "target", progress=False)
        draft = resolve_model(None, "draft", progress=False)
    finally:
        if old is None:
            del os.environ["LOCALSPEC_HOME"]
        else:
            os.environ["LOCALSPEC_HOME"] = old
    return TEST_MODEL_HOME, target, draft
