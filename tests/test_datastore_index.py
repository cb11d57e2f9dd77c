"""The datastore's token index: lookups, continuations, the saved layout and damaged stores."""

from __future__ import annotations

import json
import mmap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from localspec.storage import datastore
from localspec.storage.datastore import DamagedIndex, Match, TokenIndex

CORPUS = [
    [10, 11, 12, 13, 14, 15],
    [20, 11, 12, 13, 99, 7],
    [5, 6, 7, 8],
]


def _is_mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def _lookups(index: TokenIndex) -> list:
    out = []
    for context in ([1, 11, 12, 13], [11, 12], [6, 7], [3, 4], [14, 15], [8]):
        match = index.longest_match(context, n_max=8, n_min=1)
        out.append((match, match and index.continuations(match, k=4)))
    return out


def test_round_trip_keeps_lookups_and_maps_the_arrays(tmp_path):
    index = TokenIndex.build(CORPUS)
    index.save(tmp_path / "store")
    loaded = TokenIndex.load(tmp_path / "store")

    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        "manifest.json",
        "suffixes.npy",
        "tokens.npy",
    ]
    assert len(loaded) == len(index) == 16
    assert loaded.documents == index.documents == 3
    assert _lookups(loaded) == _lookups(index)
    assert _lookups(index)[0] == (Match(3, 10, 12, 2), [((14, 15), 1), ((99, 7), 1)])
    assert _is_mapped(loaded._tokens) and _is_mapped(loaded._ends)
    assert not _is_mapped(index._tokens)
    assert TokenIndex.load(tmp_path / "store", verify=True).documents == 3

    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["format_version"] == datastore.FORMAT_VERSION
    assert (manifest["tokens"], manifest["documents"]) == (16, 3)


def test_save_replaces_an_index_already_there(tmp_path):
    TokenIndex.build(CORPUS).save(tmp_path)
    TokenIndex.build([[1, 2, 3]]).save(tmp_path)
    loaded = TokenIndex.load(tmp_path)
    assert (len(loaded), loaded.documents) == (3, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "suffixes.npy",
        "tokens.npy",
    ]


def test_longest_match_prefers_the_longest_suffix_and_falls_back():
    index = TokenIndex.build([[1, 2, 3, 4, 5], [9, 3, 4, 6]])
    # [2, 3, 4] occurs once, [3, 4] twice.
    assert index.longest_match([7, 1, 2, 3, 4]) == Match(4, *_rows(index, [1, 2, 3, 4]), 1)
    assert index.longest_match([8, 2, 3, 4]).n == 3
    fallback = index.longest_match([8, 8, 3, 4])
    assert (fallback.n, fallback.count) == (2, 2)
    assert index.longest_match([8, 8, 8, 4], n_min=2) is None
    assert index.longest_match([8, 8, 8, 4], n_min=1).n == 1
    assert index.longest_match([7, 7]) is None
    assert index.longest_match([1, 2, 3, 4], n_max=2).n == 2
    assert index.longest_match([4]) is None  # shorter than n_min
    assert index.longest_match([]) is None
    # An id that is no token ends the suffix there.
    assert index.longest_match([-1, 3, 4]).n == 2
    assert index.longest_match([2**40, 3, 4]).n == 2
    with pytest.raises(ValueError):
        index.longest_match([3, 4], n_max=1, n_min=2)


def _rows(index: TokenIndex, tokens: list[int]) -> tuple[int, int]:
    match = index.longest_match(tokens, n_max=len(tokens), n_min=len(tokens))
    return match.lo, match.hi


def test_matches_never_cross_a_document_boundary():
    index = TokenIndex.build([[1, 2, 3], [4, 5, 6]])
    # [3, 4] and [2, 3, 4] occur only across the join of the two documents.
    assert index.longest_match([3, 4]) is None
    assert index.longest_match([2, 3, 4]) is None
    assert index.longest_match([2, 3, 4], n_min=1).n == 1
    assert index.longest_match([1, 2, 3, 4, 5, 6]).n == 3
    assert index.longest_match([9, 2, 3]).n == 2


