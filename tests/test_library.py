"""The datastore library: stores through add, open, lookups and removal; damaged stores;
the history log (record, reopen, rebuild, cap, opt-outs); tokenizer fingerprints."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from localspec.errors import DatastoreError, InputError, UsageError
from localspec.storage import fingerprint as fp_module
from localspec.storage import history as history_module
from localspec.storage.answers import KeptAnswers
from localspec.storage.history import History, read_records
from localspec.storage.indexing import add_files, default_name
from localspec.storage.library import Library, vocabulary_fingerprint
from localspec.storage.sources import scan

FP = "ab" * 16
OTHER = "cd" * 16


def tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # one token per byte: enough to index and look up


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "proj"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def add(library: Library, paths: list, name: str = "proj", fingerprint: str = FP, **kw):
    return add_files(library, name, fingerprint, "model.gguf", scan(paths, 1 << 20), tokenize, **kw)


def stores_in(library: Library) -> list[str]:
    """What the library's directory holds but the add lock files (kept, as locks are)."""
    return sorted(p.name for p in library.root.iterdir() if not p.name.endswith(".lock"))


def test_add_open_lookup_and_remove(tmp_path):
    root = project(tmp_path, {"a.py": "def add(a, b):\n    return a + b\n", "b.txt": "hello"})
    library = Library()
    result = add(library, [root])
    assert (result.indexed, result.documents, result.replaced) == (2, 2, 0)
    assert result.tokens == len(tokenize("def add(a, b):\n    return a + b\n")) + 5

    manifest = library.manifest("proj")
    assert manifest["tokenizer"] == FP and manifest["sources"] == [str(root)]
    assert manifest["files"] == 2 and manifest["created"] == manifest["updated"]
    opened = library.open(FP)
    assert [name for name, _ in opened.stores] == ["proj"] and opened.warnings == []
    index = opened.stores[0][1]
    match = index.longest_match(tokenize("def add(a"), 16, 2)
    assert match is not None and match.n == 9
    assert index.continuations(match, 4) == [(tuple(tokenize(", b)")), 1)]

    assert library.open(OTHER).stores == []  # another tokenizer's store is left out silently
    assert library.remove("proj") and library.names() == []
    with pytest.raises(UsageError, match="no datastore named 'proj'"):
        library.remove("proj")


def test_adding_again_replaces_changed_files_and_drops_deleted_ones(tmp_path):
    root = project(tmp_path, {"a.py": "old text", "b.py": "gone soon", "c.py": "stays"})
    other = project(tmp_path / "x", {"d.py": "elsewhere"})
    library = Library()
    add(library, [root, other])
    created = library.manifest("proj")["created"]
    (root / "a.py").write_text("new text")
    (root / "b.py").unlink()
    time.sleep(1.1)  # the manifest's times have whole seconds
    result = add(library, [root])
    # a.py and c.py read again (both replace what the store held), b.py dropped
    assert (result.indexed, result.replaced, result.removed, result.documents) == (2, 2, 1, 3)
    index = library.index("proj")
    texts = sorted(bytes(d.tolist()).decode() for d in index.iter_documents())
    assert texts == ["elsewhere", "new text", "stays"]
    manifest = library.manifest("proj")
    assert manifest["created"] == created and manifest["updated"] > created
    assert manifest["sources"] == [str(root), str(other)]


def test_store_of_another_tokenizer_is_refused_and_kept(tmp_path):
    root = project(tmp_path, {"a.py": "text"})
    library = Library()
    add(library, [root])
    with pytest.raises(UsageError, match="another tokenizer"):
        add(library, [root], fingerprint=OTHER)
    with pytest.raises(UsageError, match="another tokenizer") as err:
        library.open(OTHER, ("proj",))
    assert "localspec datastore list" in err.value.hint
    with pytest.raises(UsageError, match="no datastore named 'nope'"):
        library.open(FP, ("proj", "nope"))
    assert library.manifest("proj")["tokenizer"] == FP


def test_no_indexable_file_is_an_input_error_naming_what_was_skipped(tmp_path):
    root = project(tmp_path, {})
    (root / "x.bin").parent.mkdir(parents=True, exist_ok=True)
    (root / "x.bin").write_bytes(b"\0\1")
    with pytest.raises(InputError, match="no indexable file .*1 binary"):
        add(Library(), [root])
    assert Library().names() == []


