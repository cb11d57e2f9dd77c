"""The history and the datastores fail safe: settings that reach running processes, private
files, a torn record cut away, crafted stores and state files left out with a warning,
bounded and locked adds, and memory estimates that believe no absurd header."""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from localspec.core.params import GenerationParams
from localspec.errors import DatastoreError, InputError
from localspec.storage.answers import KeptAnswers
from localspec.storage.datastore import _full_crc, _sample_crc
from localspec.storage.history import History, read_records
from localspec.storage.indexing import add_files
from localspec.storage.library import Library
from localspec.storage.sources import SKIP_OUTSIDE, scan

FP = "ab" * 16


def tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def add(paths: list, name: str = "proj", **kw):
    return add_files(Library(), name, FP, "model.gguf", scan(paths, 1 << 20), tokenize, **kw)


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# -- settings read at each use -----------------------------------------------------------------


@pytest.fixture
def session(tiny_pair):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    session = open_session(ModelOptions(target=str(target), draft=str(draft), n_ctx=256,
                                        threads=1))  # fmt: skip
    yield session
    session.close()


def answer(session) -> None:
    params = GenerationParams(max_tokens=24, drafter="auto")
    list(session.complete("the cat sat on the mat", params, raw=True))


def drafted_from(session) -> list[str]:
    return [name for name, _ in session.corpora]


def test_history_off_and_rm_reach_a_running_session(session):
    (answers,) = session.answers
    history = History(answers.directory)
    answer(session)
    assert history.summary()[0] == 1
    # `localspec datastore history off`, typed in another terminal.
    assert Library().set_history(False) == ""
    answer(session)
    assert history.summary()[0] == 1 and drafted_from(session) == []
    Library().set_history(True)
    answer(session)
    assert history.summary()[0] == 2 and drafted_from(session) == ["history"]
    # `localspec datastore rm history`: the next answer drafts from nothing it held.
    assert Library().remove("history")
    answer(session)
    assert drafted_from(session) == []
    assert history.summary()[0] == 1  # that answer starts the history afresh


def test_a_settings_file_that_cannot_be_read_keeps_nothing_and_says_so():
    library = Library()
    library.root.mkdir(parents=True)
    (library.root / "settings.json").write_text("[" * 100_000)
    enabled, problem = library.history_setting()
    assert not enabled and "nested too deep" in problem
    assert KeptAnswers(library, FP).record([1, 2, 3]) == [problem]
    assert History(library.history_dir(FP)).summary() == (0, 0)
    assert library.set_history(True) == "" and library.history_setting() == (True, "")


# -- private files -----------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_history_and_stores_are_private(tmp_path):
    library = Library()
    assert library.record(FP, [1, 2, 3, 4]) == ""
    KeptAnswers(library, FP).corpora()  # builds the index files
    add([tree(tmp_path / "proj", {"a.py": "secret = 1"})])
    directories = [library.root, library.root / "history", library.history_dir(FP),
                   library.root / "proj"]  # fmt: skip
    assert [oct(mode(d)) for d in directories] == [oct(0o700)] * len(directories)
    files = [p for d in directories[2:] for p in d.iterdir() if p.is_file()]
    assert len(files) >= 6
    assert {p.name: oct(mode(p)) for p in files} == {p.name: oct(0o600) for p in files}


def test_an_older_world_readable_log_is_tightened(tmp_path):
    library = Library()
    directory = library.history_dir(FP)
    directory.mkdir(parents=True, mode=0o755)
    (directory / "log.bin").write_bytes(b"")
    os.chmod(directory / "log.bin", 0o644)
    assert library.record(FP, [1, 2, 3]) == ""
    assert mode(directory) == 0o700 and mode(directory / "log.bin") == 0o600


# -- the history's log -------------------------------------------------------------------------


def test_a_torn_record_is_cut_away_before_the_next_answer(tmp_path):
    history = History(tmp_path / "h")
    history.append([1, 2, 3])
    with open(history.log, "ab") as fh:  # the disk filled up half-way through a record
        fh.write(struct.pack("<II", 5, 0) + b"\x07\x00")
    history.append([4, 5, 6])
    history.append([7, 8])
    records, end = read_records(history.log)
    assert [r.tolist() for r in records] == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert end == history.log.stat().st_size
    (index,) = history.open()
    assert index.documents == 3


def test_a_write_that_fails_leaves_no_torn_record(tmp_path, monkeypatch):
    history = History(tmp_path / "h")
    history.append([1, 2, 3])
    size = history.log.stat().st_size
    real_open = os.fdopen

    class Full:
        def __init__(self, fh) -> None:
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.fh.close()

        def fileno(self) -> int:
            return self.fh.fileno()

        def write(self, data: bytes) -> None:
            self.fh.write(data[:6])
            self.fh.flush()
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            self.fh.flush()

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(real_open(fd, mode)))
    with pytest.raises(OSError, match="No space"):
        history.append([4, 5, 6])
    monkeypatch.undo()
    assert history.log.stat().st_size == size