def test_continuations_counted_and_ordered():
    index = TokenIndex.build([[1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 1, 2, 3, 4], [1, 2, 5, 9]])
    match = index.longest_match([7, 1, 2])
    assert (match.n, match.count) == (2, 4)
    assert index.continuations(match, k=2) == [((3, 4), 3), ((5, 9), 1)]
    assert index.continuations(match, k=1) == [((3,), 3), ((5,), 1)]


def test_continuations_stop_at_the_end_of_a_document():
    index = TokenIndex.build([[1, 2, 3], [1, 2, 4, 5, 6], [1, 2], [8, 8]])
    match = index.longest_match([1, 2])
    assert match.count == 3
    # The occurrence that ends its document adds nothing; the others stop at their ends.
    assert index.continuations(match, k=5) == [((4, 5, 6), 1), ((3,), 1)]


def test_continuation_ties_are_longer_first_then_by_ids():
    index = TokenIndex.build([[1, 2, 9], [1, 2, 7, 7], [1, 2, 8]])
    match = index.longest_match([1, 2])
    assert index.continuations(match, k=3) == [((7, 7), 1), ((8,), 1), ((9,), 1)]


def test_continuations_examine_at_most_limit_occurrences_spread_over_the_range():
    # Ten occurrences of [1, 2], each followed by its own preceding token.
    index = TokenIndex.build([[p, 1, 2, p] for p in range(10, 20)])
    match = index.longest_match([1, 2])
    assert match.count == 10
    assert sum(c for _, c in index.continuations(match, k=1)) == 10
    few = index.continuations(match, k=1, limit=3)
    assert sum(c for _, c in few) == 3
    # Rows are ordered by the token before the match: spread rows reach both ends.
    assert {run for run, _ in few} == {(10,), (14,), (19,)}
    with pytest.raises(ValueError):
        index.continuations(match, k=0)


def _brute_force(corpus, context, n_max, n_min, k):
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        suffix = list(context[len(context) - n :])
        runs = []
        for doc in corpus:
            for i in range(len(doc) - n + 1):
                if list(doc[i : i + n]) == suffix:
                    runs.append(tuple(doc[i + n : i + n + k]))
        if runs:
            return n, len(runs), Counter(run for run in runs if run)
    return None


@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_brute_force_on_random_corpora(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))
    corpus = [
        rng.integers(0, vocab, size=int(rng.integers(0, 60))).tolist()
        for _ in range(int(rng.integers(1, 8)))
    ]
    index = TokenIndex.build(corpus)
    assert len(index) == sum(map(len, corpus))
    for _ in range(40):
        if corpus[0] and rng.random() < 0.5:
            end = int(rng.integers(1, len(corpus[0]) + 1))
            context = corpus[0][max(0, end - 12) : end]
        else:
            context = rng.integers(0, vocab + 1, size=int(rng.integers(0, 12))).tolist()
        n_min = int(rng.integers(1, 4))
        n_max = int(rng.integers(n_min, 10))
        k = int(rng.integers(1, 6))
        expected = _brute_force(corpus, context, n_max, n_min, k)
        match = index.longest_match(np.array(context, dtype=np.int64), n_max, n_min)
        if expected is None:
            assert match is None
            continue
        n, count, runs = expected
        assert (match.n, match.count) == (n, count)
        got = index.continuations(match, k=k, limit=1000)
        assert Counter(dict(got)) == runs
        assert [c for _, c in got] == sorted((c for _, c in got), reverse=True)


def test_empty_corpus_and_empty_documents(tmp_path):
    for corpus in ([], [[]], [[], [], []]):
        index = TokenIndex.build(corpus)
        assert len(index) == 0 and index.documents == len(corpus)
        assert index.longest_match([1, 2], n_min=1) is None
        index.save(tmp_path / str(len(corpus)))
        loaded = TokenIndex.load(tmp_path / str(len(corpus)), verify=True)
        assert len(loaded) == 0 and loaded.longest_match([1, 2], n_min=1) is None
    index = TokenIndex.build([[], [4, 5], [], [5, 6], []])
    assert index.documents == 5 and len(index) == 4
    assert index.longest_match([4, 5, 6]).n == 2
    assert index.continuations(index.longest_match([4, 5], n_min=1), k=3) == []