@pytest.mark.parametrize("name", ["history", "../x", ".hidden", "a/b", "", "x" * 65])
def test_invalid_names_are_usage_errors(tmp_path, name):
    root = project(tmp_path, {"a.py": "text"})
    with pytest.raises(UsageError):
        add(Library(), [root], name=name)


def test_default_name_is_the_base_name_made_valid(tmp_path):
    assert default_name(tmp_path / "my project!") == "my-project-"
    assert default_name(tmp_path / ".config") == "config"
    with pytest.raises(UsageError) as err:
        default_name(Path("/"))
    assert "--name" in err.value.hint


def test_interrupted_add_leaves_the_store_as_it_was(tmp_path):
    root = project(tmp_path, {"a.py": "first", "b.py": "second"})
    library = Library()
    add(library, [root])
    before = sorted((p.name, p.read_bytes()) for p in (library.root / "proj").iterdir())

    def interrupted(text: str) -> list[int]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        add_files(library, "proj", FP, "m", scan([root], 1 << 20), interrupted)
    after = sorted((p.name, p.read_bytes()) for p in (library.root / "proj").iterdir())
    assert after == before
    assert stores_in(library) == ["proj"]  # no temporary directory left


def test_interrupted_swap_puts_the_old_store_back(tmp_path, monkeypatch):
    from localspec.storage import indexing

    root = project(tmp_path, {"a.py": "first"})
    library = Library()
    add(library, [root])
    real_rename = indexing.os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the new store into place
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(indexing.os, "rename", rename)
    (root / "a.py").write_text("second")
    with pytest.raises(KeyboardInterrupt):
        add(library, [root])
    monkeypatch.undo()
    assert [bytes(d.tolist()) for d in library.index("proj").iter_documents()] == [b"first"]
    assert stores_in(library) == ["proj"]


def damage(library: Library, name: str) -> None:
    tokens = library.root / name / "tokens.npy"
    data = bytearray(tokens.read_bytes())
    data[-1] ^= 0xFF
    tokens.write_bytes(bytes(data))


def test_a_damaged_store_is_left_out_with_a_warning(tmp_path):
    library = Library()
    add(library, [project(tmp_path, {"a.py": "text"})])
    add(library, [project(tmp_path / "2", {"b.py": "more"})], name="good")
    damage(library, "proj")
    for names in (None, ("proj", "good")):
        opened = library.open(FP, names)
        assert [name for name, _ in opened.stores] == ["good"]
        assert len(opened.warnings) == 1
        assert (
            "'proj'" in opened.warnings[0] and "localspec datastore rm proj" in opened.warnings[0]
        )
    with pytest.raises(DatastoreError, match="damaged") as err:
        library.index("proj", verify=True)
    assert "localspec datastore rm proj" in err.value.hint
    with pytest.raises(DatastoreError, match="damaged"):
        add(library, [project(tmp_path / "3", {"c.py": "x"})])  # refused before reading
    (library.root / "good" / "store.json").write_text("{not json")
    opened = library.open(FP)
    assert opened.stores == [] and len(opened.warnings) == 2
    info = {i.name: i for i in library.infos()}
    assert info["good"].manifest is None and "store.json" in info["good"].problem


# -- the history ----------------------------------------------------------------------------


def test_record_then_open_indexes_the_answers(tmp_path):
    library = Library()
    assert library.record(FP, [1, 2, 3, 4, 5]) == ""
    assert library.record(FP, [7, 2, 3, 4, 9]) == ""
    assert library.record(OTHER, [2, 3, 4, 8]) == ""  # another tokenizer's history
    assert library.record(FP, [2, 3, 4, 6], client="0123abcd") == ""  # a server client's
    assert library.open(FP).stores == []  # the history is drafted from through KeptAnswers
    corpora, warnings = KeptAnswers(library, FP).corpora()
    assert [name for name, _ in corpora] == ["history"] and warnings == []
    index = corpora[0][1]
    assert (index.documents, len(index)) == (2, 10)
    match = index.longest_match([2, 3, 4], 8, 2)
    assert sorted(index.continuations(match, 1)) == [((5,), 1), ((9,), 1)]
    assert library.has_stores()
    found = sorted((key, client) for key, client, _ in library.histories())
    assert found == [(FP, ""), (FP, "0123abcd"), (OTHER, "")]