# -- stores whose checksums match but whose contents do not -------------------------------------


def rewrite(directory: Path, name: str, array: np.ndarray) -> None:
    """Replace one array of a saved index, with a manifest whose checksums match it."""
    path = directory / name
    np.save(path, array, allow_pickle=False)
    manifest = json.loads((directory / "manifest.json").read_text())
    size = path.stat().st_size
    manifest["files"][name] = {"bytes": size, "sample_crc32": _sample_crc(path, size),
                               "crc32": _full_crc(path)}  # fmt: skip
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", ["past the end", "negative", "a separator", "token ids"])
def test_a_store_with_positions_out_of_range_is_left_out(tmp_path, damage):
    add([tree(tmp_path / "proj", {"a.py": "def add(a, b):\n    return a + b\n"})])
    add([tree(tmp_path / "good", {"b.py": "def sub(a, b):\n    return a - b\n"})], name="good")
    directory = Library().root / "proj"
    tokens = np.load(directory / "tokens.npy")
    suffixes = np.load(directory / "suffixes.npy")
    if damage == "past the end":
        suffixes[3] = len(tokens) + 1000
    elif damage == "negative":
        suffixes[3] = -5
    elif damage == "a separator":
        suffixes[3] = 0
    if damage == "token ids":
        tokens[4] = -7
        rewrite(directory, "tokens.npy", tokens)
    else:
        rewrite(directory, "suffixes.npy", suffixes)
    opened = Library().open(FP)
    assert [name for name, _ in opened.stores] == ["good"]
    assert len(opened.warnings) == 1 and "'proj' is damaged" in opened.warnings[0]
    with pytest.raises(DatastoreError, match="damaged"):
        Library().index("proj")


# -- what datastore add reads -------------------------------------------------------------------


def test_links_out_of_the_added_tree_are_skipped(tmp_path):
    secret = tmp_path / "elsewhere" / "credentials"
    secret.parent.mkdir()
    secret.write_text("password=hunter2")
    root = tree(tmp_path / "proj", {"a.py": "x = 1", "sub/b.py": "y = 2"})
    (root / "leak.txt").symlink_to(secret)
    (root / "sub" / "inside.py").symlink_to(root / "a.py")  # stays in the tree: read
    found = scan([root], 1 << 20)
    paths = sorted(Path(s.path).name for s in found)
    assert paths == ["a.py", "b.py", "inside.py"]
    assert found.skipped[SKIP_OUTSIDE] == 1
    # Two roots: a link from one into the other stays inside what was given.
    other = tree(tmp_path / "other", {"c.py": "z = 3"})
    (other / "to-proj.py").symlink_to(root / "a.py")
    both = scan([other, root], 1 << 20)
    assert "to-proj.py" in {Path(s.path).name for s in both}


def test_a_very_deep_tree_is_walked(tmp_path):
    deep = tmp_path / "proj"
    levels = [deep]
    deep.mkdir()
    for _ in range(1100):  # deeper than the interpreter's recursion limit
        levels.append(levels[-1] / "d")
        os.mkdir(levels[-1])  # one at a time: Path.mkdir(parents=True) itself recurses
    (levels[-1] / "bottom.txt").write_text("found")
    (deep / "top.txt").write_text("also")
    try:
        found = sorted(Path(s.path).name for s in scan([deep], 1 << 20))
        assert found == ["bottom.txt", "top.txt"]
    finally:  # bottom up: shutil.rmtree, which cleans tmp_path, recurses too
        (levels[-1] / "bottom.txt").unlink()
        for level in reversed(levels[1:]):
            os.rmdir(level)


def test_an_add_stops_past_its_token_limit_writing_nothing(tmp_path):
    root = tree(tmp_path / "proj", {f"{i}.txt": "x" * 100 for i in range(10)})
    with pytest.raises(InputError, match="more than 250 tokens") as err:
        add([root], max_tokens=250)
    assert "--max-tokens" in err.value.hint
    assert Library().names() == []
    assert add([root], max_tokens=1000).tokens == 1000


def test_two_adds_of_one_store_do_not_run_at_once(tmp_path):
    root = tree(tmp_path / "proj", {"a.py": "x = 1"})
    Library().root.mkdir(parents=True)
    held = FileLock(str(Library().root / ".proj.lock"))  # another add holds the store
    with held, pytest.raises(DatastoreError, match="another `localspec datastore add`"):
        add([root])
    assert add([root]).indexed == 1