def test_documents_read_back_in_order_from_a_saved_index(tmp_path):
    corpus = [[3, 4], [], [5, 6, 7], [8]]
    TokenIndex.build(corpus).save(tmp_path / "s")
    loaded = TokenIndex.load(tmp_path / "s")
    assert [d.tolist() for d in loaded.iter_documents()] == corpus
    assert loaded.stream.tolist() == [-1, 3, 4, -1, -1, 5, 6, 7, -1, 8, -1]
    assert not loaded.stream.flags.writeable


def test_build_rejects_ids_out_of_range():
    with pytest.raises(ValueError):
        TokenIndex.build([[1, -1, 2]])
    with pytest.raises(ValueError):
        TokenIndex.build([[2**31]])


@pytest.fixture
def saved(tmp_path) -> Path:
    rng = np.random.default_rng(7)
    corpus = [rng.integers(0, 50, size=300).tolist() for _ in range(4)]
    TokenIndex.build(corpus).save(tmp_path / "store")
    return tmp_path / "store"


def _edit_manifest(directory: Path, **fields) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))


def _expect_damaged(directory: Path, verify: bool = False) -> str:
    with pytest.raises(DamagedIndex) as info:
        TokenIndex.load(directory, verify=verify)
    return str(info.value)


@pytest.mark.parametrize("name", ["tokens.npy", "suffixes.npy", "manifest.json"])
def test_missing_file_is_damaged(saved, name):
    (saved / name).unlink()
    assert name in _expect_damaged(saved)


def test_missing_directory_is_damaged(tmp_path):
    _expect_damaged(tmp_path / "nothing here")


@pytest.mark.parametrize("name", ["tokens.npy", "suffixes.npy"])
def test_truncated_array_is_damaged(saved, name):
    data = (saved / name).read_bytes()
    (saved / name).write_bytes(data[: len(data) - 9])
    assert "bytes" in _expect_damaged(saved)


def test_other_format_version_is_damaged(saved):
    _edit_manifest(saved, format_version=datastore.FORMAT_VERSION + 1)
    assert "format version" in _expect_damaged(saved)


@pytest.mark.parametrize("field,value", [("tokens", 1199), ("documents", 5), ("tokens", "x")])
def test_manifest_naming_other_lengths_is_damaged(saved, field, value):
    _edit_manifest(saved, **{field: value})
    _expect_damaged(saved)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format_version": 1}', "\xff"])
def test_unreadable_manifest_is_damaged(saved, text):
    (saved / "manifest.json").write_text(text, encoding="latin-1")
    _expect_damaged(saved)


@pytest.mark.parametrize("name", ["tokens.npy", "suffixes.npy"])
@pytest.mark.parametrize("where", [0.0, 0.5, 0.999])
def test_flipped_bytes_fail_the_checksum(saved, name, where):
    data = bytearray((saved / name).read_bytes())
    data[int(where * (len(data) - 1))] ^= 0x5A
    (saved / name).write_bytes(bytes(data))
    _expect_damaged(saved)


def test_verify_reads_the_middle_of_a_large_array(saved, monkeypatch):
    # Pretend the arrays are large: the sampled checksum covers only their ends.
    index = TokenIndex.load(saved)
    monkeypatch.setattr(datastore, "_SAMPLE_BYTES", 256)
    index.save(saved.parent / "again")
    again = saved.parent / "again"
    data = bytearray((again / "tokens.npy").read_bytes())
    data[len(data) // 2] ^= 0x01
    (again / "tokens.npy").write_bytes(bytes(data))
    TokenIndex.load(again)
    assert "checksum" in _expect_damaged(again, verify=True)


def test_random_damage_never_raises_another_exception(saved, tmp_path):
    rng = np.random.default_rng(3)
    good = {p.name: p.read_bytes() for p in saved.iterdir()}
    reference = _lookups(TokenIndex.load(saved))
    for _ in range(60):
        for name, data in good.items():
            (saved / name).write_bytes(data)
        name = sorted(good)[int(rng.integers(len(good)))]
        data = bytearray(good[name])
        if rng.random() < 0.5:
            data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
        else:
            del data[int(rng.integers(len(data))) :]
        (saved / name).write_bytes(bytes(data))
        try:
            loaded = TokenIndex.load(saved)
        except DamagedIndex:
            continue
        assert _lookups(loaded) == reference