def test_answers_after_the_index_are_indexed_in_memory_until_the_tail_is_long(tmp_path):
    history = History(tmp_path / "h", tail_tokens=8)
    history.append([1, 2, 3])
    assert [c.documents for c in history.open()] == [1]
    state = json.loads((tmp_path / "h" / "state.json").read_text())
    history.append([4, 5, 6])
    assert [c.documents for c in history.open()] == [1, 1]  # the saved index, and the tail
    assert json.loads((tmp_path / "h" / "state.json").read_text()) == state  # not rebuilt
    history.append([7, 8, 9, 10, 11, 12])
    assert [c.documents for c in history.open()] == [3]  # the tail grew past 8: rebuilt
    assert History(tmp_path / "h").open()[0].documents == 3


def test_the_history_keeps_the_newest_tokens_and_compacts_its_log(tmp_path):
    history = History(tmp_path / "h", max_tokens=10, tail_tokens=0)
    for start in range(0, 40, 4):
        history.append(list(range(start, start + 4)))
    (index,) = history.open()
    assert [d.tolist() for d in index.iter_documents()] == [[32, 33, 34, 35], [36, 37, 38, 39]]
    records, end = read_records(history.log)
    assert len(records) == 2 and end == history.log.stat().st_size
    history.append(list(range(100, 125)))  # longer than the cap alone: its end is kept
    (index,) = history.open()
    assert [d.tolist() for d in index.iter_documents()] == [list(range(115, 125))]


def test_a_torn_record_ends_the_log_and_is_cut_off(tmp_path):
    history = History(tmp_path / "h", tail_tokens=0)
    history.append([1, 2, 3])
    history.append([4, 5, 6])
    with open(history.log, "r+b") as fh:  # the second record's last token changed
        fh.seek(-4, 2)
        fh.write((99).to_bytes(4, "little"))
    with open(history.log, "ab") as fh:
        fh.write(b"\x05\x00")  # and a record cut short after it
    (index,) = history.open()
    assert [d.tolist() for d in index.iter_documents()] == [[1, 2, 3]]
    assert history.summary() == (1, 3)


def test_a_damaged_history_index_is_rebuilt_from_the_log(tmp_path):
    history = History(tmp_path / "h")
    history.append([1, 2, 3, 4])
    history.open()
    (tmp_path / "h" / "suffixes.npy").write_bytes(b"junk")
    assert [c.documents for c in history.open()] == [1]
    (tmp_path / "h" / "state.json").unlink()
    assert [c.documents for c in history.open()] == [1]


def test_record_never_raises(tmp_path, monkeypatch):
    library = Library()
    assert "not kept" in library.record(FP, [-1, 5])
    assert "not kept" in library.record("../../etc", [1, 2])
    monkeypatch.setattr(history_module.History, "append", _raise_oserror)
    assert "disk full" in library.record(FP, [1, 2])


def _raise_oserror(self, document):
    raise OSError(28, "disk full")


def test_history_opt_outs(tmp_path, monkeypatch):
    library = Library()
    library.record(FP, [1, 2, 3, 4])
    assert library.history_enabled()
    assert library.set_history(False) == ""
    assert not Library().history_enabled()
    assert KeptAnswers(Library(), FP).corpora() == ([], [])  # off: not drafted from either
    named = KeptAnswers(Library(), FP, named=True).corpora()[0]  # unless named
    assert [n for n, _ in named] == ["history"]
    library.set_history(True)
    assert library.history_enabled()
    monkeypatch.setenv("LOCALSPEC_HISTORY", "0")
    assert not library.history_enabled()
    assert library.remove("history") and not library.remove("history")


# -- the session: what it records and drafts from ---------------------------------------------


@pytest.fixture
def vocab_model(tiny_pair):
    from localspec.backend.llama import LlamaModel

    model = LlamaModel(tiny_pair[0], vocab_only=True)
    yield model
    model.close()


@pytest.mark.parametrize(
    ("options", "env", "setting", "records"),
    [
        ({}, None, True, True),
        ({"history": False}, None, True, False),  # --no-history
        ({}, "0", True, False),  # LOCALSPEC_HISTORY=0
        ({}, None, False, False),  # localspec datastore history off
    ],
)
def test_the_session_records_answers_unless_turned_off(
    vocab_model, monkeypatch, options, env, setting, records
):
    from localspec.session.open import _open_stores
    from localspec.session.pair import ModelOptions

    if env is not None:
        monkeypatch.setenv("LOCALSPEC_HISTORY", env)
    Library().set_history(setting)
    kept, _ = _open_stores(vocab_model, ModelOptions(**options), None)
    key = vocabulary_fingerprint(vocab_model)
    for answers in kept:
        assert answers.fingerprint == key
        assert answers.record([5, 6, 7]) == []
    kept = History(Library().history_dir(key)).summary()
    assert kept == ((1, 3) if records else (0, 0))