def test_listing_shows_source_paths_as_text(tiny_pair, tmp_path):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    root = tree(tmp_path / "a[/]b[bold]", {"a.py": "x = 1"})
    add([root])
    result = CliRunner().invoke(app, ["datastore", "list"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "a[/]b[bold]" in result.stdout


# -- state files ---------------------------------------------------------------------------------

CRAFTED = {
    "nested": "[" * 100_000 + "]" * 100_000,
    "huge int": '{"format": 3, "plain_s": ' + "9" * 400 + "}",
    "too long": '{"x": ' + "9" * 5000 + "}",
    "overflow": None,  # filled per file with a number too large for a float
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_crafted_state_files_are_ignored_with_a_warning(tmp_path, kind):
    from localspec.machine.calibrate import CostCache
    from localspec.storage.fingerprint import _read_checked
    from localspec.storage.learning import LearningStore

    big = "1" + "0" * 400
    costs = CRAFTED[kind] or f'{{"plain_s": {big}, "verify_s": {{"1": {big}}}}}'
    learned = CRAFTED[kind] or f'{{"format": 2, "pair": "k", "learned": {{"copies": {big}}}}}'
    cache = CostCache(tmp_path / "c")
    cache.directory.mkdir()
    cache.path("k").write_text(costs)
    profile, problem = cache.load_checked("k")
    assert profile is None and problem.startswith("ignoring cached step costs")
    store = LearningStore(tmp_path / "l")
    store.directory.mkdir()
    store.path("k").write_text(learned)
    data, problem = store.load("k")
    assert data is None and problem.startswith("ignoring") and "learned state" in problem
    if kind in ("nested", "too long"):  # files that are not JSON at all
        (tmp_path / "fp.json").write_text(CRAFTED[kind])
        assert _read_checked(tmp_path / "fp.json")[1]
        library = Library(tmp_path / "lib")
        library.root.mkdir()
        (library.root / "settings.json").write_text(CRAFTED[kind])
        assert library.history_setting()[1]


def test_crafted_state_files_do_not_stop_complete(tiny_pair, isolated_home):
    """What the session reads at start (calibration, learned state, settings, fingerprints),
    each crafted: the answer is written, with a warning for each."""
    target, draft, _ = tiny_pair
    args = [sys.executable, "-m", "localspec.cli.app", "complete", "--max-tokens", "8",
            "--target", str(target), "--draft", str(draft), "--ctx", "256",
            "--threads", "1"]  # fmt: skip
    env = {**os.environ, "LOCALSPEC_HOME": str(isolated_home)}
    first = subprocess.run(args, input=b"the cat", capture_output=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr.decode()
    big = "1" + "0" * 400
    for path in (isolated_home / "calibration").glob("*.json"):
        path.write_text(f'{{"plain_s": {big}, "verify_s": {{"1": {big}}}}}')
    for path in (isolated_home / "learning").glob("*.json"):
        pair = json.loads(path.read_text())["pair"]
        ngram = f'{{"copies": [{big}, 1], "streaks": {{}}}}'
        path.write_text(f'{{"format": 3, "pair": "{pair}", "learned": {{"drafters": '
                        f'{{"ngram": {ngram}}}}}}}')  # fmt: skip
    datastores = isolated_home / "datastores"
    (datastores / "settings.json").write_text("[" * 100_000)
    (datastores / "fingerprints.json").write_text("[" * 100_000)
    second = subprocess.run(args, input=b"the cat", capture_output=True, env=env, timeout=120)
    stderr = second.stderr.decode()
    assert second.returncode == 0, stderr
    assert "Traceback" not in stderr and second.stdout
    for says in ("cached step costs", "learned state", "history of answers is off",
                 "cache of tokenizer fingerprints"):  # fmt: skip
        assert says in stderr, stderr


# -- the memory estimate -----------------------------------------------------------------------


def test_an_absurd_block_count_counts_as_unreadable(tmp_path):
    from localspec.models import resources
    from tests.test_gguf_header import header, kv_string, s

    def kv_u64(key: str, value: int) -> bytes:
        return s(key) + struct.pack("<IQ", 10, value)

    path = tmp_path / "crafted.gguf"
    path.write_bytes(header(kv_string("general.architecture", "llama"),
                            kv_u64("llama.block_count", 1 << 60),
                            kv_u64("llama.embedding_length", 64),
                            kv_u64("llama.attention.head_count", 4)))  # fmt: skip
    assert resources.kv_cache_bytes(path, 4096) == 0
    assert resources.footprint(path, 4096).layers == 1
    needed, _ = resources.estimate_memory(path, None, 4096)
    assert needed == path.stat().st_size + resources.OVERHEAD_PER_MODEL