def test_the_session_drafts_from_the_stores_of_its_tokenizer(vocab_model, tmp_path):
    from localspec.session.open import _open_stores
    from localspec.session.pair import ModelOptions

    key = vocabulary_fingerprint(vocab_model)
    library = Library()
    add(library, [project(tmp_path, {"a.py": "mine"})], fingerprint=key)
    add(library, [project(tmp_path / "o", {"b.py": "other"})], name="other", fingerprint=OTHER)
    library.record(key, [5, 6, 7])
    warnings: list[str] = []
    kept, stores = _open_stores(vocab_model, ModelOptions(), warnings.append)
    assert [name for name, _ in stores] == ["proj"] and warnings == []
    (answers,) = kept
    assert [name for name, _ in answers.corpora()[0]] == ["history"]
    kept, stores = _open_stores(vocab_model, ModelOptions(stores=()), warnings.append)  # --no-store
    assert stores == [] and all(not a.draft for a in kept)
    with pytest.raises(UsageError, match="another tokenizer"):
        _open_stores(vocab_model, ModelOptions(stores=("other",)), None)
    with pytest.raises(UsageError, match="no datastore named"):
        Library().check_exist(("proj", "history", "nope"))


# -- fingerprints --------------------------------------------------------------------------


def fingerprint_of(path: Path, **kw) -> str:
    from localspec.backend.llama import LlamaModel

    model = LlamaModel(path, vocab_only=True)
    try:
        return fp_module.vocabulary_fingerprint(model, **kw)
    finally:
        model.close()


def test_fingerprints_agree_exactly_when_the_vocabularies_do(tiny_pair, tmp_path):
    from tests.tiny_gguf import write_tiny_llama

    target, draft, alien = tiny_pair
    padded = write_tiny_llama(tmp_path / "padded.gguf", seed=1, n_vocab=400)
    no_bos = write_tiny_llama(tmp_path / "no-bos.gguf", seed=1, add_bos=False)
    prints = [fingerprint_of(p) for p in (target, draft, alien, padded, no_bos)]
    assert prints[0] == prints[1]  # other weights, same vocabulary
    assert len(set(prints)) == 4
    assert all(len(p) == 32 and set(p) <= set("0123456789abcdef") for p in prints)


def test_fingerprints_are_cached_per_model_file(tiny_pair, tmp_path, monkeypatch):
    import shutil

    cache = tmp_path / "fingerprints.json"
    model = tmp_path / "m.gguf"
    shutil.copy(tiny_pair[0], model)
    first = fingerprint_of(model, cache=cache)
    assert fp_module.cached_fingerprint(model, cache) == first

    calls = []
    monkeypatch.setattr(fp_module, "compute", lambda m: calls.append(m) or "f" * 32)
    assert fingerprint_of(model, cache=cache) == first and calls == []
    # A hit is a stat of the model file and one read of the small cache file: the model is
    # neither loaded nor hashed again.
    reads: list[Path] = []
    read = fp_module._read
    monkeypatch.setattr(fp_module, "_read", lambda path: reads.append(path) or read(path))
    for _ in range(3):
        assert fp_module.cached_fingerprint(model, cache) == first
    assert reads == [cache] * 3 and calls == []
    shutil.copy(tiny_pair[2], model)  # another model at the same path: computed again
    assert fp_module.cached_fingerprint(model, cache) is None
    assert fingerprint_of(model, cache=cache) == "f" * 32 and len(calls) == 1


def test_fingerprint_needs_no_model_file(tiny_pair):
    class Vocab:
        n_vocab = 3

        def vocab_info(self):
            from localspec.backend.vocab import VocabInfo

            return VocabInfo(1, 3, 0, 1, True, False)

        def token_bytes(self, token: int, *, special: bool = False) -> bytes:
            return [b"a", b"b", b"ab"][token]

    assert fp_module.vocabulary_fingerprint(Vocab()) == fp_module.compute(Vocab())
